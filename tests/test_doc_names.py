"""The names README.md, the pages in docs/ and gateway/ARCHITECTURE.md write in backticks
exist in the code: a doc that names what was renamed or removed fails here.

What counts as a name (a span in single backticks, outside fenced blocks; the generated
pages are made from the code and left out). Each kind is told by its shape alone:

- a command: ``gguf-gateway WORDS...``: each word a command or subcommand of the parser
  (``gateway.cli.parser``; ``a / b`` lists alternatives), each ``--flag`` one of its options;
- a route: ``METHOD /path``, or ``/path`` whose first segment the router serves (``/v1``, ``/api``,
  ``/models``, ...): a route of ``create_app``'s router (``{id}`` a variable part; a query and a
  trailing body left out; ``*`` any rest). ``/etc/...``, ``/exit`` and llama-server's
  ``/completion`` start with no served segment: not ours, not checked;
- a setting: ``server.KEY``, ``capture.KEY``, ``otel.KEY``, ``defaults.KEY``, ``timeouts.KEY``,
  ``loras.NAME.KEY`` (a trailing ``: value`` left out): declared in ``models/config/``;
- a path: a span with a ``/`` that ends in a file's extension or in ``/`` (``api/pulls.py``,
  ``wire/``), or one under ``gateway/``, ``tests/``, ``scripts/``, ``deploy/``, ``docs/``: a file
  or folder from the repository's root, or anywhere under the package (a name in capitals is a
  placeholder; one that starts with ``.``, ``~``, ``$`` or ``/`` is the user's; a bare
  ``name.py`` is ``test_architecture.py``'s);
- code: ``a.b.c`` (identifiers, ``(...)`` allowed at the end) whose head is a module of the
  package (its last dotted part: ``answer``, ``pipeline``) or a class defined in it
  (``Registry``), or ``dir/module.name`` (``api/pipeline.lease``): each part found by ``ast`` in
  the module (a definition, an assignment, an import, a submodule) or on the class (a method,
  a field, an attribute its methods set, or its bases'); ``gateway.`` may lead;
- in the code map (ARCHITECTURE.md) only, a bare ``CamelCase`` name or ``name()``: defined
  somewhere in the package.

Everything else is prose: a JSON field, a value, a model's or a flag of another program. A
dotted span that ends in a file's extension (``models.yaml``, ``usage.db``) is a file name; in
the pages a head in ``JSON_HEADS`` is a wire's JSON object before it is a module
(``usage.prompt_tokens``: a reply's field, not ``access/usage.py``'s), and one in
``CLIENT_MODULES`` a client library's; a media type (``text/plain``) is no path.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

from helpers import REPO

from gateway.models.config import keys, models, server
from gateway.text.sampling_params import SAMPLING

sys.path.insert(0, str(REPO / "scripts"))
import gen_docs  # noqa: E402

PACKAGE = REPO / "gateway"
MAP = PACKAGE / "ARCHITECTURE.md"
GENERATED = {p.name for p in gen_docs.outputs()}
# A wire's JSON objects whose names a module also has: in a page, ``usage.prompt_tokens`` is the
# reply's field, ``text.format`` and ``reasoning.effort`` a request's, ``output.weight`` a GGUF
# tensor's, ``upstream.state`` a row's. The code map writes no JSON: there they are modules.
JSON_HEADS = frozenset({"usage", "text", "reasoning", "output", "upstream"})
FILE_ENDINGS = frozenset({"yaml", "yml", "json", "toml", "md", "db", "gguf", "py", "js", "css", "html", "key",
                          "conf", "service", "example", "txt", "sh"})
# The client libraries' modules, named in the client examples (``openai.chat.completions.create``).
CLIENT_MODULES = frozenset({"openai", "anthropic"})
# A media type (``text/plain``) has a path's shape, under a folder of the package's name.
MEDIA_TYPE = r"(text|application|multipart|image|audio|video)/[\w.+*-]+"
IDENT = r"[A-Za-z_]\w*"


def pages() -> list[Path]:
    return [REPO / "README.md", *(p for p in sorted((REPO / "docs").glob("*.md")) if p.name not in GENERATED), MAP]


def spans(text: str) -> list[str]:
    """The single-backtick spans outside fenced blocks."""
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)


# -- the package, read by ast ---------------------------------------------------------------

class Index:
    """The package's modules and classes, and the names each defines."""

    def __init__(self, root: Path):
        self.modules: dict[str, set[str]] = {}  # dotted name -> the names it defines or imports
        self.classes: dict[str, list[tuple[set[str], list[str]]]] = {}  # name -> [(members, bases)]
        self.defined: set[str] = set()  # every name defined anywhere, at any depth
        for path in root.rglob("*.py"):
            dotted = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text())
            self.modules[dotted] = self._names(tree.body)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.defined.add(node.name)
                if isinstance(node, ast.ClassDef):
                    members = self._names(node.body)
                    for sub in ast.walk(node):
                        if isinstance(sub, (ast.Attribute)) and isinstance(sub.ctx, ast.Store) \
                                and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
                            members.add(sub.attr)
                    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    self.classes.setdefault(node.name, []).append((members, bases))
        for dotted in list(self.modules):  # a package's submodules are its names too
            if "." in dotted:
                parent, _, last = dotted.rpartition(".")
                self.modules.setdefault(parent, set()).add(last)
        self.short: dict[str, list[str]] = {}
        for dotted in self.modules:
            self.short.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)

    @staticmethod
    def _names(body: list[ast.stmt]) -> set[str]:
        out: set[str] = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                out.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                out |= Index._names(node.body) | Index._names(getattr(node, "orelse", []))
        return out

    def members(self, cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for members, bases in self.classes.get(cls, []):
            out |= members
            for base in bases:
                if base in self.classes and base not in seen:
                    out |= self.members(base, seen | {cls})
        return out

    def resolves(self, parts: list[str], module: str | None = None, cls: str | None = None) -> bool:
        """Whether ``parts`` name something, starting in a module or a class (or at the top)."""
        if not parts:
            return True
        head, rest = parts[0], parts[1:]
        if module is None and cls is None:
            starts = [(m, None) for m in self.short.get(head, [])] + [(None, head)] * (head in self.classes)
            return any(self.resolves(rest, m, c) for m, c in starts)
        if module is not None:
            if f"{module}.{head}" in self.modules:
                return self.resolves(rest, f"{module}.{head}")
            if head not in self.modules[module]:
                return False
        elif head not in self.members(cls or ""):
            return False
        # a class goes on; a function's or a value's own attributes are not followed
        return not rest or (head in self.classes and self.resolves(rest, cls=head))


@cache
def index() -> Index:
    return Index(PACKAGE)


@cache
def routes() -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in gen_docs.routes()]


@cache
def commands() -> dict[str, set[str]]:
    """Each command's words -> the words that may follow: its subcommands and its options."""
    out = {}
    for words, parser in gen_docs.commands():
        follows = {s for a in parser._actions for s in a.option_strings}
        follows |= {name for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)
                    for name in a.choices}
        out[words] = follows
    return out


@cache
def settings() -> dict[str, set[str]]:
    """Each qualified head -> the keys it takes."""
    return {"server": set(server.SERVER) | {f"capture.{k}" for k in server._CAPTURE}
            | {f"otel.{k}" for k in server._OTEL},
            "capture": set(server._CAPTURE), "otel": set(server._OTEL), "defaults": set(SAMPLING),
            "timeouts": {"connect", "first_byte", "idle"}, "loras": {"NAME.path", "NAME.scale"},
            "keys": set(keys.SETTINGS), "models": {f"NAME.{k}" for k in {*models.LOCAL, *models.UPSTREAM}}}


# -- the checks, one per kind ----------------------------------------------------------------

def command_problem(span: str) -> str | None:
    """Each word where a command is due (after a command that has subcommands, or after ``/``)
    must be one of them; each ``--flag`` an option of the command it follows."""
    words, table = span.split()[1:], commands()
    at, parent = "gguf-gateway", None
    for i, word in enumerate(words):
        if word == "/" or i and words[i - 1] == "/":
            if word != "/" and (parent is None or f"{parent} {word}" not in table):
                return f"{word}: no such command of {parent}"
            at = f"{parent} {word}" if word != "/" else at
        elif word.startswith("-"):
            if word.split("=")[0] not in table[at]:
                return f"{word}: no such option of {at}"
        elif any(w.startswith(at + " ") for w in table):
            if f"{at} {word}" not in table:
                return f"{word}: no such command of {at}"
            at, parent = f"{at} {word}", at
    return None


def route_problem(method: str | None, path: str) -> str | None:
    path = re.split(r"[?\s]", path, maxsplit=1)[0]
    glob = path.endswith("*")
    pattern = "^" + re.sub(r"\\\{[^}]*\\\}", r"[^/]+", re.escape(path.rstrip("*"))) + (".*" if glob else "$")
    for m, p in routes():
        if re.match(pattern, re.sub(r"\{[^}]*\}", "x", p)) and (method is None or m in (method, "*")):
            return None
    return f"{method + ' ' if method else ''}{path}: no such route"


def served_segment(path: str) -> bool:
    first = path.lstrip("/").split("/", 1)[0].split("?")[0]
    return bool(first) and any(p.lstrip("/").split("/", 1)[0] == first for _, p in routes())


def path_problem(span: str) -> str | None:
    """A file or folder: from the repository's root, or anywhere under the package
    (``api/pulls.py`` may be ``gateway/api/pulls.py``, ``toolformats/`` ``gateway/text/toolformats/``)."""
    if any(part.isupper() for part in re.split(r"[/.]", span)):  # a placeholder: ORG/REPO/FILE.gguf
        return None
    rel = span.removeprefix("gateway/")
    if (REPO / span).exists() or (PACKAGE / rel).exists():
        return None
    under = (p.relative_to(PACKAGE).as_posix() + ("/" if p.is_dir() else "") for p in PACKAGE.rglob("*"))
    return None if any(p.endswith("/" + rel) for p in under) else f"{span}: no such file or folder"


def module_problem(span: str, folders: str, parts: list[str]) -> str | None:
    """``dir/module.name``: the modules whose path ends with ``dir/module``; none is a problem only
    where ``dir`` is a folder of the package (``org/model``, ``timings/prompt_n`` are not code)."""
    tail = "." + ".".join([*folders.strip("/").split("/"), parts[0]])
    found = [m for m in index().modules if ("." + m).endswith(tail)]
    if not found:
        first = folders.split("/", 1)[0]
        return f"{span}: no such module" if any(f".{first}." in f".{m}." for m in index().modules) else None
    return None if any(index().resolves(parts[1:], m) for m in found) else f"{span}: not in {found[0]}"


def problem(span: str, in_map: bool) -> str | None:
    """Why a span names nothing that exists, or None (it exists, or it is prose)."""
    span = span.strip()
    if re.match(r"(\.venv/bin/)?gguf-gateway(\s|$)", span):
        return command_problem(span)
    if m := re.fullmatch(r"((?:GET|POST|PUT|PATCH|DELETE)(?:/(?:GET|POST|PUT|PATCH|DELETE))*) (/\S*)( .*)?", span):
        methods = m.group(1).split("/")
        return next((p for meth in methods if (p := route_problem(meth, m.group(2)))), None)
    if span.startswith("/") and served_segment(span) and " " not in span.split("?")[0]:
        if re.fullmatch(r"/[\w-]+", span) and not any(p == span for _, p in routes()):
            return None  # a base every route under it shares: /v1, /api
        return route_problem(None, span)
    if re.fullmatch(MEDIA_TYPE, span):
        return None
    if re.fullmatch(r"[\w.-]+(/[\w.*-]+)*/([\w-]+\.[\w.]+|)", span) and "/" in span and not span.startswith("."):
        last = span.rsplit("/", 1)[1]
        if not last or last.rsplit(".", 1)[1] in FILE_ENDINGS:
            return path_problem(span)
    if re.fullmatch(r"(gateway|tests|scripts|deploy|docs)/[\w/-]*", span):
        return path_problem(span)
    setting = span.split(":", 1)[0] if re.fullmatch(rf"{IDENT}(\.{IDENT})+(: .*)?", span) else None
    if setting and setting.rsplit(".", 1)[1] not in FILE_ENDINGS:
        head, _, key = setting.partition(".")
        if head in settings() and head not in index().short or head == "server":
            generic = re.sub(r"^[^.]+\.", "NAME.", key) if head in ("loras", "models") else key
            return None if generic in settings()[head] else f"{setting}: no such setting"
    if m := re.fullmatch(rf"((?:{IDENT}/)+)({IDENT}(?:\.{IDENT})*)(\(.*\))?", span):  # dir/module.name
        return module_problem(span, m.group(1), m.group(2).split("."))
    if m := re.fullmatch(rf"({IDENT}(?:\.{IDENT})+)(\(.*\))?", span):
        parts = m.group(1).split(".")
        if parts[0] == "gateway":
            return None if index().resolves(parts[1:], "gateway") else f"{span}: no such name"
        if parts[-1] in FILE_ENDINGS or parts[0] in CLIENT_MODULES or parts[0] in JSON_HEADS and not in_map:
            return None
        if parts[0] in index().short or parts[0] in index().classes:
            return None if index().resolves(parts) else f"{span}: no such name"
        return None
    if in_map and (re.fullmatch(r"[A-Z][a-z0-9]+[A-Z]\w*", span) or re.fullmatch(rf"{IDENT}\(.*\)", span)):
        name = span.split("(")[0]
        return None if name in index().defined or name in index().short else f"{span}: defined nowhere"
    return None


def stale_names(path: Path) -> list[str]:
    return [p for s in spans(path.read_text()) if (p := problem(s, path == MAP))]


# -- the tests ----------------------------------------------------------------------------------

def test_the_checker_finds_what_is_stale():
    ok = ["gguf-gateway keys add --role admin NAME", "gguf-gateway serve / check-config / keys / usage",
          "POST /config/reload", "/v1/messages", "GET /captures/{id}", "/api/*", "/models/load",
          "server.keep_billing_header: true", "capture.keep", "defaults.temperature", "loras.NAME.scale",
          "api/pipeline.prepared", "answer.prepare", "Registry.resolve", "gateway.cli.parser",
          "access.keys.owner_of", "Gate.admit", "usage.prompt_tokens", "models.yaml", "/etc/gguf-gateway",
          "/completion", "text.format", "gateway/wire/answer.py", "tests/specs/SOURCE", "llama_decode"]
    assert {s: problem(s, False) for s in ok if problem(s, False)} == {}
    stale = ["gguf-gateway keys rename", "gguf-gateway serve --colour", "gguf-gateway deploy",
             "POST /config/restart", "GET /config/reload", "/v1/message", "/models/pull/pause",
             "server.keep_billing_headers", "capture.keep_all", "defaults.temprature", "api/pipeline.leases",
             "api/pipelines.lease", "answer.prepared", "Registry.adapter", "gateway.cli.parsers",
             "access.keys.owners", "Gate.admits", "gateway/wire/answers.py", "docs/nothing.md"]
    assert [s for s in stale if problem(s, False) is None] == []
    # in the code map a JSON-shaped head is a module, and bare class and call names count
    assert problem("usage.UsageStore", True) is None and problem("usage.UsageStores", True)
    assert problem("RegistryOfThings", True) and problem("RegistryOfThings", False) is None
    assert problem("cross_site()", True) is None and problem("cross_sight()", True)


def test_every_name_in_the_docs_exists():
    assert len(pages()) > 5
    stale = {str(p.relative_to(REPO)): found for p in pages() if (found := stale_names(p))}
    assert stale == {}


def test_the_generated_references_cover_every_command_and_route():
    text = (REPO / "docs" / "commands.md").read_text()
    assert [w for w, _ in gen_docs.commands()[1:] if f"\n## {w}\n" not in text] == []
    assert {"gguf-gateway keys add", "gguf-gateway usage", "gguf-gateway schema", "gguf-gateway pull"} <= set(
        commands())
    text = (REPO / "docs" / "routes.md").read_text()
    assert [p for _, p in routes() if f"| `{p}` |" not in text] == []
    assert "| POST | `/config/reload` | admin |  | `admin.reload_route` |" in text
    assert "| POST | `/v1/messages` | any key | `messages` | `anthropic.messages` |" in text
