"""Speculative decoding by prompt lookup (``worker/speculation``, ``spec_type: ngram``): the
proposals and the verification (pure), then the worker's decoder on real llama.cpp: answers
with speculation are token for token those without it, greedy and sampled with a seed (each
kept token is the target's own choice at its position), alone and batched with other slots,
and on a model that repeats itself most drafts are kept."""

import pytest
from helpers import InProcessEngine, tiny_random_model

from gateway.models import testmodels as tm
from gateway.models.ggufwriter import _MARGIN
from gateway.worker.speculation import CREDIT, MAX_WAIT, Lookup, Pace, Watch, accepted, depth, draft_length, paced, paid

# --- proposals and verification (pure) ----------------------------------------------------------


TRUSTED = Pace(credit=100)  # a sequence whose proposals proved themselves


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence():
    look = Lookup([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2], n=2, m=3)
    assert look.propose(10, TRUSTED) == [3, 7, 8]  # "1 2" last came before "3 7 8", not "3 4 5"
    assert look.propose(2, TRUSTED) == [3, 7]
    look.extend([3])
    assert look.propose(10, TRUSTED) == [7, 8, 1]  # "2 3" latest: before "7 8 1"
    assert Lookup([1, 2, 3], n=2, m=4).propose(4, TRUSTED) == []  # "2 3" never came before
    assert Lookup([5], n=2, m=4).propose(4) == [] and Lookup([1, 2, 1, 2], n=2, m=4).propose(0, TRUSTED) == []


def test_an_unproven_match_proposes_only_where_twice_the_ngram_agrees_and_no_further():
    copied = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]  # "1 2 3 4" again: four tokens agree
    assert Lookup(copied, n=2, m=8).propose(8) == [5, 6, 7, 8]
    assert Lookup(copied, n=2, m=8).propose(8, TRUSTED) == [5, 6, 7, 8, 9, 0, 1, 2]
    assert Lookup(copied, n=3, m=8).propose(8) == []  # four agree: under twice a 3-gram
    chance = [1, 2, 3, 4, 5, 6, 9, 9, 3, 4]  # only the n-gram "3 4" agrees: a chance match
    assert Lookup(chance, n=2, m=8).propose(8) == []
    assert Lookup(chance, n=2, m=8).propose(8, TRUSTED) == [5, 6, 9, 9, 3, 4]
    assert Lookup(copied, n=2, m=8).propose(8, Pace(credit=-1)) == []  # a debt asks for one more
    assert Lookup(copied, n=2, m=8).propose(8, alone=False) == []  # beside other rows: four times the n-gram
    assert Lookup(copied, n=1, m=8).propose(8, alone=False) == [5, 6, 7, 8]
    assert depth([1, 2, 3, 1, 2, 3], 3, 8) == 3 and depth([1, 2, 3, 1, 2, 3], 3, 2) == 2


def test_the_draft_length_risks_what_the_sequence_earned():
    fresh, n = Pace(), 4
    assert [draft_length(a, n, fresh, 16, True) for a in (4, 7, 8, 12, 30)] == [0, 0, 8, 12, 16]
    assert draft_length(15, n, fresh, 16, alone=False) == 0  # a batched step: an unproven sequence needs more
    assert draft_length(16, n, fresh, 16, alone=False) == 16
    assert draft_length(30, n, Pace(credit=-8), 16, True) == 16 and draft_length(15, n, Pace(credit=-8), 16, True) == 0
    assert draft_length(4, n, Pace(credit=6), 16, True) == 0  # a short match: only for a copy under way
    assert draft_length(8, n, Pace(credit=12), 16, True) == 12  # a long one: its credit where that is more
    assert draft_length(4, n, Pace(credit=16), 16, True) == 16  # a whole draft's credit: short matches too
    assert draft_length(4, n, Pace(credit=20), 16, alone=False) == 16  # and beside other rows
    assert draft_length(4, n, Pace(credit=16), 8, True, full=16) == 8
    assert draft_length(4, n, Pace(credit=12), 8, True, full=16) == 0  # the setting's draft, not the cap, is whole
    assert draft_length(4, n, Pace(credit=40, misses=1), 16, True) == 4  # after a miss: what agrees
    assert draft_length(11, n, Pace(credit=40, misses=1), 16, True) == 16


def test_accepted_keeps_the_picks_while_they_match_the_draft():
    def picks(seq):
        calls = []

        def pick(i):
            calls.append(i)
            return seq[i]
        return pick, calls

    pick, calls = picks([5, 6, 7, 8])
    assert accepted([5, 6, 7], pick) == [5, 6, 7, 8] and calls == [0, 1, 2, 3]  # all kept, and the next
    pick, calls = picks([5, 9, 7, 8])
    assert accepted([5, 6, 7], pick) == [5, 9] and calls == [0, 1]  # the first difference is the last kept
    pick, calls = picks([4, 6])
    assert accepted([5, 6], pick) == [4] and calls == [0]
    assert accepted([], picks([3])[0]) == [3]
    pick, calls = picks([5, None, 7])
    assert accepted([5, 6], pick) == [5] and calls == [0, 1]  # the answer ended


def test_the_proposal_length_halves_after_a_miss_and_doubles_after_a_whole_keep():
    def cap(cap, proposed, kept, most=16):
        return paced(Pace(cap), proposed, kept, most).cap

    assert cap(16, 16, 3) == 8  # a miss: half, or what was kept and one more
    assert cap(16, 16, 12) == 13 and cap(1, 1, 0) == 1
    assert cap(4, 4, 4) == 8 and cap(8, 8, 8) == 16 and cap(16, 16, 16) == 16
    assert cap(5, 0, 0) == 5  # nothing proposed: nothing learned
    assert cap(Pace().cap, 16, 0) == 8  # the first miss halves the setting's length


def test_a_sequence_whose_proposals_keep_missing_waits_longer_each_time():
    pace, waits = Pace(4), []
    for _ in range(7):
        pace = paced(pace, 3, 1, 16)  # less than half kept
        waits.append(pace.wait)
        while pace.wait:  # the steps it waits count it down
            pace = paced(pace, 0, 0, 16)
    assert waits == [0, 1, 3, 7, 15, MAX_WAIT, MAX_WAIT] and pace.misses == 7
    assert paced(pace, 4, 2, 16) == Pace(3, credit=pace.credit)  # half kept: no more misses, no wait
    assert paced(Pace(4, misses=2, wait=0), 4, 4, 16) == Pace(8, credit=4)
    assert paced(Pace(4, credit=1), 4, 1, 16).credit <= 0


def test_the_credit_grows_with_kept_drafts_and_shrinks_with_refused_ones_within_bounds():
    pace = Pace()
    for _ in range(10):  # a copy: every draft kept
        pace = paced(pace, 16, 16, 16)
    assert pace.credit == CREDIT * 16 and pace.credit > 0  # bounded: a long copy does not buy a long run of misses
    pace = paced(pace, 16, 6, 16)  # an edit: 6 kept, 10 refused
    assert pace.credit == CREDIT * 16 - 4 and pace.credit > 0 and pace.misses == 1
    for _ in range(10):  # a model that does not copy: every draft refused
        pace = paced(pace, 8, 0, 16)
    assert pace.credit == -CREDIT * 16 and pace.credit <= 0  # bounded: a long match can still propose
    assert draft_length(16, 4, pace, 16, True) == 0 and draft_length(2 * 4 + CREDIT * 16, 4, pace, 64, True) > 0


def test_a_copying_sequence_grows_its_drafts_and_a_missing_one_stops_proposing():
    """The lookup and the pace together, as the decoder drives them: a sequence copying a long
    stretch of its prompt proposes ever longer drafts, one whose proposals are refused stops
    proposing, and beside another sequence's rows an unproven one waits for a longer copy."""
    text = list(range(100, 160))

    def drive(answer, alone=True):
        look, pace, sizes, at = Lookup(text, n=3, m=16), Pace(), [], 0
        while at < len(answer):
            draft = look.propose(len(answer) - at, pace, alone) if not pace.wait else []
            kept = 0
            while kept < len(draft) and answer[at + kept] == draft[kept]:
                kept += 1
            look.extend(answer[at:at + kept + 1])
            at += kept + 1
            pace = paced(pace, len(draft), kept, 16)
            sizes.append((len(draft), kept))
        return sizes

    copy = drive(text)  # the answer copies the prompt whole
    proposed = [d for d, _ in copy if d]
    assert proposed[0] == 6 and 16 in proposed and all(k == d for d, k in copy)
    assert len(copy) < len(text) / 4  # most tokens came as kept drafts
    # the answer copies 6 tokens at a time, each stretch from somewhere else: every draft misses
    jumbled = [t for i in range(0, 60, 6) for t in text[(i * 7) % 54:(i * 7) % 54 + 6]]
    tries = drive(jumbled)
    assert sum(d for d, _ in tries) <= 2 * 6 + 1 and sum(k for _, k in tries) <= sum(d for d, _ in tries)
    batched = drive(text, alone=False)  # beside other rows: an unproven sequence waits for a longer copy
    assert [d for d, _ in batched if d][0] == 12 and all(k == d for d, k in batched)


def test_beside_other_rows_a_missing_sequence_adds_no_row_and_a_copy_earns_its_drafts():
    """The decoder's rule for a step with other sequences' rows (``Generation.drafts``): a
    proposal is drafted only as far as the credit pays, else watched and settled into the pace
    as the tokens come. A copy earns credit unread and then drafts whole; an answer that copies
    stretches from elsewhere (every proposal misses) adds no row, where alone it tries."""
    text = list(range(100, 160))

    def drive(answer):
        look, pace, rows, watch = Lookup(text, n=3, m=16), Pace(), [], None
        at = 0
        while at < len(answer):
            proposal = look.propose(len(answer) - at, pace, alone=False) if not pace.wait and watch is None else []
            if pace.wait and watch is None:
                pace = paced(pace, 0, 0, 16)
            k = paid(len(proposal), pace, alone=False)
            if proposal and not k:
                watch = Watch(proposal)
            draft, kept = proposal[:k], 0
            while kept < len(draft) and answer[at + kept] == draft[kept]:
                kept += 1
            for tok in answer[at:at + kept + 1]:
                look.extend((tok,))
                if watch is not None and (settled := watch.see(tok)) is not None:
                    watch, pace = None, paced(pace, *settled, 16)
            if draft:
                pace = paced(pace, len(draft), kept, 16)
            rows.append((len(draft), kept))
            at += kept + 1
        return rows

    copy = drive(text + text)
    assert copy[0] == (0, 0) and sum(d for d, _ in copy) > len(text) and all(k == d for d, k in copy)
    jumbled = [t for i in range(0, 60, 6) for t in text[(i * 7) % 54:(i * 7) % 54 + 6]]
    assert all(d == 0 for d, _ in drive(jumbled))
    look, pace = Lookup(text, n=3, m=16), Pace()  # alone, the same answer's first proposal is read
    assert look.propose(16, pace, alone=True) == [] and Lookup(text + jumbled[:6], 3, 16).propose(16, pace)


def test_beside_other_rows_a_sequence_drafts_only_what_its_credit_pays_for():
    assert paid(12, Pace(), alone=True) == 12  # alone: the step's rows are its own
    assert [paid(12, Pace(credit=c), alone=False) for c in (-5, 0, 1, 7, 12, 30)] == [0, 0, 1, 7, 12, 12]


def test_a_watched_proposal_settles_at_its_first_miss_or_once_taken_whole():
    watch = Watch([5, 6, 7])
    assert [watch.see(t) for t in (5, 6)] == [None, None] and watch.see(7) == (3, 3)
    assert Watch([5, 6, 7]).see(9) == (3, 0)
    half = Watch([5, 6, 7, 8])
    assert half.see(5) is None and half.see(6) is None and half.see(0) == (4, 2)
    # settled as a read proposal would be: a whole keep earns credit, a miss loses it
    assert paced(Pace(), *Watch([1, 2]).see(3) or (0, 0), 16).credit == -2


# --- the decoder on real llama.cpp ---------------------------------------------------------------

EDIT = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "class Box:\n    def put(self, x):\n        self.items.append(x)\n" * 2 + "Again:\n")


@pytest.fixture(scope="module")
def random_model():
    return tiny_random_model("llama-spm", seed=3)


def engine(path, spec: bool, **load):
    extra = {"spec_type": "ngram", "spec_ngram_size_n": 3, "spec_ngram_size_m": 8} if spec else {}
    return InProcessEngine(path, **extra, **load)


@pytest.mark.parametrize("prompt", [EDIT, "Hello there, how are you today? " * 4, "x"])
def test_greedy_answers_are_the_same_with_and_without_speculation(random_model, prompt):
    plain, spec = engine(random_model, False), engine(random_model, True)
    want, done = plain.run(prompt, max_tokens=48, logprobs=2)
    want_probs = plain.logprobs
    got, sdone = spec.run(prompt, max_tokens=48, logprobs=2)
    assert got == want and sdone.completion_tokens == done.completion_tokens
    assert [p["token"] for p in spec.logprobs] == [p["token"] for p in want_probs]
    assert done.drafted == 0 and sdone.accepted <= sdone.drafted


def run_sampled(eng, prompt: str, seed: int, temperature: float, n: int = 40) -> str:
    return eng.run(prompt, n, temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed)[0]


def test_sampled_answers_follow_the_targets_distribution(tmp_path):
    """A scripted model that loops " tick tock": its successor's logit is the script's margin above
    every other token's, so at temperature T it comes with probability p = e^(margin/T) / (e^(margin/T)
    + n_vocab - 1), and the answer stays in the loop for a run of p / (1 - p) tokens on average
    (after any other token the model ends). With a seed, each kept token is the chain's own sample
    at its position: the answers are those without speculation, seed for seed; and over many
    seeds the runs with speculation average the target's p / (1 - p)."""
    import math

    model = tm.endless(tmp_path / "loop.gguf").path
    plain, spec = engine(model, False), engine(model, True)
    temperature = 7.0
    odds = math.exp(_MARGIN / temperature)
    p = odds / (odds + spec.model.vocab.n_vocab - 1)
    def run_length(answer: str) -> int:
        """The loop's tokens the answer opens with, before it leaves the loop."""
        n = pos = 0
        while answer.startswith((" tick", " tock")[n % 2], pos):
            pos, n = pos + 5, n + 1
        return n

    pairs = [(run_sampled(plain, "\n", seed, temperature), run_sampled(spec, "\n", seed, temperature))
             for seed in range(30)]
    assert all(a == b for a, b in pairs)
    assert len({a for a, _ in pairs}) > 3  # sampled: the seeds differ
    runs = [run_length(run_sampled(spec, "\n", 1000 + seed, temperature)) for seed in range(240)]
    mean, want = sum(runs) / len(runs), p / (1 - p)
    spread = math.sqrt(p) / (1 - p) / math.sqrt(len(runs))  # the standard error of a geometric mean
    assert abs(mean - want) < 4 * spread, (mean, want, spread)
    assert spec.decoder.slots[0].seq is None


def test_a_repeating_answer_keeps_most_drafts_and_batched_slots_answer_as_alone(tmp_path, random_model):
    model = tm.endless(tmp_path / "loop.gguf").path
    plain, spec = engine(model, False), engine(model, True)
    want, _ = plain.run("\n", max_tokens=60)
    got, done = spec.run("\n", max_tokens=60)
    assert got == want and done.drafted > 20 and done.accepted / done.drafted > 0.8
    # two slots, each speculating beside the other's prompt chunks and drafts
    alone = {p: engine(random_model, False).run(p, max_tokens=32)[0] for p in (EDIT, EDIT.replace("add", "plus"))}
    together = engine(random_model, True, parallel=2).together(list(alone), max_tokens=32)
    assert [text for text, _ in together] == list(alone.values())


def test_a_stop_or_max_tokens_inside_kept_drafts_ends_the_answer_where_it_would_end_without(tmp_path):
    """Drafts are proposed past where the answer ends: a stop string matched inside a kept run
    (or across its edge) and ``max_tokens`` reached inside one end it at the same token, with the
    same count and reason, as without speculation."""
    model = tm.endless(tmp_path / "loop.gguf").path
    plain, spec = engine(model, False), engine(model, True)
    drafted = 0
    for max_tokens in range(1, 21):
        for stop in (None, [" tock tick"], ["ck ti"]):
            (want, wdone), (got, done) = (e.run("\n", max_tokens, stop=stop) for e in (plain, spec))
            assert (got, done.completion_tokens, done.finish_reason, done.stop) == \
                (want, wdone.completion_tokens, wdone.finish_reason, wdone.stop), (max_tokens, stop)
            drafted += done.drafted
    assert drafted > 30


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_scripted_models_answer_the_same_with_either_kind_alone_and_batched(tmp_path, kind):
    """The scripted models (their answer is in their weights): the looping one and the demo's,
    speculating by prompt lookup or with the model as its own draft, one slot and two together."""
    loop, demo = tm.endless(tmp_path / "loop.gguf").path, tm.demo(tmp_path / "demo.gguf").path
    for model in (loop, demo):
        load = {"draft": model, "draft_max": 4} if kind == "draft" else \
            {"spec_type": "ngram", "spec_ngram_size_n": 2, "spec_ngram_size_m": 8}
        kept = kind == "draft" or model == loop  # the demo's answer does not repeat itself: no proposal of it is kept
        want, _ = InProcessEngine(model).run("\n", max_tokens=40)
        got, done = InProcessEngine(model, **load).run("\n", max_tokens=40)
        assert got == want and (done.accepted > 0) == kept
        two = InProcessEngine(model, parallel=2, **load).together(["\n", "\n"], max_tokens=40)
        assert [text for text, _ in two] == [want, want] and all((d.accepted > 0) == kept for _, d in two)


def _drafted_rows(spec: InProcessEngine) -> list[list[tuple[int, int]]]:
    """Each decode step of generating sequences, as (its draft rows, its credit before the step)
    per sequence: recorded where the decoder hands the step to llama.cpp."""
    steps: list[list[tuple[int, int]]] = []
    decode = spec.decoder._decode

    def recording(chunks):
        if all(seq.pending is not None for seq, _, _ in chunks):
            steps.append([(len(part) - 1, seq.pace.credit) for seq, part, _ in chunks])
        return decode(chunks)

    spec.decoder._decode = recording
    return steps


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_batched_sequences_draft_only_what_they_proved_and_a_copy_earns_it_unread(tmp_path, kind):
    """Beside another sequence's rows, a sequence never adds more draft rows than its credit, and
    one that copies earns credit from its watched proposals (no row read), then drafts and keeps."""
    loop = tm.endless(tmp_path / "loop.gguf").path
    load = {"draft": loop, "draft_max": 4} if kind == "draft" else \
        {"spec_type": "ngram", "spec_ngram_size_n": 2, "spec_ngram_size_m": 8}
    spec = InProcessEngine(loop, parallel=2, **load)
    steps = _drafted_rows(spec)
    two = spec.together(["\n", "\n"], max_tokens=40)
    batched = [row for step in steps if len(step) > 1 for row in step]
    assert batched and all(rows <= max(0, credit) for rows, credit in batched)
    assert batched[0][0] == 0 and sum(rows for rows, _ in batched) > 8  # watched first, then drafted
    assert all(d.accepted == d.drafted > 0 for _, d in two)


# --- a draft model -------------------------------------------------------------------------------

def test_a_model_as_its_own_draft_keeps_every_draft_and_answers_the_same(random_model):
    plain = InProcessEngine(random_model)
    own = InProcessEngine(random_model, draft=random_model, draft_max=4)
    for prompt in (EDIT, "Hello there, how are you today? " * 4):
        want, _ = plain.run(prompt, max_tokens=40, logprobs=1)
        got, done = own.run(prompt, max_tokens=40, logprobs=1)
        assert got == want and done.drafted > 20 and done.accepted == done.drafted
    # a second conversation in the same slot: the draft's sequence follows the slot's cache
    got, done = own.run(EDIT.replace("add", "plus"), max_tokens=40)
    assert got == plain.run(EDIT.replace("add", "plus"), max_tokens=40)[0] and done.accepted == done.drafted


def test_an_unsure_draft_proposes_less_and_a_short_one_nothing(random_model):
    """``draft_p_min``: a random model's top probability is far below 0.9, so it proposes
    nothing; ``draft_min`` above ``draft_max`` throws every draft away."""
    for load in ({"draft_p_min": 0.9}, {"draft_max": 2, "draft_min": 3}):
        eng = InProcessEngine(random_model, draft=random_model, **load)
        got, done = eng.run(EDIT, max_tokens=20)
        assert done.drafted == 0 and got == InProcessEngine(random_model).run(EDIT, max_tokens=20)[0]


def test_a_draft_of_another_vocabulary_is_refused_at_load(random_model):
    other = tiny_random_model("qwen2", seed=1)
    with pytest.raises(RuntimeError, match="cannot draft for .*vocabulary"):
        InProcessEngine(random_model, draft=other)


def test_a_grammar_constrains_every_kept_token(tmp_path):
    """The request's grammar is in its sampler chain, which picks each position in order: the
    answer is the one without speculation, and it keeps to the grammar (which cuts the looping
    model's answer short)."""
    model = tm.endless(tmp_path / "loop.gguf").path
    grammar = 'root ::= (" tick" " tock"){3,8}'
    (plain, _), (got, done) = (engine(model, spec).run("\n", 40, grammar=grammar) for spec in (False, True))
    assert plain == got == " tick tock" * 8
    assert done.drafted > 0  # drafts were proposed and judged through the grammar


def test_a_draft_model_drafts_for_batched_slots_each_as_alone(random_model):
    prompts = (EDIT, "Hello there, how are you today? " * 4)
    alone = {p: InProcessEngine(random_model).run(p, max_tokens=24)[0] for p in prompts}
    two = InProcessEngine(random_model, parallel=2, draft=random_model, draft_max=4)
    for p, (text, done) in zip(prompts, two.together(list(prompts), max_tokens=24)):
        assert text == alone[p]
        assert done.drafted > 10 and done.accepted == done.drafted
