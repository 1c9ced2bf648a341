"""The commands about models.yaml itself: ``check-config`` (the file, the event loop it asks
for, and each model file's header as serving reads it) and ``schema`` (its JSON Schema)."""

from __future__ import annotations

import argparse
import sys

from ..models.config import ConfigError
from ..models.discovery import INFO_CACHE
from ..models.ggufmeta import ModelFileError
from .configfile import config_arg, read_config
from .serve import event_loop


def add_commands(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser("check-config", help="validate models.yaml and the model files it names")
    config_arg(check)
    check.set_defaults(run=cmd_check_config)
    schema = sub.add_parser("schema", help="print models.yaml's JSON Schema (docs/models.yaml.schema.json)")
    schema.set_defaults(run=cmd_schema)


def cmd_schema(args: argparse.Namespace) -> int:
    from ..models.config.reference import schema_text

    sys.stdout.write(schema_text())
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    config = read_config(args)
    if config is None:
        return 1
    problems = list(config.warnings)  # missing model files
    try:
        event_loop(config.server.event_loop)
    except ConfigError as e:
        problems += [f"{config.path}: {line}" for line in e.problems]
    for spec in config.models:
        for member in spec.members:
            if member.path is None or not member.path.is_file():
                continue
            try:
                INFO_CACHE.get(member.path)  # the header as serving reads it: any refusal is a reason
            except ModelFileError as e:
                problems.append(f"{config.path}: models.{spec.name}: {e}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        return 1
    where = config.path or "built-in defaults (no config file)"
    print(f"ok: {where}: {len(config.models)} model(s) configured")
    return 0
