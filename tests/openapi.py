"""Validate bodies and stream chunks against OpenAI's own OpenAPI document.

The document is OpenAPI 3.1 but still carries 3.0's ``nullable: true`` in many places
(the stream chunk's ``finish_reason`` among them); it is read as "or null" here.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

# The schemas the tests use, trimmed from OpenAI's document (specs/SOURCE names it; specs/
# trim_openapi.py makes the file again). Nothing outside the repository is read.
SPEC = Path(__file__).resolve().parent / "specs" / "openai-openapi.trimmed.json"


def _nullable_to_null(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _nullable_to_null(v) for k, v in node.items()}
        if node.pop("nullable", False) is True:
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_nullable_to_null(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def _spec() -> dict[str, Any]:
    return _nullable_to_null(json.loads(SPEC.read_text()))


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    spec = _spec()
    schema = copy.deepcopy(spec["components"]["schemas"][name])
    schema["components"] = spec["components"]  # so "#/components/schemas/..." refs resolve
    return jsonschema.Draft202012Validator(schema)


def validate(instance: Any, schema_name: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` fits ``components.schemas[schema_name]``."""
    _validator(schema_name).validate(instance)


@functools.lru_cache(maxsize=1)
def _completion_chunk_validator() -> jsonschema.Draft202012Validator:
    # OpenAI streams /v1/completions as CreateCompletionResponse objects, but a chunk before
    # the last carries "finish_reason": null, which that (whole-response) schema does not
    # allow. Only that one property is widened here; the rest is the document's schema.
    spec = _spec()
    schema = copy.deepcopy(spec["components"]["schemas"]["CreateCompletionResponse"])
    choice = schema["properties"]["choices"]["items"]
    choice["properties"]["finish_reason"] = {"anyOf": [choice["properties"]["finish_reason"], {"type": "null"}]}
    schema["components"] = spec["components"]
    return jsonschema.Draft202012Validator(schema)


def validate_completion_chunk(instance: Any) -> None:
    _completion_chunk_validator().validate(instance)


@functools.lru_cache(maxsize=1)
def _event_schemas() -> dict[str, str]:
    """Each Responses stream event's type -> the name of its own schema in the document."""
    spec = _spec()["components"]["schemas"]
    out = {}
    for ref in spec["ResponseStreamEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[1]
        for kind in spec[name].get("properties", {}).get("type", {}).get("enum", []):
            out[kind] = name
    return out


def validate_event(instance: Any) -> None:
    """A Responses stream event against the schema of its own ``type`` (a failure names the field,
    where the union's would only say that no member fits)."""
    validate(instance, _event_schemas()[instance["type"]])
