"""``gguf-gateway``'s command line: ``parser()`` builds it, ``main()`` runs it.

One module per command group, each with ``add_commands(sub)``, which adds its subcommands and
names the function that runs each (``set_defaults(run=...)``):

- ``serve``: ``serve``;
- ``config``: ``check-config``, ``schema``;
- ``console``: ``status``, ``chat`` (a running gateway's, through ``client.Gateway``);
- ``models``: ``models``;
- ``pull``: ``pull``, ``rm``;
- ``keys``: ``keys add / list / revoke``, ``usage``;
- ``devices``: ``devices``;
- ``launch``: ``launch`` (a coding agent run against the gateway; ``agents`` holds its pure
  decisions: the model it picks, each agent's settings).

``configfile`` holds what they share: the ``--config`` flag and the load that prints the
configuration's problems. The modules import one another by name (``from .configfile import
...``), never this package, which imports them all. A module imports what only its commands need
inside the functions that run them, so building the parser loads neither aiohttp's application
nor llama.cpp.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from . import config, console, devices, keys, launch, models, pull, serve

GROUPS = (serve, config, console, models, pull, keys, devices, launch)  # the order ``--help`` lists them in


def parser() -> argparse.ArgumentParser:
    """The top-level parser, with every subcommand (the command reference is read from it)."""
    top = argparse.ArgumentParser(prog="gguf-gateway", description="Serve local GGUF models behind one URL.")
    top.add_argument("--version", action="version", version=f"gguf-gateway {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_commands(sub)
    return top


PASSES_ON = ("launch",)  # commands that hand what follows ``--`` to another program, whole


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names; for a command of ``PASSES_ON``, what follows the first
    ``--`` is not parsed here but handed on as ``args.passed_on`` (argparse would read the
    options there as its own)."""
    words = list(sys.argv[1:] if argv is None else argv)
    passed_on: list[str] = []
    if words[:1] and words[0] in PASSES_ON and "--" in words:
        cut = words.index("--")
        words, passed_on = words[:cut], words[cut + 1:]
    args = parser().parse_args(words)
    args.passed_on = passed_on
    return args.run(args)
