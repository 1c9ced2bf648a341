"""The worker pipe's framing: JSON frames and the JSON-free text frame, cut anywhere."""

import asyncio

import pytest

from gateway.engine import protocol
from gateway.engine.client import _Frames

TEXTS = ["Hello", "", "naïve 日本語 🙂", '{"not": json}', "\x00\n\"\\", "x" * 70000]


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_frame_reads_back_as_the_json_text_event(text):
    event = {"ev": "text", "id": 2**40 + 7, "text": text, "tokens": 123}
    frame = protocol.text_frame(event["id"], text, event["tokens"])
    assert protocol.decode(frame[4:]) == event
    assert protocol.decode(protocol.encode(event)[4:]) == event
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4


async def test_the_parent_splits_mixed_frames_however_the_pipe_cuts_them():
    events = [{"ev": "start", "id": 1, "prompt_tokens": 3, "cached_tokens": 0, "slot": 0, "prompt_tail": "é"}]
    events += [{"ev": "text", "id": 1, "text": t, "tokens": i + 1} for i, t in enumerate(TEXTS)]
    events += [{"ev": "text", "id": 1, "text": "p", "tokens": 7, "logprobs": [{"token": "p", "logprob": -0.5}]},
               {"ev": "done", "id": 1, "finish_reason": "stop"}]
    stream = b"".join(protocol.text_frame(e["id"], e["text"], e["tokens"])
                      if e["ev"] == "text" and "logprobs" not in e else protocol.encode(e) for e in events)
    for cut in (1, 3, 13, 4096, len(stream)):
        got = []
        frames = _Frames(got.append, asyncio.get_running_loop().create_future())
        for at in range(0, len(stream), cut):
            frames.data_received(stream[at:at + cut])
        assert got == events
