#!/usr/bin/env python3
"""Write the test models: scripted GGUFs (exact answers) and a random-weight benchmark model.

    scripts/gen_models.py OUT_DIR                 # the scripted set
    scripts/gen_models.py OUT_DIR --random        # also random-81m.gguf (qwen2's 152k vocabulary)

The generator itself is ``gateway.models.testmodels`` (the gateway uses it for its demo model);
this file is its command line, importable as ``write_all`` too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.models import testmodels as tm  # noqa: E402


def write_all(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "plain": tm.plain(out / "plain.gguf").path,
        "think": tm.thinking(out / "think.gguf").path,
        "think-split": tm.thinking(out / "think-split.gguf", split_markers=True).path,
        "utf8": tm.utf8_split(out / "utf8.gguf").path,
        "endless": tm.endless(out / "endless.gguf").path,
        "demo": tm.demo(out / "demo.gguf").path,
    }
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="directory to write into")
    p.add_argument("--random", action="store_true", help="also write the random-weight benchmark model")
    p.add_argument("--vocab", default="qwen2", help="llama.cpp vocab for --random (default qwen2, 152k)")
    args = p.parse_args(argv)
    for name, path in write_all(args.out).items():
        print(f"{name}: {path}")
    if args.random:
        path = tm.write_random_model(args.out / f"random-{args.vocab}.gguf", tm.find_vocab(args.vocab))
        print(f"random: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
