"""The engine: one worker process per loaded model, which owns llama.cpp.

``worker.py`` runs in the child, ``client.py`` is the parent's async side, and
``protocol.py`` defines the messages between them.
"""
