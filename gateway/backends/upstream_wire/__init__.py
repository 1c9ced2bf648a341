"""The OpenAI wire spoken as a client to an upstream server, one namespace (``wire.X``) for its
users (`upstream.py`, `upstream_table.py`, the tests). Pure: no I/O, so every cut of a stream and
every malformed chunk is testable without a server. Each job is its own module:

- `bodies.py`: a ``GenerationRequest`` as the body of ``/chat/completions`` or
  ``/completions``;
- `stream.py`: the upstream's server-sent events back as backend events (``SSEDecoder``,
  ``ChunkReader``), a whole answer where a stream was asked for, and the bounds on what is read;
- `fill.py`: fill in the middle, llama-server's ``/infill`` (its body and its answer);
- `whole.py`: the answers that come whole (embeddings, the model list);
- `failures.py`: its failures as ``ApiError``s (a malformed answer, an in-band error, a
  refusal, ``Retry-After``).

An upstream is another party: nothing it sends is trusted to be small. Every answer has a byte
bound (an event, a stream, a whole answer, an embeddings answer by its inputs, a model list), and
the model ids it lists are taken only when they can be names (``untrusted.name_problem``), at
most ``MAX_LISTED`` of them. Text it chose that goes into a message (an error's) is shown escaped
(``untrusted.shown``).
"""

from __future__ import annotations

from .bodies import SAMPLING_FIELDS, request_body
from .failures import (
    MAX_ERROR_BYTES,
    MAX_RETRY_AFTER,
    MalformedStream,
    error_from,
    in_band_error,
    retry_after,
    too_large,
)
from .fill import FIM_FALLBACK, FIM_FORWARDED, InfillReader, infill_body, infill_url
from .stream import (
    CHUNK_BYTES,
    MAX_ANSWER_BYTES,
    MAX_ANSWER_CHUNKS,
    MAX_EVENT_BYTES,
    MAX_STREAM_BYTES,
    READ_BYTES,
    Bounds,
    ChunkReader,
    SSEDecoder,
    answer_bounds,
    whole_as_chunk,
)
from .whole import (
    EMBEDDING_BYTES,
    MAX_LIST_BYTES,
    MAX_LISTED,
    Listing,
    embeddings_answer,
    embeddings_bound,
    listing,
)

__all__ = [
    "CHUNK_BYTES", "EMBEDDING_BYTES", "FIM_FALLBACK", "FIM_FORWARDED", "MAX_ANSWER_BYTES", "MAX_ANSWER_CHUNKS",
    "MAX_ERROR_BYTES", "MAX_EVENT_BYTES", "MAX_LISTED", "MAX_LIST_BYTES", "MAX_RETRY_AFTER", "MAX_STREAM_BYTES",
    "READ_BYTES", "SAMPLING_FIELDS", "Bounds", "ChunkReader", "InfillReader", "Listing", "MalformedStream",
    "SSEDecoder", "answer_bounds", "embeddings_answer", "embeddings_bound", "error_from", "in_band_error",
    "infill_body", "infill_url", "listing", "request_body", "retry_after", "too_large", "whole_as_chunk",
]
