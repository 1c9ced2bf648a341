"""The model worker: a child process that owns one llama.cpp model and context.

Run as ``python -m gateway.worker.worker CMD_FD EVENT_FD``. It loads the model named by
the first command, then serves the commands of ``protocol/`` until told to exit or its
command pipe closes. llama.cpp may abort the process on some faults; that takes down this
model only, and the parent sees the pipe close.

This module is the process's main loop (``Worker``): it reads its command pipe itself between
two steps (``pipes``: no reader thread), hands prompts to the prep threads, admits requests and
steps the batch. The work itself lives in modules with one job each, all run in this process
only (the gateway never imports llama_cpp):
- ``model``: loads the weights and the context (``Model``);
- ``vocab``: tokens to text and back, end-of-generation tokens;
- ``prompts``: chat templates, the fits-by-bytes check, tokenizing, the checks before a slot;
- ``sampling``: sampler chains, the logits in place, log-probabilities, response_format grammars;
- ``slots``: slots, sequences, the reusable batch;
- ``decoding``: admission to slots and the decode steps (``Decoder``);
- ``embedding``: pooled vectors, many inputs to a decode (``Embedder``);
- ``outbox``: the events queued in a step and written together;
- ``refusals``: a request refused or failed, as its error event;
and beside them ``infill``, ``schemagrammar``, ``slotmemory``, ``checkpoints``, ``generation``,
``drafting``, ``speculation``, ``promptcache``, ``savedslots``, ``media``, ``adapters``, ``rpc`` and ``pipes``,
each its docstring's job.

- Threads. The main loop reads its command pipe itself, between two steps: the pipe is
  non-blocking and ``pipes.CommandReader`` keeps a frame's part until its rest comes (the
  pipe's end: the gateway is gone; a frame's length over ``MAX_COMMAND_BYTES`` is refused);
  while anything runs, one ``poll`` with no wait looks at the pipe each pass, and an idle loop
  waits on the pipe and on a wakeup (``pipes.Wakeup``) at once. It takes each command and each
  result in ``Worker._take``. Two prep threads read prompts (``Prompts.prepare``) and answer
  tokenize / detokenize / apply_template; their results come back through the inbox, each
  followed by a set of the wakeup. A short prompt is read in the loop itself while nothing
  runs.
- Admission and steps (``decoding``): a prepared request takes the free slot whose cache shares
  the longest prefix with its prompt, or a state the prompt cache kept (``slots.choose``); the
  start and done events say how many prompt tokens were reused and from where
  (``cache_source``: slot, ram, disk). A picture or sound is its own step part
  (``Projector.decode``), and a chunk of text never runs into one. Sequences under different
  LoRA adapter sets take turns by decode (``Decoder._turn``), and a cache made under one set is
  never read under another. With speculation, a sequence's token goes into the decode with the
  tokens proposed after it, and ``Generation._verify`` keeps those the model agrees with.
- Sampling: plain greedy is an argmax over the logits in place; anything else a native sampler
  chain (``Sampling.sample``), which never accepts a token the chain left at -inf. Stop strings
  are matched incrementally (``textstream.StopMatcher``). Events go out in one write per step
  (``outbox``), an answer's text after its first held up to ``stream_interval``.

A worker that dies fails its in-flight requests with ``worker_crashed``; the model reloads on
the next request. A worker imports llama.cpp before it reads its first command
(``model.prepare``), so a process started ahead of need is ready for any model
(``backends.spawning.Spare``). On ``Exit`` it saves its slots' caches (``savedslots.save``) before it
leaves; a ``Load`` restores them (``savedslots.restore``) before ``Ready``, so no request is admitted to a
slot being restored.

The decode loop uses llama.cpp's low-level API: prompt tokens go through ``llama_decode``
in ``n_batch`` chunks, each new token is chosen from the logits in place (no copy of the
logits into Python), and pieces are rendered with special tokens shown, so control-token
markers such as ``<|channel|>`` reach the text.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import protocol
from . import embedding, pipes, savedslots
from .decoding import Decoder
from .embedding import Embedder
from .model import Model, prepare
from .outbox import Outbox
from .prompts import PromptQuestion, Prompts, PromptTokens
from .refusals import Refused, failure
from .sampling import Sampling

PREP_THREADS = 2  # one long prompt being read does not hold up a short one behind it
INLINE_PREP_CHARS = 4096  # a prompt this short is read in the loop itself when nothing else runs


@dataclass(eq=False)
class Queued:
    """A generate or embed command waiting for a slot (``Worker.pending``, in arrival order)."""

    command: protocol.Generate | protocol.Embed
    prepared: PromptTokens | list[list[int]] | None = None  # a generate's prompt, an embed's inputs, once read
    cancelled: bool = False  # dropped from the queue by a cancel


@dataclass(slots=True)
class Prepared:
    """Inbox message: a queued request's prompt has been read (``result``: its tokens and text
    tail, or its refusal; None for a request cancelled before it was read)."""

    job: Queued
    result: PromptTokens | list[list[int]] | protocol.Error | None
    threaded: bool  # read on a prep thread (not in the loop)


@dataclass(slots=True)
class Reply:
    """Inbox message: the answer to a question, worked out on a prep thread."""

    event: protocol.Event


def read_inline(command: protocol.Generate | protocol.Embed) -> bool:
    """Whether an idle worker reads this prompt (or these inputs) in its loop: only a short one
    (the hand-off to a prep thread and back costs about a tenth of a millisecond, a short prompt
    less). A busy one reads every prompt on a prep thread, during the decodes."""
    if isinstance(command, protocol.Embed):
        return len(command.inputs) <= 64 and sum(len(x) for x in command.inputs) <= INLINE_PREP_CHARS and \
            (command.query is None or len(command.query) <= INLINE_PREP_CHARS)
    req = command.request
    if req.media:
        return False  # (a picture is encoded on a prep thread)
    if req.prompt_tokens is not None:
        return True
    if req.messages is not None:
        size = sum(len(m.get("content") or "") for m in req.messages if isinstance(m, dict))
        return size <= INLINE_PREP_CHARS and len(req.messages) <= 64
    return len(req.prompt or "") <= INLINE_PREP_CHARS


class Worker:
    """The process's main loop: it reads the command pipe itself between two steps of the batch
    (``pipes.Waiter``: without blocking while anything runs), and admission, decoding and every
    event sent happen here. Reading a prompt (chat template, tokenizer) and answering
    tokenize/detokenize/apply_template happen on prep threads, so a long prompt never stalls the
    decoding of the others (llama.cpp's tokenizer only reads the vocabulary, and llama-server
    tokenizes on its HTTP threads too); their results come back through the inbox (``Prepared``,
    ``Reply``), each with a set of the ``Wakeup`` an idle loop waits on. ``_take`` handles them all."""

    def __init__(self, cmd_fd: int, ev_fd: int):
        self.out = Outbox(ev_fd)
        self.wakeup = pipes.Wakeup()  # set by a prep thread once its result is in the inbox
        self.waiter = pipes.Waiter(pipes.CommandReader(cmd_fd), self.wakeup)
        self.inbox: deque[Prepared | Reply] = deque()  # the prep threads' results (a deque's append is atomic)
        self.pending: deque[Queued] = deque()  # generate and embed commands in arrival order
        self.prep = ThreadPoolExecutor(PREP_THREADS, thread_name_prefix="prep")
        self.asking: dict[int, bool] = {}  # questions on the prep threads -> whether their asker left
        self.preparing = 0  # prompts being read on the prep threads
        # set once the model is loaded (commands that need them are taken only after that)
        self.model: Model | None = None
        self.prompts: Prompts | None = None
        self.decoder: Decoder | None = None
        self.embedder: Embedder | None = None  # an embedding model's
        self.told_cache = 0  # the prompt cache's bytes as the gateway was last told (``CacheHeld``)

    def _put(self, msg: Prepared | Reply) -> None:
        """On a prep thread: a result for the loop, which wakes for it if it waits."""
        self.inbox.append(msg)
        self.wakeup.set()

    def _take(self, msg: protocol.Command | Prepared | Reply | None) -> None:
        match msg:
            case protocol.Exit():
                if self.decoder is not None:  # at an asked-for exit (an unload, a shutdown)
                    self.decoder.save_caches()
                self.out.flush()
                os._exit(0)
            case None:  # the gateway is gone
                self.out.flush()
                os._exit(0)
            case protocol.Generate() | protocol.Embed():
                job = Queued(msg)
                self.pending.append(job)
                if self._quick(msg):
                    self._prepare(job)  # its result is taken at once, the next message this loop takes
                else:
                    self.preparing += 1
                    self.prep.submit(self._prepare, job)
            case Prepared(job=job, result=result, threaded=threaded):
                if threaded:
                    self.preparing -= 1
                if job.cancelled:
                    pass  # dropped from pending by its cancel; nothing is sent for it
                elif isinstance(result, protocol.Error):
                    self.pending.remove(job)
                    self.out.send(result)
                else:
                    job.prepared = result
            case Reply(event=event):
                self.out.send(event)
            case protocol.Cancel(id=rid):
                if rid in self.asking:
                    self.asking[rid] = True  # not started yet: skipped; started: its answer is dropped
                for job in self.pending:
                    if job.command.id == rid:
                        job.cancelled = True
                self.pending = deque(job for job in self.pending if job.command.id != rid)
                for seq in self.decoder.active() if self.decoder else ():
                    if seq.rid == rid:
                        seq.cancelled = True
                if self.embedder is not None:
                    self.embedder.cancel(rid)
            case protocol.Threads(n=n) if self.model is not None:
                self.model.set_threads(n)
            case protocol.TrimCache(id=rid, max_bytes=n):
                if self.decoder is not None and self.decoder.cache is not None:
                    self.decoder.cache.trim(n)
                self._tell_cache(rid)
            case protocol.Adapt() if self.model is not None:  # between two steps: no decode sees it half done
                try:
                    self.out.send(protocol.Adapted(msg.id, self.model.adapters.change(msg)))
                except Refused as r:
                    self.out.send(r.event(msg.id))
            case protocol.Tokenize() | protocol.Detokenize() | protocol.ApplyTemplate() if self.model is not None:
                self.asking[msg.id] = False
                self.prep.submit(self._answer, msg)

    def _tell_cache(self, rid: int = 0) -> None:
        """The prompt cache's size, where it changed since last told or answering ``TrimCache`` ``rid``."""
        cache = self.decoder.cache if self.decoder is not None else None
        held = cache.held if cache is not None else 0
        if rid or held != self.told_cache:
            self.told_cache = held
            self.out.send(protocol.CacheHeld(held, rid))

    def _answer(self, question: PromptQuestion) -> None:
        """On a prep thread: a question's answer, unless its asker left before it began."""
        if not self.asking.get(question.id) and self.prompts is not None:
            event = self.prompts.answer(question)
            if not self.asking.get(question.id):
                self._put(Reply(event))
        self.asking.pop(question.id, None)

    def _quick(self, command: protocol.Generate | protocol.Embed) -> bool:
        """``read_inline``, for the loop's state now."""
        idle = self.decoder is not None and not self.preparing and not self.decoder.active() \
            and (self.embedder is None or not self.embedder.busy)
        return idle and read_inline(command)

    def _prepare(self, job: Queued) -> None:
        """Read a generate request's prompt or an embed's inputs (on a prep thread, or in the
        loop for ``_quick`` ones); the result goes to the inbox, or from the loop straight to
        ``_take``."""
        threaded = threading.current_thread() is not threading.main_thread()
        if job.cancelled:
            if threaded:
                self._put(Prepared(job, None, True))
            return
        command = job.command
        result: PromptTokens | list[list[int]] | protocol.Error
        try:
            assert self.prompts is not None and self.model is not None  # taken only once it is loaded
            if isinstance(command, protocol.Embed):
                result = embedding.read(self.model, self.prompts, command)
            else:
                result = self.prompts.prepare(command.request)
        except Refused as r:
            result = r.event(command.id)
        except Exception as e:  # a bug here must fail one request, not the worker
            result = failure(command.id, e)
        if threaded:
            self._put(Prepared(job, result, True))
        else:
            self._take(Prepared(job, result, False))

    def _admissible(self) -> bool:
        """A waiting request could start now, or waits only for a slot to free."""
        return any(job.prepared is not None for job in self.pending)

    def _poll(self, block: bool) -> None:
        """Take the commands and the prep threads' results, waiting for one where ``block``."""
        for msg in self.waiter.take(block):  # (without ``block``: one ``poll`` system call)
            self._take(msg)
        while self.inbox:
            self._take(self.inbox.popleft())

    def _admit(self, decoder: Decoder) -> None:
        """Start waiting requests in free slots, in arrival order; one whose prompt is still
        being read lets those behind it go first. An embed's inputs join the embedder's (an
        embedding model generates nothing)."""
        for job in list(self.pending):
            command, prepared = job.command, job.prepared
            if prepared is None:
                continue
            if isinstance(command, protocol.Embed):
                assert isinstance(prepared, list) and self.embedder is not None
                self.pending.remove(job)
                self.embedder.add(command.id, prepared, command.query is not None)
                continue
            if not decoder.free_slots():
                return
            assert isinstance(command, protocol.Generate) and isinstance(prepared, PromptTokens)
            self.pending.remove(job)
            self._guard(command.id, self._start, decoder, command, prepared)

    def _start(self, decoder: Decoder, command: protocol.Generate, prompt: PromptTokens) -> None:
        req = command.request
        seq = decoder.admit(command.id, req, prompt.tokens, prompt.tail, prompt.runs)
        echo = None
        if req.echo:
            assert self.model is not None
            echo = req.prompt if req.prompt is not None else self.model.vocab.detokenize(seq.tokens)
        self.out.send(protocol.Start(command.id, len(seq.tokens), seq.common, seq.slot.id, seq.prompt_tail, echo,
                               seq.source))

    def _embed(self, embedder: Embedder) -> None:
        """One decode of the waiting inputs; the events of the requests it finished or failed."""
        for event in embedder.step():
            self.out.send(event)
        assert self.decoder is not None
        self.decoder.forget_cache()  # the context's memory was cleared

    def _guard(self, rid: int, work, *args: Any) -> None:
        """``work(*args)``; a refusal or a bug there fails request ``rid`` alone."""
        try:
            work(*args)
        except Refused as r:
            self.out.send(r.event(rid))
        except Exception as e:  # a bug here must fail one request, not the worker
            self.out.send(failure(rid, e))

    def run(self) -> None:
        out = self.out
        prepare()  # before the first command: a spare process is ready ahead of its load
        came = self.waiter.first()
        first = came.pop(0)
        if not isinstance(first, protocol.Load):
            os._exit(0)
        told = -1

        def progress(fraction: float) -> None:  # each whole percent goes out at once: the load holds the loop
            nonlocal told
            percent = int(fraction * 100)
            if percent != told:
                told = percent
                out.send(protocol.LoadProgress(round(fraction, 4)))
                out.flush()

        try:
            model = self.model = Model(first.model, progress)
            self.prompts = Prompts(model)
            decoder = self.decoder = Decoder(model, Sampling(model), out)
            embedder = self.embedder = Embedder(model) if model.embed_seqs else None
        except Exception as e:  # report, then leave: a failed load has nothing to serve
            out.send(protocol.LoadFailed(str(e)))
            out.flush()
            os._exit(0)
        restored = (0, 0)
        if first.model.kv_cache_dir:
            try:  # before the first request: a returning conversation finds its cache
                restored = savedslots.restore(model, decoder.slots, first.model.kv_cache_dir, decoder.cache)
            except Exception as e:  # an unreadable cache directory is a miss
                sys.stderr.write(f"could not restore the KV caches of {first.model.name}: {e}\n")
        out.send(protocol.Ready({**model.info(), "restored_slots": restored[0], "restored_tokens": restored[1]}))
        self._tell_cache()  # the states the load restored into the prompt cache
        out.flush()
        interval = model.params.stream_interval
        for msg in came:  # what came in the same read as the load
            self._take(msg)
        while True:
            self._poll(block=not decoder.active() and not self._admissible()
                       and not (embedder is not None and embedder.busy))
            self._admit(decoder)
            if decoder.active():
                decoder.step()
            if model.adapters.retired:  # dropped at run time: freed once no sequence uses them
                model.adapters.collect(seq.adapters for seq in decoder.active())
            elif embedder is not None and embedder.busy:
                self._embed(embedder)
            # Held text goes out once waiting for the next step would hold it past the interval:
            # a model faster than that streams its tokens in twos or threes (each still its own
            # event), so the gateway process wakes fewer times. Its wake-ups cost CPU that, on a
            # machine whose cores all decode, comes out of llama.cpp's threads.
            # The prompt cache changes where a request is admitted or (rarely) in a step: its
            # size goes out with a step's urgent events (a start, a done), never per token.
            if out.frames and (out.urgent or not decoder.active()
                               or time.monotonic() - out.held_since + decoder.last_step >= interval):
                if out.urgent:
                    self._tell_cache()
                out.flush()


def main(argv: list[str]) -> None:
    Worker(int(argv[1]), int(argv[2])).run()


if __name__ == "__main__":
    main(sys.argv)
