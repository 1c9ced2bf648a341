"""Wire shapes: request validation and response builders, no aiohttp here.

One module per wire, each parsing requests into a ``GenerationRequest`` and rendering answers
in its shape: ``openai``, ``anthropic`` (Claude Code as it is), ``responses/`` (Codex as it
is), ``ollama``; and what they share: ``params`` (sampling fields, stops, the model name),
``answer`` (a backend's events as thinking, content and calls, for every wire), ``tools``
(tools and tool history in each shape), ``fim`` (fill in the middle: llama-server's
``/infill``, Mistral's FIM, ``suffix``; ``extra_budget`` and ``trim_extra`` cut ``input_extra``
to what the model can keep before the worker tokenizes it), ``props`` (llama-server's
``/props``: a model not loaded answers from its spec and header, and no GET loads one),
``media`` and ``mediasize/`` (pictures and sounds sized from their headers and bounded), and
``readback`` (a captured answer's bytes read back into its parts).
"""
