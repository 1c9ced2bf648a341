"""The model worker: one child process per loaded model, which owns llama.cpp.

``worker.py`` is the process's main loop, and the work lives in the modules it lists
(``model``, ``vocab``, ``prompts``, ``sampling``, ``slots``, ``decoding``, ...). Only the worker
process imports this package, and only this package imports llama_cpp (``device_probe`` is a
process of its own too). What the worker shares with the gateway is ``protocol/`` (the commands
and events, the load settings); the gateway's side of the pipes is ``backends/workerclient.py``.
"""
