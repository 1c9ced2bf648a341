"""Models by name from the hubs: Hugging Face and Ollama registries, pulled into the stores
discovery reads, so a pulled model needs no lookup path of its own.

``names.parse`` reads a name into its candidates (``HFName``, ``OllamaName``; a two-part name
may be either, tried in order; the parser is the guard, since names become paths and URLs);
``choose`` picks a repository's files as llama-server's ``-hf`` does; ``huggingface.plan`` and
``ollama.plan`` read the listing or manifest (bounded, through ``strictjson``) into a
``plan.Plan`` (each file's URL, partial and final path, size, digest, lock; and ``finish``,
which makes the model visible), and ``plan.execute`` claims the free space (``space.SPACE``:
every pull's claim on a disk counted together), fetches what is missing under each file's lock
(``transfer.fetch``: only with a declared size and digest, resumed with ``Range``, hashed as
written, checked, renamed) and finishes. ``transfer`` also holds the redirect rule; ``stop.Stop``
is a pull's cancel and deadlines; ``errors`` the ``PullError``s (``ApiError``s). ``pulls.Pulls``
(the registry's ``pulls``) runs one pull per name on a thread, shared by every caller: served by
``api/pulls.py``, driven by ``gguf-gateway pull``, and asked by ``Registry.lookup`` for a name no
store has where ``server.pull_on_demand`` allows. ``removal`` deletes only what pulls wrote.
"""
