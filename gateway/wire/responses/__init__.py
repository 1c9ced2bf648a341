"""OpenAI's Responses API shapes (``/v1/responses``): a request's ``input`` items,
``instructions`` and options into a ``GenerationRequest`` (``request.py``), the tools as Codex
sends them (``tools.py``), reasoning sealed into ``encrypted_content`` and back (``sealed.py``),
the answer as output items and stream events (``output.py``: ``ResponseBuilder``, one path
for streamed and whole answers), and a conversation compacted into a ``compaction`` item and
read back (``compaction.py``).

Its users import the names below from here.
"""

from .output import ResponseBuilder, new_id
from .request import ResponsesParsed, approvals, conversation, input_messages, parse
from .sealed import SEAL_VERSION, seal, unseal
from .tools import ToolOrigin, ToolSet, custom_input, flat_name, read_tools

__all__ = ["SEAL_VERSION", "ResponseBuilder", "ResponsesParsed", "ToolOrigin", "ToolSet", "approvals", "conversation",
           "custom_input", "flat_name", "input_messages", "new_id", "parse", "read_tools", "seal", "unseal"]
