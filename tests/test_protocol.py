"""The worker pipe's framing and typed events: JSON frames and the JSON-free text frame, cut anywhere."""

import asyncio
import struct

import pytest

from gateway.engine import ipc
from gateway.engine.client import _Frames

TEXTS = ["Hello", "", "naïve 日本語 🙂", '{"not": json}', "\x00\n\"\\", "x" * 70000]


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_frame_reads_back_as_the_json_text_event(text):
    event = ipc.Text(2**40 + 7, text, 123)
    frame = ipc.text_frame(event.id, text, event.tokens)
    assert ipc.decode_event(frame[4:]) == event
    assert ipc.decode_event(ipc.encode_event(event)[4:]) == event
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4


def test_every_event_kind_reads_back_as_itself():
    events = [ipc.Ready({"n_ctx": 8}), ipc.LoadFailed("bad file"), ipc.LoadProgress(0.43),
              ipc.Start(1, 3, 0, 2, "é", None), ipc.Start(2, 3, 1, 0, "", "echo"),
              ipc.Text(1, "p", 7, [{"token": "p", "logprob": -0.5}]), ipc.Thinking(1, "hm", 2),
              ipc.CallDelta(1, 0, "call_1", "f", '{"a"'), ipc.CallDelta(1, 0, None, None, ": 1}"),
              ipc.Done(1, "stop", "\n", 3, 7, 0), ipc.Error(4, 400, "no", "prompt", "bad"),
              ipc.Tokens(5, [1, 2], ["a", "b"]), ipc.Tokens(6, [1], None),
              ipc.Detokenized(7, "ab"), ipc.Prompt(8, "<s>hi"), ipc.Embeddings(9, [[0.5, -1.0]], 2),
              ipc.CacheHeld(3 * 2**30), ipc.CacheHeld(0, 10),
              ipc.Adapted(11, [{"id": 0, "name": "a", "path": "/x/a.gguf", "scale": 0.5}])]
    assert {type(e) for e in events} == set(ipc._KINDS.values())
    for event in events:
        assert ipc.decode_event(ipc.encode_event(event)[4:]) == event


def test_every_command_reads_back_as_itself():
    commands = [ipc.Load(ipc.LoadParams("m", "/m.gguf", n_ctx=64, flash_attn=None)),
                ipc.Load(ipc.LoadParams("m", "/m.gguf", rpc=("10.0.0.2:50052", "box:50053"))),
                ipc.Generate(1, ipc.GenerationRequest(messages=[{"role": "user", "content": "é"}],
                                                                stop=["\n"], json_schema={"type": "object"})),
                ipc.Generate(2, ipc.GenerationRequest(prompt_tokens=[1, 2], deadline=1.5)),
                ipc.Generate(3, ipc.GenerationRequest(prompt="x", adapter="a", lora=[(0, 0.5), (2, 1.0)])),
                ipc.Cancel(3), ipc.Tokenize(4, ipc.PromptRequest(prompt="hi", param="content"), True),
                ipc.Detokenize(5, [1, 2]), ipc.ApplyTemplate(6, ipc.PromptRequest(messages=[])),
                ipc.Threads(2), ipc.Embed(7, ["a", [1, 2]]), ipc.TrimCache(8, 2**30),
                ipc.Adapt(9, "load", "a", "/x/a.gguf", 0.5), ipc.Adapt(10, "scales", scales=[(0, 1.0)]), ipc.Exit()]
    assert {type(c) for c in commands} == set(ipc._OPS.values())
    for command in commands:
        assert ipc.decode_command(ipc.encode_command(command)[4:]) == command


def test_a_command_is_written_as_asdict_would_write_it():
    """The encoder writes a dataclass field by field (no deep copy first): the same JSON text as
    ``asdict``'s, nested dataclasses (a request's media) and tuples included."""
    import json
    from dataclasses import asdict

    req = ipc.GenerationRequest(prompt="a <__media__> b", stop=["x"], tool_names=("f", "g"),
                                media=[ipc.Media("image", "messages[0]", "AAAA", size=(2, 3))])
    for command in (ipc.Generate(1, req), ipc.Load(ipc.LoadParams("m", "/m.gguf", rpc=("h:1",))),
                    ipc.Tokenize(2, ipc.PromptRequest(prompt="hi", media=req.media), True)):
        op, names = ipc._OP_FIELDS[type(command)]
        want = {"op": op}
        for name, nested in names:
            value = getattr(command, name)
            want[name] = asdict(value) if nested else value
        assert ipc.encode_command(command)[4:] == json.dumps(want, separators=(",", ":"), ensure_ascii=False).encode()


def test_a_prompt_request_takes_the_prompt_fields_of_a_generation_request():
    req = ipc.GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                     chat_template_kwargs={"enable_thinking": False})
    assert ipc.PromptRequest.of(req.to_dict()) == ipc.PromptRequest(
        messages=req.messages, chat_template_kwargs={"enable_thinking": False})


async def test_the_parent_splits_mixed_frames_however_the_pipe_cuts_them():
    events: list = [ipc.Start(1, 3, 0, 0, "é")]
    events += [ipc.Text(1, t, i + 1) for i, t in enumerate(TEXTS)]
    events += [ipc.Text(1, "p", 7, [{"token": "p", "logprob": -0.5}]), ipc.Done(1, "stop", None, 3, 8, 0)]
    stream = b"".join(ipc.text_frame(e.id, e.text, e.tokens)
                      if isinstance(e, ipc.Text) and not e.logprobs else ipc.encode_event(e) for e in events)
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
    back = ipc.decode_event(ipc.encode_event(ipc.Embeddings(4, vectors, 17))[4:])
    assert isinstance(back, ipc.Embeddings) and back.id == 4 and back.prompt_tokens == 17
    assert [len(v) for v in back.data] == [4, 0, 1000]
    assert back.data[0] == [struct.unpack("<f", struct.pack("<f", x))[0] for x in vectors[0]]
    assert back.data[2][0] == pytest.approx(1 / 3, rel=1e-7) and back.data[0][0] != 0.1
