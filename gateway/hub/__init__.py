"""Models by name from the hubs: Hugging Face and Ollama registries, pulled into the stores discovery reads."""
