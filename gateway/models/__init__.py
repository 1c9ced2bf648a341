"""What a model is: models.yaml, names to specs, the GGUF header, memory estimates, the
lifecycle and placement policies."""
