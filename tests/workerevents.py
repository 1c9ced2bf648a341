"""How a request ended in its worker, seen where the gateway reads the workers' events: for
tests that need it after the request's client has gone (a cancelled answer's token count, the
order answers ended), when no handler reads that request's events any more."""

from __future__ import annotations

from gateway.engine import protocol


def record_done(monkeypatch) -> list[protocol.Done]:
    """Every done event that any worker of this process sends from now on (until the test ends),
    in the order the gateway reads them."""
    seen: list[protocol.Done] = []
    decode = protocol.decode_event

    def decode_and_record(data: bytes | bytearray) -> protocol.Event:
        event = decode(data)
        if isinstance(event, protocol.Done):
            seen.append(event)
        return event

    monkeypatch.setattr(protocol, "decode_event", decode_and_record)
    return seen
