"""Rules the package's structure keeps: no import cycle, counting imports inside functions too."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gateway"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.update(t for t in [base, *(f"{base}.{a.name}" for a in node.names)] if t in known)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (cycle := visit(w)):
                return cycle
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (cycle := visit(v)):
            return cycle
    return None


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "gateway.app" in graph and graph["gateway.app"]  # the walk sees the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_http_process_does_not_load_llama_cpp():
    """llama.cpp lives in the workers: the gateway process parses every request, structured
    output included, without loading it."""
    import subprocess
    import sys

    code = ("import sys, gateway.app, gateway.cli\n"
            "from gateway.protocol import openai\n"
            "p = openai.parse_chat({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}],\n"
            "    'response_format': {'type': 'json_schema', 'json_schema': {'schema': {'type': 'object'}}}})\n"
            "assert p.request.response_format == 'json_schema'\n"
            "print('llama_cpp' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
