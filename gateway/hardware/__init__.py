"""The machine: its GPUs (through the worker's probe) and its memory."""
