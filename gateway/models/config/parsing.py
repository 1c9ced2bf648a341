"""One reading of models.yaml: where its problems and warnings are collected (``Parsing``, the
``checks.Report`` the sections' checks tell)."""

from __future__ import annotations

from pathlib import Path


class Parsing:
    """Every problem as ``FILE: YAML.PATH: message``, collected before any is raised; relative
    paths are relative to the file's folder."""

    def __init__(self, file: Path):
        self.file = file
        self.base = file.resolve().parent
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def error(self, where: str, message: str) -> None:
        self.problems.append(f"{self.file}: {where}: {message}")

    def warn(self, where: str, message: str) -> None:
        """What does not stop ``serve`` (a model file not there: that model fails when asked for)."""
        self.warnings.append(f"{self.file}: {where}: {message}")
