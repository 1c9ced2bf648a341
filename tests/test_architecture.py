"""Rules the package's structure keeps: no import cycle, and imports pointing down the layers
that gateway/ARCHITECTURE.md draws, counting imports inside functions too."""

import ast
import re
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


def layers(text: str) -> list[tuple[str, list[str]]]:
    """The "## Layers" table of ARCHITECTURE.md, top row first: each layer's name and the paths
    (relative to gateway/, a folder ending in "/") its second column lists in backticks."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The row a module (dotted, under ``gateway``) belongs to: the longest path that holds it."""
    rel = module.split(".", 1)[1].replace(".", "/") if "." in module else "__init__"
    best, best_len = None, -1
    for rank, (_, paths) in enumerate(table):
        for path in paths:
            hit = rel + "/" == path or rel.startswith(path) if path.endswith("/") else rel + ".py" == path
            if hit and len(path) > best_len:
                best, best_len = rank, len(path)
    return best


def wrong_way(graph: dict[str, set[str]], table: list[tuple[str, list[str]]]) -> list[str]:
    """Imports that point up the table or sideways into another layer of the same row."""
    out = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = layer_of(importer, table), layer_of(target, table)
            if a is not None and b is not None and a > b:
                out.append(f"{importer} ({table[a][0]}) imports {target} ({table[b][0]})")
    return out


def test_the_layer_check_finds_an_import_that_points_up():
    table = [("top", ["front.py", "handlers/"]), ("middle", ["things/"]), ("bottom", ["floor.py"])]
    assert layer_of("gateway.handlers.one", table) == 0 and layer_of("gateway.things.two", table) == 1
    assert wrong_way({"gateway.handlers.one": {"gateway.things.two", "gateway.floor"}}, table) == []
    assert wrong_way({"gateway.floor": {"gateway.front"}}, table) == ["gateway.floor (bottom) imports gateway.front (top)"]
    assert layer_of("gateway.elsewhere", table) is None


def test_imports_point_down_the_layers_that_architecture_md_draws():
    known = modules()
    table = layers((PACKAGE / "ARCHITECTURE.md").read_text())
    assert len(table) >= 5, table
    unplaced = sorted(m for m in known if m != "gateway" and layer_of(m, table) is None)
    assert not unplaced, f"modules in no layer of ARCHITECTURE.md: {unplaced}"
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert not wrong_way(graph, table), "\n".join(wrong_way(graph, table))


def reached(graph: dict[str, set[str]], start: set[str]) -> dict[str, str]:
    """Every module the imports of ``start`` lead to, each with the module that imports it."""
    via: dict[str, str] = {}
    todo = sorted(start)
    while todo:
        here = todo.pop()
        for there in sorted(graph.get(here, ())):
            if there not in via and there not in start:
                via[there] = here
                todo.append(there)
    return via


def in_worker(module: str) -> bool:
    return module == "gateway.worker" or module.startswith("gateway.worker.")


def outside_imports_of_the_worker(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the worker's package by a module outside it."""
    return [f"{a} imports {b}" for a, targets in sorted(graph.items()) if not in_worker(a)
            for b in sorted(targets) if in_worker(b)]


def loads_llama(path: Path) -> bool:
    """Whether a module imports llama_cpp itself (at its top or inside a function)."""
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        if any(n == "llama_cpp" or n.startswith("llama_cpp.") for n in names):
            return True
    return False


def test_the_walks_find_the_worker_and_what_reaches_it():
    graph = {"gateway.models.a": {"gateway.protocol.b"}, "gateway.protocol.b": {"gateway.worker.c"},
             "gateway.worker.c": {"gateway.worker.d"}, "gateway.worker.d": set()}
    assert reached(graph, {"gateway.models.a"}) == {"gateway.protocol.b": "gateway.models.a",
                                                    "gateway.worker.c": "gateway.protocol.b",
                                                    "gateway.worker.d": "gateway.worker.c"}
    assert outside_imports_of_the_worker(graph) == ["gateway.protocol.b imports gateway.worker.c"]
    assert not in_worker("gateway.workers") and in_worker("gateway.worker")
    assert loads_llama(PACKAGE / "worker" / "model.py") and not loads_llama(PACKAGE / "protocol" / "events.py")


def test_no_module_outside_the_worker_imports_it():
    """The worker's modules run in the worker process only: the gateway reaches a worker through
    ``protocol/`` (what both sides share) and ``backends/workerclient.py`` (its side of the pipes)."""
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert any(in_worker(m) for m in graph) and graph["gateway.backends.workerclient"]
    assert outside_imports_of_the_worker(graph) == []


def test_models_import_nothing_that_loads_llama_cpp():
    """What a model is (models.yaml, the catalog, memory estimates) is known without llama.cpp:
    no import from ``models/``, followed to its end, reaches the worker or a module that imports
    llama_cpp."""
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    start = {m for m in known if m.startswith("gateway.models.")}
    assert len(start) > 5
    via = reached(graph, start)
    bad = [f"{m} (through {via[m]})" for m in sorted(via) if in_worker(m) or loads_llama(known[m])]
    bad += [m for m in sorted(start) if loads_llama(known[m])]
    assert bad == []


def test_the_worker_process_imports_only_the_worker_and_what_lies_below():
    """Every import the worker's modules lead to (inside functions too), and every gateway module
    the worker process has loaded once it is ready to read its pipe, lies in ``worker/`` or a layer
    below it in ARCHITECTURE.md's table."""
    import subprocess
    import sys

    known = modules()
    table = layers((PACKAGE / "ARCHITECTURE.md").read_text())
    floor = [name for name, _ in table].index("worker")
    graph = {name: imports(name, path, known) for name, path in known.items()}
    static = set(reached(graph, {m for m in known if in_worker(m)}))
    assert "gateway.protocol.events" in static and "gateway.text.chat_template" in static
    code = ("import sys, gateway.worker.worker, gateway.worker.device_probe\n"
            "print(' '.join(m for m in sys.modules if m.startswith('gateway.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "gateway.worker.model" in loaded and "gateway.protocol.commands" in loaded
    rank = {m: layer_of(m, table) for m in (static | loaded) - {"gateway"}}  # (the package's version)
    above = sorted(m for m, r in rank.items() if r is None or r < floor)
    assert above == []


def stale_paths(text: str, root: Path) -> list[str]:
    """The files and folders (``name.py``, ``folder/``, in backticks) a text names that are not
    there: ``tests/...``, ``scripts/...`` and ``deploy/...`` from the repository's root, anything
    else anywhere under the package (``openai.py`` may be ``api/openai.py``)."""
    package = root / "gateway"
    under = {p.relative_to(package).as_posix() + ("/" if p.is_dir() else "") for p in package.rglob("*")
             if "__pycache__" not in p.parts}
    out = []
    for name in sorted(set(re.findall(r"`([A-Za-z0-9_./-]+(?:\.py|/))`", text))):
        if name.startswith((".", "llama.cpp/")):  # another tree's (a cache, llama.cpp's sources)
            continue
        name = name.removeprefix("gateway/") or "./"
        if name.startswith(("tests/", "scripts/", "deploy/", "../", "./")):
            found = name.startswith("../") or (root / name).exists()
        else:
            found = any(p == name or p.endswith("/" + name) for p in under)
        if not found:
            out.append(name)
    return out


def test_architecture_md_and_the_docstrings_name_only_paths_that_exist():
    """ARCHITECTURE.md, README.md, the pages in docs/ and every docstring (paths from the
    repository's root, as in the README)."""
    root = PACKAGE.parent
    assert stale_paths("`gone.py`, `api/`, `gateway/api/body.py` and `tests/nothing.py`", root) == [
        "gone.py", "tests/nothing.py"]
    texts = [PACKAGE / "ARCHITECTURE.md", root / "README.md", *sorted((root / "docs").glob("*.md")), *PACKAGE.rglob("*.py")]
    stale = {str(p.relative_to(root)): found for p in texts if (found := stale_paths(p.read_text(), root))}
    assert stale == {}


MAX_MODULE_LINES, MAX_CLASS_LINES = 500, 250  # past these a module or a class holds more than one job


def test_no_module_or_class_outgrows_one_job():
    big = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            big.append(f"{path.relative_to(PACKAGE)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                big.append(f"{path.relative_to(PACKAGE)}: class {node.name}: {n} lines")
    assert not big, big


def test_the_http_process_does_not_load_llama_cpp():
    """llama.cpp lives in the workers: the gateway process parses every request, structured
    output included, without loading it."""
    import subprocess
    import sys

    code = ("import sys, gateway.app, gateway.cli\n"
            "from gateway.wire import openai\n"
            "p = openai.parse_chat({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}],\n"
            "    'response_format': {'type': 'json_schema', 'json_schema': {'schema': {'type': 'object'}}}})\n"
            "assert p.request.response_format == 'json_schema'\n"
            "print('llama_cpp' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
