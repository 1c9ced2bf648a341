"""The loaded models: the registry, one supervisor per model, the placer and the launcher."""
