"""Who may ask for what, and what they spent: keys, scopes, limits, usage."""
