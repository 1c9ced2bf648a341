"""Pure text handling shared by the server and the worker processes."""
