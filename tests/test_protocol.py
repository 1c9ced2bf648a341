"""The worker pipe's framing and typed events: JSON frames and the JSON-free text frame, cut anywhere."""

import asyncio
import struct

import pytest

from gateway import protocol
from gateway.backends.workerclient import _Frames
from gateway.protocol.commands import _OP_FIELDS, _OPS
from gateway.protocol.events import _KINDS

TEXTS = ["Hello", "", "naïve 日本語 🙂", '{"not": json}', "\x00\n\"\\", "x" * 70000]


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_frame_reads_back_as_the_json_text_event(text):
    event = protocol.Text(2**40 + 7, text, 123)
    frame = protocol.text_frame(event.id, text, event.tokens)
    assert protocol.decode_event(frame[4:]) == event
    assert protocol.decode_event(protocol.encode_event(event)[4:]) == event
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4


def test_every_event_kind_reads_back_as_itself():
    events = [protocol.Ready({"n_ctx": 8}), protocol.LoadFailed("bad file"), protocol.LoadProgress(0.43),
              protocol.Start(1, 3, 0, 2, "é", None), protocol.Start(2, 3, 1, 0, "", "echo"),
              protocol.Text(1, "p", 7, [{"token": "p", "logprob": -0.5}]), protocol.Thinking(1, "hm", 2),
              protocol.CallDelta(1, 0, "call_1", "f", '{"a"'), protocol.CallDelta(1, 0, None, None, ": 1}"),
              protocol.Done(1, "stop", "\n", 3, 7, 0), protocol.Error(4, 400, "no", "prompt", "bad"),
              protocol.Tokens(5, [1, 2], ["a", "b"]), protocol.Tokens(6, [1], None),
              protocol.Detokenized(7, "ab"), protocol.Prompt(8, "<s>hi"), protocol.Embeddings(9, [[0.5, -1.0]], 2),
              protocol.CacheHeld(3 * 2**30), protocol.CacheHeld(0, 10),
              protocol.Adapted(11, [{"id": 0, "name": "a", "path": "/x/a.gguf", "scale": 0.5}])]
    assert {type(e) for e in events} == set(_KINDS.values())
    for event in events:
        assert protocol.decode_event(protocol.encode_event(event)[4:]) == event


def test_every_command_reads_back_as_itself():
    commands = [protocol.Load(protocol.LoadParams("m", "/m.gguf", n_ctx=64, flash_attn=None)),
                protocol.Load(protocol.LoadParams("m", "/m.gguf", rpc=("10.0.0.2:50052", "box:50053"))),
                protocol.Generate(1, protocol.GenerationRequest(messages=[{"role": "user", "content": "é"}],
                                                                stop=["\n"], json_schema={"type": "object"})),
                protocol.Generate(2, protocol.GenerationRequest(prompt_tokens=[1, 2], deadline=1.5)),
                protocol.Generate(3, protocol.GenerationRequest(prompt="x", adapter="a", lora=[(0, 0.5), (2, 1.0)])),
                protocol.Cancel(3), protocol.Tokenize(4, protocol.PromptRequest(prompt="hi", param="content"), True),
                protocol.Detokenize(5, [1, 2]), protocol.ApplyTemplate(6, protocol.PromptRequest(messages=[])),
                protocol.Threads(2), protocol.Embed(7, ["a", [1, 2]]), protocol.TrimCache(8, 2**30),
                protocol.Adapt(9, "load", "a", "/x/a.gguf", 0.5), protocol.Adapt(10, "scales", scales=[(0, 1.0)]), protocol.Exit()]
    assert {type(c) for c in commands} == set(_OPS.values())
    for command in commands:
        assert protocol.decode_command(protocol.encode_command(command)[4:]) == command


def test_a_command_is_written_as_asdict_would_write_it():
    """The encoder writes a dataclass field by field (no deep copy first): the same JSON text as
    ``asdict``'s, nested dataclasses (a request's media) and tuples included."""
    import json
    from dataclasses import asdict

    req = protocol.GenerationRequest(prompt="a <__media__> b", stop=["x"], tool_names=("f", "g"),
                                     media=[protocol.Media("image", "messages[0]", "AAAA", size=(2, 3))])
    for command in (protocol.Generate(1, req), protocol.Load(protocol.LoadParams("m", "/m.gguf", rpc=("h:1",))),
                    protocol.Tokenize(2, protocol.PromptRequest(prompt="hi", media=req.media), True)):
        op, names = _OP_FIELDS[type(command)]
        want = {"op": op}
        for name, nested in names:
            value = getattr(command, name)
            want[name] = asdict(value) if nested else value
        assert protocol.encode_command(command)[4:] == json.dumps(want, separators=(",", ":"), ensure_ascii=False).encode()


def test_a_prompt_request_takes_the_prompt_fields_of_a_generation_request():
    req = protocol.GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                     chat_template_kwargs={"enable_thinking": False})
    assert protocol.PromptRequest.of(req.to_dict()) == protocol.PromptRequest(
        messages=req.messages, chat_template_kwargs={"enable_thinking": False})


async def test_the_parent_splits_mixed_frames_however_the_pipe_cuts_them():
    events: list = [protocol.Start(1, 3, 0, 0, "é")]
    events += [protocol.Text(1, t, i + 1) for i, t in enumerate(TEXTS)]
    events += [protocol.Text(1, "p", 7, [{"token": "p", "logprob": -0.5}]), protocol.Done(1, "stop", None, 3, 8, 0)]
    stream = b"".join(protocol.text_frame(e.id, e.text, e.tokens)
                      if isinstance(e, protocol.Text) and not e.logprobs else protocol.encode_event(e) for e in events)
    for cut in (1, 3, 13, 4096, len(stream)):
        got = []
        frames = _Frames(got.append, asyncio.get_running_loop().create_future())
        for at in range(0, len(stream), cut):
            frames.data_received(stream[at:at + cut])
        assert got == events


def test_embeddings_travel_as_float32():
    """Vectors cross the pipe packed (float32, the model's precision): each number comes back
    as its float32 rounding, lengths and order kept, an empty list as one."""
    vectors = [[0.1, -2.5, 1e-8, 3.4e38], [], [1 / 3] * 1000]
    back = protocol.decode_event(protocol.encode_event(protocol.Embeddings(4, vectors, 17))[4:])
    assert isinstance(back, protocol.Embeddings) and back.id == 4 and back.prompt_tokens == 17
    assert [len(v) for v in back.data] == [4, 0, 1000]
    assert back.data[0] == [struct.unpack("<f", struct.pack("<f", x))[0] for x in vectors[0]]
    assert back.data[2][0] == pytest.approx(1 / 3, rel=1e-7) and back.data[0][0] != 0.1
