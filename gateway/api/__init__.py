"""HTTP handlers: thin layers that parse, call and render. Every route, who may call it and
what it spends: docs/routes.md (``scripts/gen_docs.py`` writes it from the router).

- the wires: ``openai`` (chat, completions, embeddings, reranking, tokenize, detokenize,
  apply-template, fill in the middle, llama-server's ``/props``), ``anthropic`` (Messages,
  ``count_tokens``), ``responses`` (OpenAI's Responses API and its stored responses:
  ``server/response_store``), ``compaction`` (its compact and input token count), ``ollama``
  (``/api/*``, streams as JSON lines);
- the operator's: ``admin`` (``/health``, ``/metrics``, ``/models``, load, unload,
  ``/config/reload``), ``pulls`` (pulling and deleting models by name), ``lora`` (a model's LoRA
  adapters), ``captures`` (captured requests, read back and replayed), ``usage`` (``/usage``),
  ``dashboard`` (the page in ``web/`` and its live stream);
- what they share: ``pipeline`` (the path of every generation, whole or streamed), ``common``
  (limits, the lease, the event stream and its capture's tap, dropped tools), ``body`` (the one
  reader of request bodies), ``media`` (a request's pictures and sounds made ready),
  ``access`` (the access middleware and the marks handlers carry), ``appkeys`` (the typed
  application state).
"""
