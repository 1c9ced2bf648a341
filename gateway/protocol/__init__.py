"""What the gateway and its model workers share: the protocol between the two processes,
imported by both and loading nothing of llama.cpp.

- ``request``: the gateway's own request (``GenerationRequest``, its ``Media``), a prompt read
  without generating (``PromptRequest``), the kinds of request a model serves;
- ``commands``: parent -> worker (``Load`` with its ``LoadParams``, ``Generate``, ``Cancel``, ...);
- ``events``: worker -> parent (``Start``, ``Text``, ``Done``, ``Error``, ...);
- ``framing``: the frames both carry on the pipes;
- ``typedjson``: a frame's JSON read back into the dataclasses it was written from;
- ``settings``: llama.cpp's load settings, each declared once (``LlamaSettings``);
- ``topology``: the machine's CPUs and llama.cpp's device records;
- ``bounds``: the LoRA adapters' bounds and the room of a fill-in-the-middle prompt.

The messages' names are this package's own (``protocol.GenerationRequest``,
``protocol.Done``): who uses one need not know which module declares it. The other modules are
imported by their paths (``protocol.settings``).
"""

from .commands import (
    Adapt,
    ApplyTemplate,
    Cancel,
    Command,
    Detokenize,
    Embed,
    Exit,
    Generate,
    Load,
    LoadParams,
    Threads,
    Tokenize,
    TrimCache,
    decode_command,
    encode_command,
)
from .events import (
    TERMINAL,
    Adapted,
    CacheHeld,
    CallDelta,
    Detokenized,
    Done,
    Embeddings,
    Error,
    Event,
    LoadFailed,
    LoadProgress,
    Prompt,
    Ready,
    Start,
    TEvent,
    Text,
    Thinking,
    Tokens,
    decode_event,
    encode_event,
    text_frame,
)
from .request import CHAT, COMPLETIONS, EMBEDDINGS, RERANK, TOKENIZE, GenerationRequest, Media, PromptRequest

__all__ = [
    "CHAT", "COMPLETIONS", "EMBEDDINGS", "RERANK", "TOKENIZE", "GenerationRequest", "Media", "PromptRequest",
    "Adapt", "ApplyTemplate", "Cancel", "Command", "Detokenize", "Embed", "Exit", "Generate", "Load", "LoadParams",
    "Threads", "Tokenize", "TrimCache", "decode_command", "encode_command",
    "TERMINAL", "Adapted", "CacheHeld", "CallDelta", "Detokenized", "Done", "Embeddings", "Error", "Event",
    "LoadFailed", "LoadProgress", "Prompt", "Ready", "Start", "TEvent", "Text", "Thinking", "Tokens",
    "decode_event", "encode_event", "text_frame",
]
