"""Reranking in the shape llama.cpp's server, Jina and Cohere share: ``query``, ``documents``
(strings, or objects with ``text``), ``top_n``, ``return_documents`` -> ``results`` of
``index`` and ``relevance_score``, best first."""

from __future__ import annotations

import uuid
from typing import Any

from ..base.errors import InvalidRequest
from .params import require_model, shown

MAX_DOCUMENTS = 1024


def parse(body: dict[str, Any]) -> tuple[str, str, list[str], int | None, bool]:
    """(model, query, documents, top_n, return_documents)."""
    model = require_model(body)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise InvalidRequest("`query` must be a non-empty string", "query")
    raw = body.get("documents")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("`documents` must be a non-empty array of strings", "documents")
    if len(raw) > MAX_DOCUMENTS:
        raise InvalidRequest(f"`documents` may hold at most {MAX_DOCUMENTS} documents, got {len(raw)}", "documents")
    documents = []
    for i, doc in enumerate(raw):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str) or not text:
            raise InvalidRequest(f"`documents[{i}]` must be a non-empty string (or an object with `text`)",
                                 f"documents[{i}]")
        documents.append(text)
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InvalidRequest(f"`top_n` must be a positive integer, got {shown(top_n)}", "top_n")
    returned = body.get("return_documents", False)
    if not isinstance(returned, bool):
        raise InvalidRequest("`return_documents` must be true or false", "return_documents")
    return model, query, documents, top_n, returned


def body(model: str, documents: list[str], scores: list[float], top_n: int | None, returned: bool,
         prompt_tokens: int) -> dict[str, Any]:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if returned:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "object": "list", "results": results,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
