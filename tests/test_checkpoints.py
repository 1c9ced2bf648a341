"""Context checkpoints (``engine/checkpoints``): a sliding-window model's cache cut back inside
its window lacks positions the next token attends to; a checkpoint of the window taken near the
end of each prompt lets a prompt that returns with its end changed go on from there instead of
being read whole."""

import pytest

from gateway.engine import checkpoints
from gateway.engine.checkpoints import Checkpoint

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


class Engine:
    def __init__(self, path, swa_full: bool):
        from gateway.engine import ipc
        from gateway.engine.decoding import Decoder
        from gateway.engine.model import Model
        from gateway.engine.outbox import Outbox
        from gateway.engine.sampling import Sampling

        self.ipc = ipc
        self.model = Model(ipc.LoadParams(name="m", path=str(path), parallel=1, n_ctx=3072, prompt_cache_bytes=0,
                                          swa_full=swa_full, n_batch=64))
        self.out = Outbox(-1)
        self.decoder = Decoder(self.model, Sampling(self.model), self.out)
        self.rid = 0

    def tokens(self, text):
        return self.model.vocab.tokenize(text, add_special=True)

    def run(self, text, max_tokens=6, logprobs=None):
        ipc = self.ipc
        self.rid += 1
        req = ipc.GenerationRequest(prompt=text, max_tokens=max_tokens, temperature=0, logprobs=logprobs)
        seq = self.decoder.admit(self.rid, req, self.tokens(text), "")
        while seq.slot.seq is seq:
            self.decoder.step()
        events = [ipc.decode_event(f[4:]) for f in self.out.frames]
        self.out.frames.clear()
        texts = [e for e in events if isinstance(e, ipc.Text) and e.id == self.rid]
        (done,) = [e for e in events if isinstance(e, ipc.Done) and e.id == self.rid]
        self.last_done = done
        self.logprobs = [p for e in texts for p in e.logprobs or []]
        return "".join(e.text for e in texts), done

    def first_token(self, text):
        """The first answer token's five likeliest, with their log-probabilities."""
        self.run(text, max_tokens=1, logprobs=5)
        return [(t["token"], t["logprob"]) for t in self.logprobs[0]["top_logprobs"]]


# what follows the talk in the turn after it: long enough to move the window (and the cells kept
# past it) beyond where the changed prompt differs, as a long answer does
MORE = " And later: " + " ".join(WORDS[(j * 5) % len(WORDS)] for j in range(400))


@pytest.mark.real
def test_without_swa_full_a_prompt_changed_inside_the_window_goes_on_from_a_checkpoint(gemma):
    from gateway.engine.slots import common_prefix

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
    assert all(abs(lp - want[t]) < 0.3 for t, lp in got[:3]), (got, want)
    # and without checkpoints the same prompt is read whole
    bare = Engine(gemma, swa_full=False)
    bare.decoder.n_swa, n_swa = 0, bare.decoder.n_swa
    bare.run(TALK, max_tokens=1)
    bare.run(TALK + MORE, max_tokens=1)
    bare.decoder.n_swa = n_swa
    assert bare.run(changed)[1].cached_tokens == 0
