"""The worker pipe's framing and typed events: JSON frames and the JSON-free text frame, cut anywhere."""

import asyncio

import pytest

from gateway.engine import protocol
from gateway.engine.client import _Frames

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
              protocol.Detokenized(7, "ab"), protocol.Prompt(8, "<s>hi"), protocol.Embeddings(9, [[0.5, -1.0]], 2)]
    assert {type(e) for e in events} == set(protocol._KINDS.values())
    for event in events:
        assert protocol.decode_event(protocol.encode_event(event)[4:]) == event


def test_every_command_reads_back_as_itself():
    commands = [protocol.Load(protocol.LoadParams("m", "/m.gguf", n_ctx=64, flash_attn=None)),
                protocol.Load(protocol.LoadParams("m", "/m.gguf", rpc=("10.0.0.2:50052", "box:50053"))),
                protocol.Generate(1, protocol.GenerationRequest(messages=[{"role": "user", "content": "é"}],
                                                                stop=["\n"], json_schema={"type": "object"})),
                protocol.Generate(2, protocol.GenerationRequest(prompt_tokens=[1, 2], deadline=1.5)),
                protocol.Cancel(3), protocol.Tokenize(4, protocol.PromptRequest(prompt="hi", param="content"), True),
                protocol.Detokenize(5, [1, 2]), protocol.ApplyTemplate(6, protocol.PromptRequest(messages=[])),
                protocol.Threads(2), protocol.Embed(7, ["a", [1, 2]]), protocol.Exit()]
    assert {type(c) for c in commands} == set(protocol._OPS.values())
    for command in commands:
        assert protocol.decode_command(protocol.encode_command(command)[4:]) == command


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
