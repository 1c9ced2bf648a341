"""models.yaml as every command reads it: the ``--config`` flag and the load that prints the
configuration's problems (one ``error:`` line each on stderr) instead of raising them."""

from __future__ import annotations

import argparse
import sys

from ..models.config import Config, ConfigError, find_config_path, load_config


def config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="models.yaml (default: $GGUF_GATEWAY_CONFIG, else ~/.config/gguf-gateway/models.yaml)")


def read_config(args: argparse.Namespace, *, check_files: bool = True) -> Config | None:
    try:
        return load_config(find_config_path(args.config), check_files=check_files)
    except ConfigError as e:
        for line in e.problems:
            print(f"error: {line}", file=sys.stderr)
        return None


def config_if_any(args: argparse.Namespace) -> Config | None:
    """The configuration where one is named or found, for the commands that work without one
    (they talk to a running gateway, or pull into the default stores); None where there is none,
    or after printing its problems."""
    return read_config(args, check_files=False) if (args.config or find_config_path(None)) else None
