"""The HTTP service's plumbing: connections, streams, events, metrics, the response store, systemd."""
