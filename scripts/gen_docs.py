#!/usr/bin/env python3
"""Write models.yaml's generated documentation from the gateway's declarations:

    scripts/gen_docs.py            # docs/configuration.md and docs/models.yaml.schema.json
    scripts/gen_docs.py --check    # exit 1 where either file is not what it would write

The builder is ``gateway.models.config.reference``; this file is its command line, importable
as ``outputs`` (each file's path and its text). Writing twice changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.models.config import reference  # noqa: E402

COMMAND = "python scripts/gen_docs.py"


def outputs() -> dict[Path, str]:
    return {ROOT / "docs" / "configuration.md": reference.reference(),
            ROOT / "docs" / "models.yaml.schema.json": reference.schema_text()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the files are up to date")
    args = parser.parse_args(argv)
    stale = [path for path, text in outputs().items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs()[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
