"""The worker's command pipe, read by its main loop itself (``worker.pipes``): frames put back
together however the pipe cuts them, the pipe's end, a length over the bound; the wakeup its
prep threads set; and a real worker process served through it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gateway import protocol
from gateway.models import testmodels as tm
from gateway.worker import pipes
from gateway.worker import worker as worker_

BOUND = 120.0  # seconds before a wait fails: far past anything a loaded machine takes

COMMANDS: list[protocol.Command] = [
    protocol.Generate(7, protocol.GenerationRequest(prompt="naïve ✓ " * 20, max_tokens=3)),
    protocol.Cancel(7),
    protocol.Tokenize(8, protocol.PromptRequest(prompt="hi"), with_pieces=True),
    protocol.Exit(),
]
STREAM = b"".join(protocol.encode_command(c) for c in COMMANDS)


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_the_command_pipe_is_read_without_blocking(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    assert not os.get_blocking(r)
    assert reader.read() == []  # an empty pipe: nothing, at once
    os.write(w, STREAM[:3])  # part of a header
    assert reader.read() == []


def test_frames_cut_at_every_byte_come_out_whole_and_in_order(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    for cut in range(1, len(STREAM)):
        os.write(w, STREAM[:cut])
        got = reader.read()
        os.write(w, STREAM[cut:])
        got += reader.read()
        assert got == COMMANDS, cut


def test_a_byte_at_a_time(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    got: list = []
    for i in range(len(STREAM)):
        os.write(w, STREAM[i:i + 1])
        got += reader.read()
    assert got == COMMANDS


def test_several_frames_in_one_write_are_read_at_once(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    os.write(w, STREAM)
    assert reader.read() == COMMANDS
    assert reader.read() == []


def test_a_frame_longer_than_a_pipe_buffer(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    big = protocol.Generate(1, protocol.GenerationRequest(prompt="x" * (3 * pipes.READ_BYTES)))
    frame = protocol.encode_command(big)
    got: list = []
    writer = threading.Thread(target=pipes.write_all_blocking, args=(w, frame))  # blocks while the pipe is full
    writer.start()
    waiter = select.poll()
    waiter.register(r, select.POLLIN)
    while not got:
        assert waiter.poll(BOUND * 1000), "the frame never came"
        got = reader.read()
    writer.join()
    assert got == [big]


def read_to_the_end(reader: pipes.CommandReader) -> list:
    """What ``reader`` reads up to the pipe's end, which a read may see only after the last frame's."""
    got: list = []
    for _ in range(3):
        got += reader.read()
        if reader.ended:
            return got
    raise AssertionError(f"the end was never read: {got}")


def test_the_pipes_end_after_whole_frames_is_none_after_them(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    os.write(w, STREAM)
    os.close(w)
    assert read_to_the_end(reader) == [*COMMANDS, None]
    assert reader.read() == [None]  # (and so on: the worker leaves at the first)


def test_the_pipes_end_in_the_middle_of_a_frame_drops_it(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    first = protocol.encode_command(COMMANDS[0])
    os.write(w, first + STREAM[len(first):len(first) + 6])  # a whole frame, then a header and part of a body
    assert reader.read() == [COMMANDS[0]]
    os.close(w)
    assert read_to_the_end(reader) == [None]


@pytest.mark.parametrize("cut", [0, 2])  # at a frame's start, in its header
def test_the_pipes_end_in_a_header(pipe, cut):
    r, w = pipe
    reader = pipes.CommandReader(r)
    os.write(w, protocol.encode_command(protocol.Cancel(1))[:cut])
    os.close(w)
    assert read_to_the_end(reader) == [None]


def test_a_frame_over_the_bound_is_refused_before_its_body(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r, max_bytes=64)
    ok = protocol.encode_command(protocol.Cancel(123))
    assert len(ok) - 4 <= 64
    os.write(w, ok)
    assert reader.read() == [protocol.Cancel(123)]
    os.write(w, (65).to_bytes(4, "big"))  # its header alone: refused without waiting for the rest
    with pytest.raises(pipes.FrameTooLarge, match="65 bytes"):
        reader.read()


def test_the_default_bound(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    os.write(w, (pipes.MAX_COMMAND_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(pipes.FrameTooLarge):
        reader.read()


def test_a_frame_that_is_no_command_fails_as_decode_command_does(pipe):
    r, w = pipe
    reader = pipes.CommandReader(r)
    body = b'{"op": "no such op"}'
    os.write(w, len(body).to_bytes(4, "big") + body)
    with pytest.raises(KeyError):
        protocol.decode_command(body)
    with pytest.raises(KeyError):
        reader.read()


@pytest.mark.parametrize("eventfd", [True, False])
def test_the_wakeup_wakes_one_wait_on_both(pipe, monkeypatch, eventfd):
    if not eventfd:
        monkeypatch.delattr(os, "eventfd", raising=False)  # a pipe, as on macOS
    elif not hasattr(os, "eventfd"):
        pytest.skip("no eventfd here")
    r, w = pipe
    wakeup = pipes.Wakeup()
    waiter = pipes.Waiter(pipes.CommandReader(r), wakeup)
    assert waiter.wait(block=False) == (False, False)
    for _ in range(100_000):  # never blocks: a full pipe or a large count is as set as one
        wakeup.set()
    assert waiter.wait(block=False) == (False, True)
    wakeup.clear()
    while waiter.wait(block=False)[1]:  # (a pipe's bytes may take more than one read)
        wakeup.clear()
    os.write(w, protocol.encode_command(protocol.Cancel(1)))
    assert waiter.wait(block=False) == (True, False)
    assert waiter.commands.read() == [protocol.Cancel(1)]
    # the loop's call: the commands there are, the wakeup cleared for the inbox to be read after
    os.write(w, protocol.encode_command(protocol.Cancel(2)))
    wakeup.set()
    assert waiter.take(block=False) == [protocol.Cancel(2)]
    assert waiter.wait(block=False) == (False, False)
    assert waiter.take(block=False) == []
    setter = threading.Thread(target=wakeup.set)
    setter.start()
    assert waiter.wait(block=True) == (False, True)  # returns only once the other thread has set it
    setter.join()
    os.close(w)
    assert waiter.wait(block=True)[0]  # the pipe's end wakes the wait too
    assert read_to_the_end(waiter.commands) == [None]


# --- a real worker process -----------------------------------------------------------------

class RawWorker:
    """``python -m gateway.worker.worker`` on two pipes, as ``spawning.spawn`` starts it, driven
    frame by frame."""

    def __init__(self, model: Path, stderr: Path):
        cmd_r, self.cmd_w = os.pipe()
        self.ev_r, ev_w = os.pipe()
        self.stderr = stderr
        with open(stderr, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "gateway.worker.worker", str(cmd_r), str(ev_w)],
                                         pass_fds=(cmd_r, ev_w), stdin=subprocess.DEVNULL, stderr=err)
        os.close(cmd_r)
        os.close(ev_w)
        self.buf = b""
        try:
            self.send(protocol.Load(protocol.LoadParams(name="loop", path=str(model), n_ctx=8192, parallel=2)))
            while not isinstance(event := self.event(), protocol.Ready):
                assert isinstance(event, protocol.LoadProgress), event
        except BaseException:
            self.close()
            raise

    def send(self, command: protocol.Command, by: int = 0) -> None:
        frame = protocol.encode_command(command)
        step = by or len(frame)
        for i in range(0, len(frame), step):
            pipes.write_all_blocking(self.cmd_w, frame[i:i + step])

    def event(self) -> protocol.Event:
        while True:
            if len(self.buf) >= 4:
                n = int.from_bytes(self.buf[:4], "big")
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return protocol.decode_event(body)
            ready, _, _ = select.select([self.ev_r], [], [], BOUND)
            assert ready, f"no event from the worker in {BOUND:.0f} s"
            chunk = os.read(self.ev_r, 1 << 16)
            assert chunk, "the worker closed its event pipe"
            self.buf += chunk

    def until(self, kind: type[protocol.TEvent], rid: int) -> protocol.TEvent:
        """The next ``kind`` event of request ``rid`` (those before it passed over)."""
        while True:
            event = self.event()
            if isinstance(event, kind) and getattr(event, "id", None) == rid:
                return event
            assert not (isinstance(event, protocol.Error) and event.id == rid), event

    def done(self, *rids: int) -> dict[int, protocol.Done]:
        """The done events of requests ``rids``, in whatever order they end."""
        out: dict[int, protocol.Done] = {}
        while len(out) < len(rids):
            event = self.event()
            assert not (isinstance(event, protocol.Error) and event.id in rids), event
            if isinstance(event, protocol.Done) and event.id in rids:
                out[event.id] = event
        return out

    def close(self) -> None:
        for fd in (self.cmd_w, self.ev_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def said(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def worker(tmp_path):
    tm.endless(tmp_path / "loop.gguf")
    w = RawWorker(tmp_path / "loop.gguf", tmp_path / "stderr")
    try:
        yield w
    finally:
        w.close()


def test_a_cancel_ends_a_running_generation_and_the_loop_serves_on(worker):
    # its frame a byte at a time: the loop waits on the pipe between the pieces
    worker.send(protocol.Generate(1, protocol.GenerationRequest(messages=said("Hi"), temperature=0)), by=1)
    worker.until(protocol.Start, 1)
    worker.until(protocol.Text, 1)  # endless: it runs until cancelled (or its context is full)
    worker.send(protocol.Cancel(1))
    done = worker.until(protocol.Done, 1)
    assert done.finish_reason == "cancelled"
    # a question goes to a prep thread while the loop waits on its pipe: its answer wakes the loop
    worker.send(protocol.Tokenize(2, protocol.PromptRequest(prompt=" tick tock")))
    assert len(worker.until(protocol.Tokens, 2).tokens) >= 2
    # a long prompt too (read on a prep thread, its result through the wakeup), then a short one
    worker.send(protocol.Generate(3, protocol.GenerationRequest(messages=said(" tick" * 850), max_tokens=2, temperature=0)))
    worker.send(protocol.Generate(4, protocol.GenerationRequest(messages=said("Hi"), max_tokens=2, temperature=0)))
    done = worker.done(3, 4)
    assert [(d.finish_reason, d.completion_tokens) for d in (done[3], done[4])] == [("length", 2)] * 2
    assert len(" tick" * 850) > worker_.INLINE_PREP_CHARS and done[3].prompt_tokens > 850 > done[4].prompt_tokens
    os.close(worker.cmd_w)  # the gateway gone: the worker leaves
    assert worker.proc.wait(BOUND) == 0


def test_a_command_frame_over_the_bound_ends_the_worker_with_the_reason(worker):
    os.write(worker.cmd_w, (pipes.MAX_COMMAND_BYTES + 1).to_bytes(4, "big"))
    assert worker.proc.wait(BOUND) != 0  # without waiting for a body that would never come
    assert b"FrameTooLarge" in worker.stderr.read_bytes()
