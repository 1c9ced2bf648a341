"""Hostile JSON schemas against the real server process, on every wire that takes one (tools,
``response_format``, Ollama's ``format``, Responses' ``text.format``): each once crashed a
model's worker, froze it or made it take gigabytes. Now each is served or refused with a 400
naming the caller's own field, the worker lives on (the next request on the model answers),
and its peak memory stays small."""

from __future__ import annotations

import time

import pytest
from helpers import ServerProcess, request

from gateway.models import testmodels as tm
from gateway.text.grammar import MAX_REPEAT

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("schemas")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    config = d / "models.yaml"
    config.write_text("server:\n  discover_default_stores: false\n  max_body_bytes: 4000000\n"
                      f"models:\n  plain:\n    path: {d}/plain.gguf\n    n_ctx: 1024\n")
    with ServerProcess("--config", str(config)) as srv:
        yield srv
        code, log = srv.stop()
        assert code == 0
        assert "Traceback" not in log, log[-3000:]


def params(**props) -> dict:
    return {"type": "object", "properties": props}


def tools_body(path: str, schema: dict, **extra) -> dict:
    """A request on ``path`` with one tool whose parameters are ``schema``, in that wire's shape."""
    if path == "/v1/messages":
        return {"model": "plain", "messages": HI, "max_tokens": 4, "tools": [{"name": "f", "input_schema": schema}],
                **extra}
    if path == "/v1/responses":
        return {"model": "plain", "input": "hi", "max_output_tokens": 4,
                "tools": [{"type": "function", "name": "f", "parameters": schema}], **extra}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    if path == "/api/chat":
        return {"model": "plain", "messages": HI, "stream": False, "options": {"num_predict": 4}, "tools": [tool],
                **extra}
    return {"model": "plain", "messages": HI, "max_tokens": 4, "tools": [tool], **extra}


def format_body(path: str, schema: dict) -> dict:
    """A request on ``path`` whose structured-output field holds ``schema``."""
    if path == "/api/chat":
        return {"model": "plain", "messages": HI, "stream": False, "options": {"num_predict": 4}, "format": schema}
    if path == "/v1/responses":
        return {"model": "plain", "input": "hi", "max_output_tokens": 4,
                "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}
    return {"model": "plain", "messages": HI, "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}


TOOL_PATHS = ["/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/responses"]
FORMATS = {"/v1/chat/completions": "response_format", "/api/chat": "format", "/v1/responses": "text.format"}


def error_of(path: str, out: dict) -> tuple[str | None, str]:
    """(param, message) of an error in the wire's shape (Ollama's and Anthropic's name no param)."""
    if path == "/api/chat":
        return None, out["error"]
    return out["error"].get("param"), out["error"]["message"]


def worker(srv) -> int:
    """The model's worker process (``/models`` lists it, as the dashboard shows it)."""
    return next(m["pid"] for m in srv.get("/models")[1]["data"] if m["id"] == "plain")


def peak_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def answers(srv) -> None:
    """The model still answers a plain request, on the same worker."""
    status, out, _ = request(srv.url + "/v1/chat/completions", {"model": "plain", "messages": HI})
    assert status == 200 and out["choices"][0]["message"]["content"] == "Hello, world!", out


@pytest.fixture
def steady(server):
    """The model's worker, loaded and warm; after the test: the same worker, grown by little at its
    peak, and no worker lost."""
    answers(server)
    pid = worker(server)
    before = peak_kib(pid)
    yield pid
    answers(server)
    assert worker(server) == pid, "the worker was replaced: it died"
    assert server.get("/health")[1]["worker_failures"] == 0
    grown = (peak_kib(pid) - before) / 1024
    assert grown < 64, f"the worker's peak memory grew {grown:.0f} MiB"


@pytest.mark.parametrize("path", TOOL_PATHS)
def test_a_long_string_parameter_is_served_on_every_wire(server, steady, path):
    """maxLength 30000 once crashed the worker (SIGSEGV in llama.cpp's grammar parser): now a most
    past llama.cpp's repetition limit is written as no most."""
    for length in (30000, 900_000, 1e8, 2**31 - 1):  # 1e8 once peaked the worker at 2.3 GB before a 400
        status, out, _ = request(server.url + path, tools_body(path, params(text={"type": "string",
                                                                                  "maxLength": length})))
        assert status == 200, out
    if path == "/v1/chat/completions":  # constrained from the first token
        status, out, _ = request(server.url + path, tools_body(path, params(
            text={"type": "string", "minLength": MAX_REPEAT, "maxLength": 30000},
            list={"type": "array", "items": {"type": "string"}, "maxItems": 10**6}), tool_choice="required"))
        assert status == 200, out


def test_huge_integer_bounds_build_at_once(server, steady):
    """A bound of 10**22 once took 11 s and 164 MB to build; 1e30 never finished (10 GB)."""
    started = time.monotonic()
    for bounds in ({"minimum": 0, "maximum": 10**22}, {"maximum": 1e30}, {"minimum": -1e300, "maximum": 5},
                   {"minimum": -(10**19), "maximum": 10**20 - 1}):
        schema = params(n={"type": "integer", **bounds})
        for path in ("/v1/chat/completions", "/v1/responses", "/api/chat"):
            status, out, _ = request(server.url + path, format_body(path, schema))
            assert status == 200, (path, bounds, out)
        status, out, _ = request(server.url + "/v1/chat/completions", tools_body("/v1/chat/completions", schema,
                                                                                 tool_choice="required"))
        assert status == 200, (bounds, out)
    assert time.monotonic() - started < 60  # a hang guard: these once took minutes, or forever


ABSURD = [
    (params(x={"type": "string", "maxLength": -3}), "properties.x.maxLength", "non-negative integer"),
    (params(x={"type": "array", "items": {"type": "string"}, "minItems": 3e7}), "properties.x.minItems", "at most"),
    (params(x={"type": "integer", "minimum": 1e30}), "properties.x.minimum", "20 digits"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}},
     "$defs.a.$ref", "leads back to itself"),
]


@pytest.mark.parametrize("schema, where, words", ABSURD)
def test_absurd_numbers_and_left_recursion_are_a_400_before_the_worker_builds_anything(server, steady, schema,
                                                                                      where, words):
    """minItems 3e7 once answered 400 only after the worker peaked at 1.7 GB."""
    for path in TOOL_PATHS:
        status, out, _ = request(server.url + path, tools_body(path, schema))
        param, message = error_of(path, out)
        named = {"/v1/messages": f"tools.0.input_schema.{where}", "/v1/responses": f"tools[0].parameters.{where}"
                 }.get(path, f"tools[0].function.parameters.{where}")
        assert status == 400 and named in message and words in message, (path, out)
        assert param in (None, named)
    for path, field in FORMATS.items():
        status, out, _ = request(server.url + path, format_body(path, schema))
        param, message = error_of(path, out)
        named = {"response_format": "response_format.json_schema.schema", "text.format": "text.format.schema"
                 }.get(field, field) + "." + where
        assert status == 400 and named in message and words in message, (path, out)
        assert param in (None, named)


def test_a_recursive_schema_is_served(server, steady):
    """As Pydantic writes a recursive model (a top-level $ref beside its $defs): once a KeyError."""
    node = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
    schema = {"$defs": {"Node": node}, "$ref": "#/$defs/Node"}
    for path in FORMATS:
        status, out, _ = request(server.url + path, format_body(path, schema))
        assert status == 200, (path, out)
    status, out, _ = request(server.url + "/v1/messages", tools_body("/v1/messages", {"type": "object", "properties": {
        "tree": {"$ref": "#/$defs/Node"}}, "$defs": {"Node": node}}))
    assert status == 200, out


# A grammar llama.cpp refuses (an optional group holding more repeated rules than it allows), and
# one past the bound on what llama.cpp's parser unrolls (ten times more once took 2 GB and 8 s)
UNPARSED = params(code={"type": "string", "pattern": "^(a{0,1999}b{0,1999})?$"})
UNROLLED = params(**{f"s{i}": {"type": "string", "maxLength": MAX_REPEAT} for i in range(110)})


@pytest.mark.parametrize("schema, words", [(UNPARSED, "does not parse"), (UNROLLED, "in all")])
def test_a_grammar_the_worker_refuses_names_the_callers_field(server, steady, schema, words):
    for path in TOOL_PATHS:
        for choice in [{}] + ([{"tool_choice": "required"}] if path == "/v1/chat/completions" else []):
            status, out, _ = request(server.url + path, tools_body(path, schema, **choice))
            param, message = error_of(path, out)
            assert status == 400 and "`tools`" in message and words in message, (path, choice, out)
            assert param in (None, "tools")
    for path, field in FORMATS.items():
        status, out, _ = request(server.url + path, format_body(path, schema))
        param, message = error_of(path, out)
        assert status == 400 and f"`{field}`" in message and words in message, (path, out)
        assert param in (None, field), (path, out)
        assert field == "response_format" or "response_format" not in message, (path, out)


def test_an_unbounded_grammar_field_is_refused_before_llama_cpp_parses_it(server, steady):
    """A 17-byte grammar asking for at least 5 and at most 3 made llama.cpp allocate until it failed."""
    for grammar in ('root ::= "x"{5,3}', 'root ::= "x"{3000}',
                    "root ::= " + " | ".join(f"r{i}" for i in range(200)) + "\n"
                    + "".join(f'r{i} ::= "x"{{0,2000}}\n' for i in range(200))):
        status, out, _ = request(server.url + "/v1/chat/completions",
                                 {"model": "plain", "messages": HI, "grammar": grammar})
        assert status == 400 and out["error"]["param"] == "grammar", out
