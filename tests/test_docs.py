"""README.md and the pages in docs/: their links resolve, the README stays short, and the
client examples it marks "quick start" work against a fresh server."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250
QUICK_START = "<!-- quick start -->"


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fence = [], None
    for line in text.splitlines():
        if m := re.match(r"\s*(```+|~~~+)", line):
            if fence is None:
                fence = m.group(1)
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()):
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The targets of the Markdown links and images outside code."""
    out = []
    for line in prose(path.read_text()):
        line = re.sub(r"(`+)(.+?)\1", "", line)  # code spans are not links
        out += re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line)
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: another site's
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            bad.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor")
    return bad


def test_slugs_follow_githubs_rule():
    assert slug("Keys: roles, models, limits and usage") == "keys-roles-models-limits-and-usage"
    assert slug("Embeddings and reranking: `bench.py --embeddings`") == "embeddings-and-reranking-benchpy---embeddings"
    assert slug("Continue (VS Code / JetBrains extension)") == "continue-vs-code--jetbrains-extension"
    assert slug("A model on another machine (`upstream:`)") == "a-model-on-another-machine-upstream"


def test_the_link_checker_finds_what_is_broken(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Other page\n\n## A part: `this`\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-part-this) [self](#page) [site](https://example.com)\n"
                    "[gone](missing.md) [bad](other.md#nothing) `[code](nowhere.md)`\n\n"
                    "```\n[in a block](nowhere.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file in the repository",
                                  "other.md#nothing: no heading with that anchor"]


def test_every_link_between_the_readme_and_the_docs_resolves():
    assert len(PAGES) > 5, PAGES
    bad = {str(p.relative_to(ROOT)): found for p in PAGES if (found := broken_links(p))}
    assert bad == {}


def test_every_page_in_docs_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def quick_start_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block right after a ``<!-- quick start -->`` line."""
    lines = README.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != QUICK_START:
            continue
        m = re.match(r"```(\w+)$", lines[i + 1])
        assert m, f"README.md:{i + 2}: a quick-start marker must be followed by a fenced block"
        end = lines.index("```", i + 2)
        blocks.append((m.group(1), "\n".join(lines[i + 2:end]) + "\n"))
    return blocks


def test_the_quick_start_marks_the_clients_examples():
    blocks = quick_start_blocks()
    assert {lang for lang, _ in blocks} == {"sh", "python"}
    text = "".join(code for _, code in blocks)
    for needle in ("/v1/chat/completions", "from openai import OpenAI", "from anthropic import Anthropic", "/api/chat"):
        assert needle in text


def json_documents(text: str) -> list:
    """The JSON documents printed one after another (curl prints no newline after each)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while True:
        at += len(text[at:]) - len(text[at:].lstrip())
        if at == len(text):
            return out
        doc, at = decoder.raw_decode(text, at)
        out.append(doc)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the quick start's shell examples use curl")
def test_the_readmes_quick_start_runs_against_a_fresh_server(tmp_path):
    """Exactly the README's marked blocks, only the port changed, against `gguf-gateway serve`
    in a fresh home: the built-in demo model."""
    with ServerProcess() as server:
        for lang, code in quick_start_blocks():
            code = code.replace(":8080", f":{server.port}")
            command = ["bash", "-e", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                                  stdin=subprocess.DEVNULL)
            assert done.returncode == 0, (code, done.stdout, done.stderr, server.output()[-3000:])
            if lang == "sh":
                answers = json_documents(done.stdout)
                assert answers and all("error" not in a for a in answers), (code, done.stdout)
            else:
                assert done.stdout.strip(), (code, done.stderr)
    assert "Traceback" not in server.output()
