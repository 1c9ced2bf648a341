"""gguf-gateway: every GGUF model on a workstation behind one OpenAI- and Anthropic-shaped URL."""

__version__ = "0.1.0"
