"""Who may ask for what, and what they spent: keys, scopes, limits, usage.

``gate.Gate`` (the app's ``GATE``) holds the keys in force (``keys.KeyTable``, by digest),
each key's limits (``limits.Limiter``) and the usage store (``usage.UsageStore``), for the
access middleware (``api/access.py``). The keys are swapped whole by a reload: SIGHUP and
``POST /config/reload`` (``api/admin.reload_configuration``), and a change to the keys file,
which ``api/admin.watch_keys`` polls. ``scope`` is the context variable a request's key's
``models`` globs are set in. The keys' configuration (``server.api_keys``, the keys file, the
environment, the role rule, the file's writer for ``gguf-gateway keys``) is
``models/config/keys.py``.
"""
