"""What a reader found (``Sniffed``), and what the readers share."""

from __future__ import annotations

from dataclasses import dataclass

IMAGE, AUDIO = "image", "audio"
WORK = 20_000  # steps a reader may take (segments, chunks, candidate frame headers): hostile layouts end there


@dataclass(frozen=True)
class Sniffed:
    """What a file decodes as: a picture's width and height, a sound's frames at its own sample
    rate; ``problem`` says why its size could not be read (it is then not to be decoded)."""

    kind: str  # IMAGE | AUDIO
    format: str
    width: int = 0
    height: int = 0
    frames: int = 0
    rate: int = 0
    problem: str | None = None

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def seconds(self) -> float:
        return self.frames / self.rate if self.rate else 0.0


class Unsized(Exception):
    """A layout the readers do not follow (its message says which)."""
