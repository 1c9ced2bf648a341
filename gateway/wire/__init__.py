"""Wire shapes: request validation and the answers' writers, no aiohttp here.

Each wire parses its requests into a ``GenerationRequest`` (in ``params.Parsed``) and writes
its answers through one ``writer.Writer``, which owns both the whole and the streamed form:
``openai`` and ``openai_answer``, ``anthropic`` (Claude Code as it is) and
``anthropic_answer``, ``responses/`` (Codex as it is), ``ollama``, and ``fim`` (fill in the
middle: llama-server's ``/infill`` and its ``InfillWriter``, Mistral's FIM, ``suffix``).

What they share: ``writer`` (the interface every answer is written through, a hosted tool's
call and result included), ``context`` (what the wire may know of the request beside its body),
``prepare`` (the server's limits before the lease, and the one step that readies a request for
the model it got), ``params`` (sampling fields, stops, the model name), ``answer`` (a backend's
events read as thinking, content and calls, for every wire), ``tools`` (tools and tool history
in each shape), ``props`` (llama-server's ``/props``: a model not loaded answers from its spec
and header, and no GET loads one), ``media`` and ``mediasize/`` (pictures and sounds sized from
their headers and bounded), and ``readback`` (a captured answer's bytes read back into its
parts).
"""
