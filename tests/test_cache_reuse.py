"""Reuse past the first difference (``cache_reuse``, llama-server's ``--cache-reuse``): chunks of a
slot's cache that a prompt repeats after a change are moved to their new positions instead of
read again (``slots.reuse_plan``, ``Decoder._move`` / ``_splice``).

The engine tests drive the worker's own ``Decoder`` on real llama.cpp in this process. The model
is a one-layer random-weight llama with a real tokenizer: in its only layer a token's key and
value depend on the token and its position alone, so cells moved to the right positions answer
exactly as a fresh read (the K cache is f32, so re-rotating a key costs nothing visible), and
cells at a wrong position, or a chunk not moved, answer otherwise. In a deeper model a moved
chunk keeps what it computed under its old context: reuse is an approximation there, off by
default, as in llama-server."""

import pytest
from helpers import InProcessEngine, bench_conversation, tiny_random_model

from gateway import protocol
from gateway.worker.slots import Reuse, fit_window, reuse_plan

# --- the plan (pure) ----------------------------------------------------------------------------

OLD = list(range(100, 140))  # a cached conversation: 40 tokens


def test_a_chunk_after_left_out_tokens_moves_back_as_llama_servers_rule():
    prompt = OLD[:10] + OLD[15:] + [7, 8]  # five tokens left out at 10, two new at the end
    assert reuse_plan(OLD, prompt, 10, 8, splice=False) == [Reuse(15, 10, 25)]


def test_a_changed_line_stops_the_plain_rule_and_is_spliced_past_in_a_unified_pool():
    prompt = OLD[:10] + [1, 2, 3] + OLD[12:] + [7, 8]  # two cached tokens replaced by three new ones
    assert reuse_plan(OLD, prompt, 10, 8, splice=False) == []
    assert reuse_plan(OLD, prompt, 10, 8, splice=True) == [Reuse(12, 13, 28)]


def test_chunks_shorter_than_the_minimum_are_read_again_and_zero_is_off():
    prompt = OLD[:10] + [1] + OLD[11:16] + [2] + OLD[17:] + [9]
    assert reuse_plan(OLD, prompt, 10, 8, splice=True) == [Reuse(17, 17, 23)]  # the 5-token piece is read
    assert reuse_plan(OLD, prompt, 10, 0, splice=True) == []


def test_the_last_token_is_never_reused_and_chunks_keep_their_order():
    prompt = OLD[:10] + OLD[12:]  # ends where the cache ends: its last token is read for logits
    assert reuse_plan(OLD, prompt, 10, 8, splice=False) == [Reuse(12, 10, 27)]
    swapped = OLD[:10] + OLD[30:40] + OLD[10:30]  # a later chunk first: the earlier one is not moved past it
    plan = reuse_plan(OLD, swapped, 10, 8, splice=True)
    assert plan == [Reuse(30, 10, 10)]


def test_a_sliding_window_model_keeps_only_chunks_whose_last_window_is_held():
    # a state loaded back holds the sliding-window cells of its last 8 positions (32..39) only
    missing = [(0, 32)]
    whole = Reuse(12, 13, 27)  # runs to the cache's end: its last window is held, its start is not
    assert fit_window([whole], 8, missing, splice=True) == [Reuse(12, 13, 27, hole=20)]
    early = Reuse(12, 13, 14)  # ends at 26: the window a token read after it attends to is gone
    assert fit_window([early], 8, missing, splice=True) == []
    # a hole left by an earlier splice counts as the state's missing start does
    assert fit_window([whole], 8, [(0, 4), (33, 35)], splice=True) == []
    assert fit_window([whole], 8, [(0, 4), (20, 25)], splice=True) == [Reuse(12, 13, 27, hole=13)]
    # without splicing, the chunks after one that fails no longer follow the reused part
    later = Reuse(30, 27, 9)
    assert fit_window([early, later], 8, missing, splice=False) == []
    assert fit_window([early, later], 8, missing, splice=True) == [Reuse(30, 27, 9, hole=2)]
    assert fit_window([early], 0, missing, splice=True) == [early]  # no window: every chunk


# --- the engine on real llama.cpp ---------------------------------------------------------------

@pytest.fixture(scope="module")
def model_path():
    return tiny_random_model("llama-spm", seed=11)


class Engine(InProcessEngine):
    def __init__(self, path, reuse: int, unified: bool = False):
        # f32 caches: re-rotating a moved key costs nothing visible
        super().__init__(path, cache_reuse=reuse, kv_unified=unified, cache_type_k="f32", cache_type_v="f32")

    def run(self, text: str, max_tokens: int = 12, logprobs: int | None = None):
        return super().run(text, max_tokens, logprobs)

    def positions(self) -> tuple[int, int]:
        ll, mem = self.model.ll, self.model.mem
        return ll.llama_memory_seq_pos_min(mem, 0), ll.llama_memory_seq_pos_max(mem, 0)


HEAD = "A long talk about the harbour, the boats and the weather in the bay. " * 4
TAIL = "Then the keeper climbed the stairs and lit the lamp above the rocks. " * 4


def fresh(path, text):
    return Engine(path, reuse=0).run(text)


@pytest.mark.parametrize("unified", [False, True])
def test_left_out_tokens_reuse_the_rest_and_answer_as_a_fresh_read(model_path, unified):
    engine = Engine(model_path, reuse=16, unified=unified)
    engine.run(HEAD + "(Note: turn one.) " + TAIL)
    prompt = HEAD + TAIL + "And then?"  # the note left out: the tail moves back onto its room
    answer, done = engine.run(prompt)
    assert answer == fresh(model_path, prompt)[0]
    n = len(engine.tokens(prompt))
    shared = len(engine.tokens(HEAD)) - 2  # the prefix, give or take how the note's first word splits
    assert done.cached_tokens > shared + len(engine.tokens(TAIL)) - 8, done
    assert engine.positions() == (0, n - 1 + done.completion_tokens - 1)


def test_a_changed_line_is_spliced_past_in_a_unified_pool_and_answers_as_a_fresh_read(model_path):
    before = HEAD + "(Note: turn 9, 9667 tokens left.) " + TAIL
    after = HEAD + "(Note: turn 10, 9630 tokens left.) " + TAIL + "And then?"
    plain, spliced = Engine(model_path, reuse=16), Engine(model_path, reuse=16, unified=True)
    for engine in (plain, spliced):
        engine.run(before)
    answer, done = spliced.run(after)
    _, plain_done = plain.run(after)
    assert answer == fresh(model_path, after)[0]
    # without a unified pool only the prefix comes back; with one, the tail too
    assert done.cached_tokens >= plain_done.cached_tokens + len(spliced.tokens(TAIL)) - 8
    n = len(spliced.tokens(after))
    assert spliced.positions() == (0, n - 1 + done.completion_tokens - 1)
    ll, mem = spliced.model.ll, spliced.model.mem
    assert ll.llama_memory_seq_pos_max(mem, 1) == -1  # nothing left parked


def test_a_request_cancelled_before_its_splice_leaves_nothing_parked(model_path):
    engine = Engine(model_path, reuse=16, unified=True)
    engine.run(HEAD + "(Note: one.) " + TAIL)
    text = HEAD + "(Note: two more words here.) " + TAIL + "Go on."
    req = protocol.GenerationRequest(prompt=text, max_tokens=4, temperature=0)
    seq = engine.decoder.admit(99, req, engine.tokens(text), "")
    assert seq.splices  # the tail waits under the slot's second id
    seq.cancelled = True
    engine.decoder.step()
    engine.out.frames.clear()  # (its done event: never written, the outbox has no pipe)
    ll, mem = engine.model.ll, engine.model.mem
    assert seq.slot.seq is None and ll.llama_memory_seq_pos_max(mem, 1) == -1
    answer, _ = engine.run(HEAD + "Something else entirely.")
    assert answer == fresh(model_path, HEAD + "Something else entirely.")[0]


@pytest.fixture(scope="module")
def swa_path():
    return tiny_random_model("llama-spm", seed=11, sliding_window=32)


def kept_engine(path, reuse: int):
    """A one-slot engine with a prompt cache: a conversation's state goes to RAM when another takes
    its slot, and comes back holding only its last window (and its checkpoints)."""
    return InProcessEngine(path, cache_reuse=reuse, kv_unified=True, prompt_cache_bytes=64 * 2**20,
                           cache_type_k="f32", cache_type_v="f32")


def close(got: list, want: list, within: float = 1e-3) -> bool:
    """Log-probabilities equal but for the rounding of re-rotating moved keys (f32)."""
    return len(got) == len(want) and all(
        g["token"] == w["token"] and abs(g["logprob"] - w["logprob"]) < within for g, w in zip(got, want))


def returning(engine, before: str, after: str):
    engine.run(before)
    engine.run("Something else entirely, for a while.")  # takes the slot: ``before`` is kept in RAM
    return engine.run(after, logprobs=3)


def test_a_sliding_window_state_kept_in_ram_goes_on_from_a_checkpoint_and_splices_its_end(swa_path):
    """A changed line in the middle of a conversation that comes back from RAM: its state holds
    only the window before its end, so the prompt is read from the checkpoint before the change
    and the rest spliced in; the chunk's cells before its last window are missing (a hole), out
    of the window of every token read after it. Each answers exactly as a fresh read."""
    before = HEAD + "(Note: turn 9, 9667 tokens left.) " + TAIL + TAIL
    after = HEAD + "(Note: turn 10, 9630 tokens left.) " + TAIL + TAIL + "And then?"
    engine = kept_engine(swa_path, reuse=16)
    assert engine.model.n_swa == 32
    answer, done = returning(engine, before, after)
    want = kept_engine(swa_path, reuse=0)
    assert answer == want.run(after, logprobs=3)[0] and close(engine.logprobs, want.logprobs)
    shared = len(engine.tokens(HEAD)) - 2
    assert done.cache_source == "ram"
    assert done.cached_tokens >= shared // 32 * 32 - 32 + len(engine.tokens(TAIL + TAIL)) - 8, done
    slot = engine.decoder.slots[0]
    assert slot.holes and all(b <= len(engine.tokens(after)) - 32 for _, b in slot.holes)


def test_a_slots_own_conversation_changed_early_is_not_kept_and_cut_for_another(swa_path):
    """The prompt shares less than half of the slot's cache as a prefix but repeats the rest past
    a changed line: it is the same conversation, so the slot is neither copied to the prompt
    cache nor cut back for checkpoints (which would drop the chunk it reuses)."""
    before = HEAD + "(Note: turn 9, 9667 tokens left.) " + TAIL + TAIL
    after = HEAD + "(Note: turn 10, 9630 tokens left.) " + TAIL + TAIL + "And then?"
    engine = kept_engine(swa_path, reuse=16)
    engine.run(before)
    assert len(engine.tokens(HEAD)) < len(engine.tokens(before)) / 2
    answer, done = engine.run(after, logprobs=3)
    assert not engine.decoder.cache.entries
    assert done.cached_tokens > len(engine.tokens(after)) - 16
    want = kept_engine(swa_path, reuse=0)
    assert answer == want.run(after, logprobs=3)[0] and close(engine.logprobs, want.logprobs)


def test_a_chunk_whose_last_window_the_kept_state_lacks_is_read(swa_path, monkeypatch):
    """The conversation comes back with its end rewritten: the chunk before the new end lacks
    the window its next token attends to (the state kept only its old end's), so it is read;
    reused anyway, the answer changes (the check is what keeps it right)."""
    before = HEAD + "(Note: turn 9, 9667 tokens left.) " + TAIL + "The old ending, said at length. " * 3
    after = HEAD + "(Note: turn 10, 9630 tokens left.) " + TAIL + "A new ending."
    want = kept_engine(swa_path, reuse=0)
    want.run(after, logprobs=3)
    engine = kept_engine(swa_path, reuse=16)
    answer, done = returning(engine, before, after)
    assert close(engine.logprobs, want.logprobs)
    assert done.cached_tokens < len(engine.tokens(HEAD))  # the checkpoint before the change, no chunk
    from gateway.worker import slotmemory

    monkeypatch.setattr(slotmemory, "fit_window", lambda plan, *_: plan)
    careless = kept_engine(swa_path, reuse=16)
    _, done = returning(careless, before, after)
    assert done.cached_tokens > len(engine.tokens(HEAD)) and not close(careless.logprobs, want.logprobs, 0.1)


def test_off_by_default_and_reported_where_the_cache_cannot_shift(model_path):
    assert protocol.LoadParams(name="m", path=str(model_path)).cache_reuse == 0
    engine = Engine(model_path, reuse=16)
    assert engine.model.info()["cache_reuse"] == 16


def test_a_unified_pool_holds_every_slots_window_so_conversations_come_back_past_a_changed_line(
        swa_path, monkeypatch):
    """Four conversations over two slots of one unified pool, a line in the middle changing every
    turn (``bench.py --conversations --middle-change``). llama.cpp gives a sliding-window cell the
    window masks to any sequence needing one; the slots' pin ids hold them (``Model.pin``), so
    each returning turn goes on from its kept state and checkpoint with its end spliced in, and
    answers as a fresh read. Unpinned, a conversation's cells are taken and it is read whole."""
    def turns(pin: bool):
        engine = InProcessEngine(swa_path, parallel=2, n_ctx=2048, kv_unified=True, cache_reuse=16,
                                 prompt_cache_bytes=64 * 2**20, cache_type_k="f32", cache_type_v="f32")
        assert engine.model.pin
        if not pin:
            monkeypatch.setattr(engine.decoder.memory, "pin_base", None)
        convs = [bench_conversation(f"conversation {i}", 150, middle=True) for i in range(4)]
        out = []
        for _ in range(3):
            for conv in convs:
                prompt = conv.next_prompt()
                answer, done = engine.run(prompt, max_tokens=8)
                out.append((prompt, answer, done))
                conv.answered(prompt, answer)
        return out

    pinned = turns(pin=True)
    fresh_engine = Engine(swa_path, reuse=0)
    for prompt, answer, done in pinned[4:]:
        assert done.cache_source == "ram" and done.cached_tokens > 0.7 * done.prompt_tokens, done
        fresh_engine.decoder.slots[0].keep(0)
        fresh_engine.model.ll.llama_memory_seq_rm(fresh_engine.model.mem, 0, -1, -1)
        assert answer == fresh_engine.run(prompt, max_tokens=8)[0]
    assert any(done.cached_tokens == 0 for _, _, done in turns(pin=False)[4:])
