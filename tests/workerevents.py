"""How a request ended in its worker, seen where the gateway reads the workers' events: for
tests that need it after the request's client has gone (a cancelled answer's token count, the
order answers ended), when no handler reads that request's events any more."""

from __future__ import annotations

from gateway.engine import ipc


def record_done(monkeypatch) -> list[ipc.Done]:
    """Every done event that any worker of this process sends from now on (until the test ends),
    in the order the gateway reads them."""
    seen: list[ipc.Done] = []
    decode = ipc.decode_event

    def decode_and_record(data: bytes | bytearray) -> ipc.Event:
        event = decode(data)
        if isinstance(event, ipc.Done):
            seen.append(event)
        return event

    monkeypatch.setattr(ipc, "decode_event", decode_and_record)
    return seen
