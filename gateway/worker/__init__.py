"""The engine: one worker process per loaded model, which owns llama.cpp.

``client.py`` is the parent's async side, ``ipc.py`` defines the commands and events
between them, and ``worker.py`` is the child's main loop, whose work lives in the modules it
lists (``model``, ``vocab``, ``prompts``, ``sampling``, ``slots``, ``decoding``, ...): only
the worker process imports those, and only they import llama_cpp.
"""
