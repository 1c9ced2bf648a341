"""Context checkpoints (``worker/checkpoints``): a sliding-window model's cache cut back inside
its window lacks positions the next token attends to; a checkpoint of the window taken near the
end of each prompt lets a prompt that returns with its end changed go on from there instead of
being read whole."""

import pytest
from helpers import InProcessEngine

from gateway.worker import checkpoints
from gateway.worker.checkpoints import Checkpoint

# --- where and which (pure) ---------------------------------------------------------------------


def test_marks_fall_a_batch_and_a_few_tokens_before_the_prompts_end_past_where_reading_starts():
    assert checkpoints.marks(0, 1000, 512) == [1000 - 4 - 512, 1000 - 4]
    assert checkpoints.marks(600, 1000, 512) == [996]  # the earlier one is already cached
    assert checkpoints.marks(0, 300, 512) == [296]
    assert checkpoints.marks(0, 4, 512) == []


def test_the_latest_checkpoint_at_or_before_the_shared_prefix_is_picked():
    cps = [Checkpoint(n, bytearray(b"x"), 0) for n in (100, 484, 996)]
    assert checkpoints.pick(cps, 995).n_tokens == 484
    assert checkpoints.pick(cps, 996).n_tokens == 996
    assert checkpoints.pick(cps, 99) is None


# --- on Gemma 3 (sliding-window layers), real llama.cpp -----------------------------------------

WORDS = "river city people market bridge winter summer stone house garden road north light".split()
TALK = "Story: " + " ".join(WORDS[(j * 7) % len(WORDS)] for j in range(1000))  # past the window and a batch


@pytest.fixture(scope="module")
def gemma():
    from realmodel import gemma_path

    return gemma_path()


def Engine(path, swa_full: bool, ctx_checkpoints: int = 8):
    return InProcessEngine(path, n_ctx=3072, swa_full=swa_full, n_batch=64, ctx_checkpoints=ctx_checkpoints)


# what follows the talk in the turn after it: long enough to move the window (and the cells kept
# past it) beyond where the changed prompt differs, as a long answer does
MORE = " And later: " + " ".join(WORDS[(j * 5) % len(WORDS)] for j in range(400))


@pytest.mark.real
def test_without_swa_full_a_prompt_changed_inside_the_window_goes_on_from_a_checkpoint(gemma):
    from gateway.worker.slots import common_prefix

    engine = Engine(gemma, swa_full=False)
    assert engine.model.n_swa > 0  # only the window (and a batch: n_batch is small here) is kept
    engine.run(TALK, max_tokens=1)
    assert [c.n_tokens for c in engine.decoder.slots[0].checkpoints] == \
        checkpoints.marks(0, len(engine.tokens(TALK)), engine.decoder.n_ubatch)
    engine.run(TALK + MORE, max_tokens=1)
    changed = TALK[:-40] + " and then the end was different"
    differs = common_prefix(engine.tokens(TALK), engine.tokens(changed))
    mark = checkpoints.pick(engine.decoder.slots[0].checkpoints, differs)
    got = engine.first_token(changed)
    done = engine.last_done
    assert mark is not None and differs - mark.n_tokens > 4
    assert (done.cached_tokens, done.cache_source) == (mark.n_tokens, "slot")
    # as a cold read's, within what the order of a read moves it on this quantized model on the
    # CPU (a cold read with the full window differs from one without as much): the cells of a ring
    # loaded back lie in another order than the read that wrapped them, and the prompt's tail is
    # read in other batches, so a greedy answer may flip where two tokens are close. A window of
    # the wrong tokens or positions moves it by far more
    want = dict(Engine(gemma, swa_full=False).first_token(changed))
    assert [t for t, _ in got[:2]] == list(want)[:2]
    assert all(abs(lp - want[t]) < 0.3 for t, lp in got[:2]), (got, want)
    # and without checkpoints the same prompt is read whole
    bare = Engine(gemma, swa_full=False, ctx_checkpoints=0)
    bare.run(TALK, max_tokens=1)
    bare.run(TALK + MORE, max_tokens=1)
    assert not bare.decoder.slots[0].checkpoints
    assert bare.run(changed)[1].cached_tokens == 0


@pytest.mark.real
def test_a_damaged_checkpoint_reads_the_prompt_whole(gemma):
    engine = Engine(gemma, swa_full=False)
    engine.run(TALK, max_tokens=1)
    engine.run(TALK + MORE, max_tokens=1)
    for cp in engine.decoder.slots[0].checkpoints:
        cp.data[len(cp.data) // 2] ^= 0xFF
    changed = TALK[:-40] + " and then the end was different"
    got = engine.first_token(changed)
    assert engine.last_done.cached_tokens == 0
    assert got == Engine(gemma, swa_full=False).first_token(changed)  # read as a cold read is


@pytest.mark.real
def test_a_prompt_sharing_only_an_opening_with_a_window_only_cache_is_read_whole(gemma):
    """The window lies wholly past the shared opening: cut there, the sliding-window layers would
    hold nothing before the next token (an empty sequence, not a window), so nothing is reused."""
    engine = Engine(gemma, swa_full=False, ctx_checkpoints=0)
    engine.run(TALK, max_tokens=1)
    other = TALK[:40] + " and something else entirely."
    got = engine.first_token(other)
    assert engine.last_done.cached_tokens == 0
    # bit for bit as a cold read on an engine of the same settings: without checkpoints the prompt
    # is read in the same chunks (with them, a cold read stops at a mark a few tokens before the
    # end, and some CPUs' kernels round a token read in another chunk shape differently)
    assert got == Engine(gemma, swa_full=False, ctx_checkpoints=0).first_token(other)


@pytest.mark.real
def test_a_slot_saved_at_an_exit_keeps_a_checkpoint_each_window_and_a_middle_change_goes_on_from_one(
        gemma, tmp_path):
    """With ``swa_full`` a slot holds every position, but its saved state only its last window: the
    save cuts it back to take a checkpoint each window (and near its prompt's end), so after the
    next load a prompt that changed in the middle is read on from the window before the change,
    as a cold read would read it."""
    from gateway.worker import savedslots
    from gateway.worker.slots import common_prefix

    engine = Engine(gemma, swa_full=True)
    engine.run(TALK, max_tokens=1)
    assert not engine.decoder.slots[0].checkpoints  # a slot holding every position takes none as it reads
    savedslots.save(engine.model, engine.decoder.slots, str(tmp_path), 2**30,
                    behind=engine.decoder.memory.checkpoints_behind)
    again = Engine(gemma, swa_full=True)
    assert savedslots.restore(again.model, again.decoder.slots, str(tmp_path))[0] == 1
    n, n_swa = len(engine.tokens(TALK)), again.model.n_swa
    assert [c.n_tokens for c in again.decoder.slots[0].checkpoints] == \
        sorted({*checkpoints.marks(0, n, again.decoder.n_ubatch), *range(n_swa, n, n_swa)})
    changed = TALK[:len(TALK) * 3 // 4] + " but then something else happened."
    differs = common_prefix(engine.tokens(TALK), engine.tokens(changed))
    mark = checkpoints.pick(again.decoder.slots[0].checkpoints, differs)
    assert mark is not None and mark.n_tokens == differs // n_swa * n_swa
    got = again.first_token(changed)
    assert (again.last_done.cached_tokens, again.last_done.cache_source) == (mark.n_tokens, "disk")
    assert got == Engine(gemma, swa_full=True).first_token(changed)
