"""`gguf-gateway pull`'s progress as a person sees it: a bar redrawn in place on a terminal, a
plain line per step elsewhere, and a registry's text shown escaped."""

from __future__ import annotations

import io

from gateway.cli.pull import View

LINES = [
    {"status": "pulling manifest"},
    {"status": "pulling 0123456789ab", "digest": "sha256:0123456789ab" + "0" * 52, "total": 4_000_000,
     "completed": 1_000_000, "bytes_per_second": 2_000_000, "eta_seconds": 1.5},
    {"status": "pulling 0123456789ab", "digest": "sha256:0123456789ab" + "0" * 52, "total": 4_000_000,
     "completed": 4_000_000, "bytes_per_second": 2_000_000, "eta_seconds": None},
    {"status": "verifying sha256 digest"},
    {"status": "writing manifest"},
    {"status": "success"},
]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_file_is_one_bar_redrawn_in_place():
    out = Terminal()
    view = View(out, tty=True)
    assert [view.line(line) for line in LINES] == [None] * len(LINES)
    text = out.getvalue()
    assert text.startswith("pulling manifest\n")
    bar, rest = text.split("\n", 1)[1].split("\nverifying", 1)
    frames = bar.split("\r")[1:]
    assert len(frames) == 2 and " 25% " in frames[0] and "100% " in frames[1]
    assert "1.0 MB/4.0 MB  2.0 MB/s  1s" in frames[0] and frames[1].endswith("4.0 MB/4.0 MB  2.0 MB/s\x1b[K")
    assert rest == " sha256 digest\nwriting manifest\nsuccess\n"


def test_elsewhere_a_plain_line_per_step():
    out = io.StringIO()
    view = View(out, tty=False)
    for line in LINES:
        view.line(line)
    assert out.getvalue().splitlines() == ["pulling manifest", "pulling 0123456789ab (4.0 MB)",
                                           "verifying sha256 digest", "writing manifest", "success"]


def test_an_error_line_is_returned_and_a_servers_text_is_shown_escaped():
    out = io.StringIO()
    view = View(out, tty=False)
    assert view.line({"error": "bad \x1b[31m thing"}) == "bad \x1b[31m thing"
    view.line({"status": "pulling \x1b]0;owned\x07"})
    assert "\x1b" not in out.getvalue()
