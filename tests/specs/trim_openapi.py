"""Regenerate ``openai-openapi.trimmed.json`` from OpenAI's full OpenAPI document.

    python tests/specs/trim_openapi.py PATH/TO/openapi.json

Keeps ``components.schemas`` entries named in ROOTS and every schema they reference,
transitively, and nothing else; the tests validate against those. To validate against
another schema, add its name to ROOTS and run this again. The source document and its
licence are named in ``SOURCE`` beside this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOTS = [
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "ErrorResponse",
    "ListModelsResponse",
    "Response",
    "ResponseStreamEvent",
]
PREFIX = "#/components/schemas/"
OUT = Path(__file__).with_name("openai-openapi.trimmed.json")


def refs(node: Any) -> set[str]:
    """The schema names that ``node`` references anywhere inside it."""
    if isinstance(node, dict):
        found = {node["$ref"][len(PREFIX):]} if isinstance(node.get("$ref"), str) \
            and node["$ref"].startswith(PREFIX) else set()
        for value in node.values():
            found |= refs(value)
        return found
    if isinstance(node, list):
        return set().union(*map(refs, node)) if node else set()
    return set()


def trim(spec: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    keep: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo.extend(refs(schemas[name]) - keep)
    return {
        "openapi": spec["openapi"],
        "info": spec["info"],
        "components": {"schemas": {name: schemas[name] for name in sorted(keep)}},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    trimmed = trim(spec, ROOTS)
    OUT.write_text(json.dumps(trimmed, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(trimmed['components']['schemas'])} schemas", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
