"""HTTP handlers: thin layers that parse, call and render."""
