"""What every layer raises and checks: the API error types and the configuration value checks."""
