"""The worker's events on their way to the gateway: queued during a step of the batch, then
written together in one write.

An answer's text after its first may be held (``hold``): the main loop leaves it queued while
the next step would still write it within the model's ``stream_interval``, so a fast model's
tokens reach the gateway in twos or threes, each still its own event (``Worker.run`` decides,
as it knows how long a step takes). Every other event goes out at the end of its step.
"""

from __future__ import annotations

import os
import time

from .. import protocol
from . import pipes


class Outbox:
    def __init__(self, fd: int):
        self.fd = fd
        self.frames: list[bytes] = []  # queued, in order
        self.urgent = False  # an event that goes out at the end of this step is queued
        self.held_since = 0.0  # when the oldest held text event was queued
        self.holding = False  # a held text event is queued

    def send(self, event: protocol.Event, hold: bool = False) -> None:
        """Queue an event; ``flush`` writes the queued events in one write."""
        self.put(protocol.encode_event(event), hold)

    def put(self, frame: bytes, hold: bool = False) -> None:
        """``send`` for an event already framed."""
        if hold:
            if not self.holding:
                self.held_since, self.holding = time.monotonic(), True
        else:
            self.urgent = True
        self.frames.append(frame)

    def flush(self) -> None:
        if not self.frames:
            return
        data, self.frames, self.urgent, self.holding = b"".join(self.frames), [], False, False
        try:
            pipes.write_all_blocking(self.fd, data)
        except (BrokenPipeError, OSError):
            os._exit(0)  # the gateway is gone
