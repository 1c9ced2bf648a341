"""The prompt cache in host memory (``worker/promptcache.PromptCache``, ``prompt_cache_bytes``): a
slot taken for another conversation keeps its KV state in RAM first, and the conversation that
comes back has it loaded into a slot instead of reading its prompt again.

The engine tests drive the worker's own ``Decoder`` on real llama.cpp in this process; the
gateway tests run real workers. The model is a random-weight llama with a real tokenizer, so a
greedy answer depends on every cached value: a state restored wrong would answer differently."""

import json

import pytest
from helpers import InProcessEngine, bench_conversation, tiny_random_model

from gateway.app import create_app
from gateway.models.config import load_config
from gateway.worker.slots import Slot, choose, common_prefix

# --- slot choice (pure) -------------------------------------------------------------------------


class Kept:
    def __init__(self, tokens, used=0.0, scope=""):
        self.tokens, self.used, self.scope = tokens, used, scope


def slot(sid, cached=(), used=0.0, scope=""):
    s = Slot(sid)
    s.cached, s.last_used, s.scope = list(cached), used, scope
    return s


PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def test_the_longest_shared_prefix_wins_a_slot_before_a_kept_state_of_the_same_length():
    slots = [slot(0, [1, 2, 9], used=1), slot(1, [1, 2, 3, 4, 9], used=2), slot(2)]
    c = choose(slots, [Kept([1, 2, 3, 4, 7])], PROMPT, "", caching=True)
    assert (c.slot.id, c.common, c.kept, c.save) == (1, 4, None, False)


def test_a_kept_state_sharing_more_is_loaded_into_an_empty_slot_else_the_least_recently_used():
    state = Kept([1, 2, 3, 4, 5, 6, 0])
    c = choose([slot(0, [1, 2], used=1), slot(1), slot(2, [9], used=0)], [Kept([1, 2, 3]), state], PROMPT, "", True)
    assert (c.slot.id, c.common, c.kept, c.save) == (1, 6, state, False)
    c = choose([slot(0, [1, 2], used=5), slot(1, [9], used=3)], [state], PROMPT, "", True)
    assert (c.slot.id, c.common, c.kept, c.save) == (1, 6, state, True)  # its own cache is kept first


def test_nothing_shared_takes_an_empty_slot_then_the_least_recently_used_keeping_its_cache():
    c = choose([slot(0, [9, 9], used=1), slot(1)], [], PROMPT, "", True)
    assert (c.slot.id, c.common, c.save) == (1, 0, False)
    c = choose([slot(0, [9, 9], used=4), slot(1, [8], used=2)], [Kept([7])], PROMPT, "", True)
    assert (c.slot.id, c.common, c.kept, c.save) == (1, 0, None, True)


def test_a_shared_opening_takes_an_empty_slot_rather_than_copy_another_conversation_out():
    other = slot(0, [1, 2, 9, 9, 9, 9, 9], used=1)
    c = choose([other, slot(1, used=2)], [], PROMPT, "", True)
    assert (c.slot.id, c.common, c.save) == (1, 0, False)
    c = choose([other, slot(1, [9], used=0)], [], PROMPT, "", True)  # no empty slot: the longest prefix
    assert (c.slot.id, c.common, c.save) == (0, 2, True)


def test_a_slot_whose_cache_the_prompt_mostly_keeps_is_not_copied_first():
    assert choose([slot(0, [1, 2, 3, 4, 5, 6, 0])], [], PROMPT, "", True).save is False  # the same conversation
    assert choose([slot(0, [1, 2, 0, 0, 0, 0, 0])], [], PROMPT, "", True).save is True  # another one, same opening


def test_another_scopes_cache_or_state_is_never_reused():
    c = choose([slot(0, PROMPT, scope="alice")], [Kept(PROMPT, scope="alice")], PROMPT, "bob", True)
    assert (c.common, c.kept, c.save) == (0, None, True)


def test_without_a_cache_the_choice_is_the_old_score():
    # keeping another conversation's long history beats a shared opening of two tokens
    c = choose([slot(0, [1, 2, 9, 9, 9, 9, 9, 9, 9], used=1), slot(1, used=2)], [], PROMPT, "", caching=False)
    assert (c.slot.id, c.common, c.kept, c.save) == (1, 0, None, False)


# --- the engine on real llama.cpp ---------------------------------------------------------------

@pytest.fixture(scope="module")
def random_model():
    return tiny_random_model("llama-spm", seed=3)


def Engine(path, keep: int, parallel: int = 1):
    return InProcessEngine(path, parallel=parallel, prompt_cache_bytes=keep)


TALKS = [f"Conversation {name}: tell me about the {thing} and the storm at night. " * 6
         for name, thing in (("one", "lighthouse keeper"), ("two", "old fisherman"), ("three", "harbour cat"))]


@pytest.fixture(scope="module")
def uncached(random_model):
    """Each conversation's second turn on a fresh engine with no prompt cache."""
    engine = Engine(random_model, keep=0)
    answers = {}
    for talk in TALKS:
        engine.decoder.slots[0].cached = []  # read whole: nothing is reused
        engine.model.ll.llama_memory_seq_rm(engine.model.mem, 0, -1, -1)
        answers[talk] = engine.run(talk + " And then?")
    return answers


def test_a_returning_conversation_is_restored_from_ram_and_answers_as_if_read_whole(random_model, uncached):
    engine = Engine(random_model, keep=64 * 2**20)
    for talk in TALKS:  # three conversations take turns on one slot
        _, done = engine.run(talk)
    assert len(engine.decoder.cache.entries) == 2  # the two slots taken over were kept
    for talk in TALKS:
        answer, done = engine.run(talk + " And then?")
        want, fresh = uncached[talk]
        assert answer == want and done.completion_tokens == fresh.completion_tokens
        # each came back after another took the slot: from RAM, all it shares with its first turn
        shared = common_prefix(engine.tokens(talk), engine.tokens(talk + " And then?"))
        assert (done.cache_source, done.cached_tokens) == ("ram", shared)
        assert fresh.cached_tokens == 0 and fresh.cache_source is None


def test_the_bound_holds_under_many_conversations_the_least_recently_used_dropped(random_model):
    def talk(i):
        return f"Talk number {i} about the sea. " + TALKS[i % 3]

    engine = Engine(random_model, keep=1)
    engine.run(talk(0), max_tokens=3)
    one = engine.model.ll.llama_state_seq_get_size(engine.model.ctx, 0) + 4 * len(engine.decoder.slots[0].cached)
    bound = int(one * 3.5)  # room for three states of this length, not four
    engine = Engine(random_model, keep=bound)
    order = []
    for i in range(8):
        engine.run(talk(i), max_tokens=3)
        order.append(engine.tokens(talk(i)))
        cache = engine.decoder.cache
        assert cache.held <= bound
    kept = [e.tokens for e in cache.entries]
    assert len(kept) == 3
    for e, prompt in zip(kept, order[-4:-1]):  # the three before the one in the slot, oldest first
        assert e[:len(prompt)] == prompt


def test_a_full_cache_never_drops_the_state_it_is_about_to_restore(random_model, uncached):
    """Two conversations take turns on one slot with room for one state: each turn keeps the
    slot's conversation first, and the room made for it must not drop the state about to be
    loaded (it was dropped, and its restore failed: a 500 to the caller)."""
    engine = Engine(random_model, keep=1)
    engine.run(TALKS[0], max_tokens=3)
    one = engine.model.ll.llama_state_seq_get_size(engine.model.ctx, 0) + 4 * len(engine.decoder.slots[0].cached)
    bound = int(one * 1.6)  # room for one state of this length, not two
    engine = Engine(random_model, keep=bound)
    engine.run(TALKS[0])
    engine.run(TALKS[1])  # keeps the first
    for talk in (TALKS[0], TALKS[1], TALKS[0]):
        answer, done = engine.run(talk + " And then?")
        assert (answer, done.completion_tokens) == (uncached[talk][0], uncached[talk][1].completion_tokens)
        shared = common_prefix(engine.tokens(talk), engine.tokens(talk + " And then?"))
        assert (done.cache_source, done.cached_tokens) == ("ram", shared)
        assert engine.decoder.cache.held <= bound and len(engine.decoder.cache.entries) == 1
        engine.run(talk)  # the turn goes back to where the other conversation's state was kept


@pytest.mark.slow
def test_two_conversations_taking_turns_through_a_full_cache_on_the_real_server(random_model, write_config):
    """The same, through the real server and its HTTP API: every turn answers (it was a 500,
    ``list.remove(x): x not in list``, twice in six requests) as a fresh model does."""
    from helpers import ServerProcess, request

    engine = Engine(random_model, keep=1)
    _, done = engine.run(TALKS[0], max_tokens=8)
    one = engine.model.ll.llama_state_seq_get_size(engine.model.ctx, 0) + 4 * len(engine.decoder.slots[0].cached)
    cfg = write_config(f"server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\nmodels:\n"
                       f"  m:\n    path: {random_model}\n    parallel: 1\n    prompt_cache_bytes: {int(one * 1.6)}\n"
                       f"  fresh:\n    path: {random_model}\n    parallel: 1\n    prompt_cache_bytes: 0\n")

    def chat(model, content):
        status, body, _ = request(server.url + "/v1/chat/completions", {
            "model": model, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": content}]})
        assert status == 200, body
        return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens_details"]["cached_tokens"]

    with ServerProcess("--config", str(cfg)) as server:
        want = {talk: chat("fresh", talk)[0] for talk in TALKS[:2]}
        cached = []
        for talk in TALKS[:2] * 3:
            answer, n = chat("m", talk)
            assert answer == want[talk]
            cached.append(n)
        assert all(n > 0 for n in cached[2:])  # from the third turn on each came back from RAM
        code, log = server.stop()
    assert code == 0 and "Traceback" not in log


def test_a_damaged_state_reads_the_prompt_and_answers_right(random_model, uncached):
    engine = Engine(random_model, keep=64 * 2**20)
    engine.run(TALKS[0])
    engine.run(TALKS[1])
    (entry,) = engine.decoder.cache.entries
    entry.data[len(entry.data) // 2] ^= 0xFF
    answer, done = engine.run(TALKS[0] + " And then?")
    assert (answer, done.cached_tokens, done.cache_source) == (uncached[TALKS[0]][0], 0, None)
    assert engine.decoder.cache.entries[0].tokens[:5] == engine.tokens(TALKS[1])[:5]  # TALKS[1] kept in turn


def test_a_state_llama_cpp_refuses_reads_the_prompt_and_answers_right(random_model, uncached):
    """A state of another shape (cut short: llama.cpp refuses it) or whose positions do not
    match its tokens (a token more than it holds) leaves the slot empty."""
    import zlib

    for damage in ("cut", "tokens"):
        engine = Engine(random_model, keep=64 * 2**20)
        engine.run(TALKS[0])
        engine.run(TALKS[1])
        (entry,) = engine.decoder.cache.entries
        if damage == "cut":
            del entry.data[len(entry.data) // 2:]
            entry.check = zlib.crc32(entry.data)
        else:
            entry.tokens.append(entry.tokens[-1])
        answer, done = engine.run(TALKS[0] + " And then?")
        assert (answer, done.cached_tokens, done.cache_source) == (uncached[TALKS[0]][0], 0, None), damage


def test_no_cache_keeps_nothing(random_model):
    engine = Engine(random_model, keep=0)
    assert engine.decoder.cache is None
    engine.run(TALKS[0])
    engine.run(TALKS[1])
    _, done = engine.run(TALKS[0] + " And then?")
    # only the opening the two conversations share, from the slot: the first was not kept
    shared = common_prefix(engine.tokens(TALKS[0]), engine.tokens(TALKS[1]))
    assert 0 < shared < 10 and (done.cached_tokens, done.cache_source) == (shared, "slot")


# --- through the gateway ------------------------------------------------------------------------

async def chat(client, model, content):
    r = await client.post("/v1/chat/completions", json={"model": model, "max_tokens": 8, "temperature": 0,
                                                        "messages": [{"role": "user", "content": content}]})
    body = await r.json()
    assert r.status == 200, body
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("keep", ["64MiB", "0"])
async def test_the_gateway_reports_what_came_back_from_ram(aiohttp_client, write_config, tmp_path, random_model, keep):
    events = tmp_path / "events.jsonl"
    cfg = write_config(f"server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\n"
                       f"  events_path: {events}\nmodels:\n"
                       f"  m:\n    path: {random_model}\n    parallel: 1\n    prompt_cache_bytes: {keep}\n"
                       f"  fresh:\n    path: {random_model}\n    parallel: 1\n    prompt_cache_bytes: 0\n")
    client = await aiohttp_client(create_app(load_config(cfg)))
    for talk in TALKS:
        await chat(client, "m", talk)
    answer, cached = await chat(client, "m", TALKS[0])
    want, fresh_cached = await chat(client, "fresh", TALKS[0])
    assert answer == want and fresh_cached == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    last = [e for e in lines if e["model"] == "m"][-1]
    assert last["cached_tokens"] == cached
    prompt = last["prompt_tokens"]
    if keep == "0":  # today's behaviour: the slot went to the other conversations, only their shared opening is reused
        assert 0 < cached < prompt // 4 and last["cache_source"] == "slot"
    else:  # the whole prompt but its last token (decoded again for fresh logits)
        assert cached == prompt - 1 and last["cache_source"] == "ram"


async def test_a_kept_state_comes_back_for_its_own_key_only(aiohttp_client, write_config, tmp_path, random_model):
    cfg = write_config(f"server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\n"
                       f"  api_keys: {{alice: a-key, bob: b-key}}\n  isolate_cache_by_key: true\n"
                       f"models:\n  m:\n    path: {random_model}\n    parallel: 1\n")
    client = await aiohttp_client(create_app(load_config(cfg)))

    async def cached(key: str) -> int:
        r = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
            "model": "m", "messages": [{"role": "user", "content": TALKS[0]}], "max_tokens": 2, "temperature": 0})
        assert r.status == 200
        return (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached("a-key") == 0
    assert await cached("b-key") == 0  # the same prompt, but alice's cache: read whole (hers kept in RAM)
    assert await cached("a-key") > 0  # hers, from RAM (bob's kept in turn)
    assert await cached("b-key") > 0


async def test_kept_states_are_saved_with_the_slots_at_an_unload_and_come_back_from_disk(
        aiohttp_client, write_config, tmp_path, random_model):
    events = tmp_path / "events.jsonl"
    cfg = write_config(f"server:\n  discover_default_stores: false\n  kv_cache_dir: {tmp_path / 'kv'}\n"
                       f"  events_path: {events}\nmodels:\n  m:\n    path: {random_model}\n    parallel: 1\n")
    client = await aiohttp_client(create_app(load_config(cfg)))
    answers = [(await chat(client, "m", talk))[0] for talk in TALKS[:2]]  # the first kept in RAM, the second in the slot
    assert (await client.post("/models/unload", json={"model": "m"})).status == 200
    saved = sorted(p.name for p in (tmp_path / "kv").glob("*/*"))
    assert saved == ["kept-0.json", "kept-0.state", "slot-0.json", "slot-0.state"]
    returned, _ = await chat(client, "m", TALKS[0])
    again, _ = await chat(client, "m", TALKS[0])  # now from the slot
    assert returned == again == answers[0]
    sources = [(e["cache_source"], e["cached_tokens"] == e["prompt_tokens"] - 1)
               for e in map(json.loads, events.read_text().splitlines())]
    assert sources[-2:] == [("disk", True), ("slot", True)]


def test_a_models_own_bound_else_the_servers_else_llama_servers_default(write_config, monkeypatch):
    from gateway.backends import local
    from gateway.backends.local import load_params
    from gateway.hardware import sysmem

    monkeypatch.setattr(local.sysmem, "read", lambda: sysmem.Memory(total=128 * 2**30, available=64 * 2**30))
    for server, own, want in (("", "", 8 * 2**30), ("  prompt_cache_bytes: 0\n", "", 0),
                              ("  prompt_cache_bytes: 0\n", "    prompt_cache_bytes: 1GiB\n", 2**30)):
        config = load_config(write_config(f"server:\n  discover_default_stores: false\n{server}"
                                          f"models:\n  m:\n    path: m.gguf\n{own}"), check_files=False)
        assert load_params(config.models[0], config.server).prompt_cache_bytes == want
    # a small machine: the default is bound by what is available, a model's own size is not
    monkeypatch.setattr(local.sysmem, "read", lambda: sysmem.Memory(total=8 * 2**30, available=4 * 2**30))
    config = load_config(write_config("models:\n  m:\n    path: m.gguf\n"), check_files=False)
    assert load_params(config.models[0], config.server).prompt_cache_bytes == 2**30
    config = load_config(write_config("models:\n  m:\n    path: m.gguf\n    prompt_cache_bytes: 3GiB\n"),
                         check_files=False)
    assert load_params(config.models[0], config.server).prompt_cache_bytes == 3 * 2**30
    with pytest.raises(Exception, match="models.m.prompt_cache_bytes: must be a size"):
        load_config(write_config("models:\n  m:\n    path: m.gguf\n    prompt_cache_bytes: lots\n"), check_files=False)


@pytest.mark.real
def test_a_sliding_window_model_restores_from_where_its_prompt_ended_or_reads_it_whole(tmp_path):
    """Gemma 3 (sliding-window layers): llama.cpp writes only the window of a sequence's state,
    so a kept state is cut at its prompt's end first: a returning prompt that goes on from there
    (or repeats it: its last token read again) is restored, from RAM or after an unload from
    disk; one that differs inside the window goes on from the latest context checkpoint before
    the difference (taken near the end of its prompt; kept with the state in RAM). Each answers
    as uncached."""
    from realmodel import gemma_path

    from gateway.worker import checkpoints, savedslots

    path = gemma_path()
    words = "river city people market bridge winter summer stone house garden road north light".split()
    talks = [f"Story {i}: " + " ".join(words[(j * 7 + i) % len(words)] for j in range(700)) for i in range(3)]
    returning = [talks[0] + " And what then?", talks[1][:-30] + " changed at the end"]
    fresh = Engine(path, keep=0)
    want = []
    for prompt in returning:
        fresh.decoder.slots[0].cached = []
        fresh.model.ll.llama_memory_seq_rm(fresh.model.mem, 0, -1, -1)
        want.append(fresh.run(prompt, max_tokens=6)[0])
    engine = Engine(path, keep=256 * 2**20)
    assert engine.decoder.n_swa > 0  # the model's window, with swa_full on
    for talk in talks:
        engine.run(talk, max_tokens=6)
    # every position kept: a prompt is read as a cold read is (no stops at marks), and the
    # checkpoints are taken when a slot is kept, by cutting it back
    assert not engine.decoder.slots[0].checkpoints
    n_swa, n_ubatch = engine.decoder.n_swa, engine.decoder.n_ubatch

    def points(n: int) -> list[int]:  # near the prompt's end, and one each window before
        return sorted({*checkpoints.marks(0, n, n_ubatch), *range(n_swa, n, n_swa)})
    assert [[c.n_tokens for c in e.checkpoints] for e in engine.decoder.cache.entries] == \
        [points(len(engine.tokens(t))) for t in talks[:2]]
    assert all(len(e.checkpoints) > 2 for e in engine.decoder.cache.entries)
    answer, done = engine.run(returning[0], max_tokens=6)
    shared = common_prefix(engine.tokens(talks[0]), engine.tokens(returning[0]))
    assert (answer, done.cache_source, done.cached_tokens) == (want[0], "ram", shared)
    answer, done = engine.run(returning[1], max_tokens=6)
    differs = common_prefix(engine.tokens(talks[1]), engine.tokens(returning[1]))
    mark = max(m for m in points(len(engine.tokens(talks[1]))) if m <= differs)
    assert differs - mark > 4  # a checkpoint well before the difference: the window there is not the state's
    assert (answer, done.cache_source, done.cached_tokens) == (want[1], "ram", mark)

    # the kept states and the slot saved as at an unload, and loaded by the next worker
    savedslots.save(engine.model, engine.decoder.slots, str(tmp_path), 2**30, engine.decoder.cache.entries)
    again = Engine(path, keep=256 * 2**20)
    assert savedslots.restore(again.model, again.decoder.slots, str(tmp_path), again.decoder.cache)[0] == 1
    # the kept states come back with their checkpoints, byte for byte
    def checkpoints_of(cache):
        return sorted((e.tokens[:8], [(c.n_tokens, bytes(c.data)) for c in e.checkpoints]) for e in cache.entries)
    assert checkpoints_of(again.decoder.cache) == checkpoints_of(engine.decoder.cache)
    # the one a returning prompt was read into holds only the windows it read (not those of the state
    # it was loaded from, which held only its last window): it has no checkpoint before that
    assert sorted(len(e.checkpoints) for e in again.decoder.cache.entries) == [1, 3]
    # the first comes back from a kept state read from disk (its last token read again: its
    # prompt repeats the one kept); the second was in the slot, kept in RAM when the first took it
    for prompt, answer_was, source in zip(returning, want, ("disk", "ram")):
        answer, done = again.run(prompt, max_tokens=6)
        n = len(again.tokens(prompt))
        assert (answer, done.cache_source, done.cached_tokens) == (answer_was, source, n - 1)


def test_the_default_bound_is_at_most_a_quarter_of_the_memory_available():
    from gateway.backends.local import default_prompt_cache

    GiB = 2**30
    assert default_prompt_cache(8 * GiB, 64 * GiB) == 8 * GiB  # llama-server's default where there is room
    assert default_prompt_cache(8 * GiB, 8 * GiB) == 2 * GiB
    assert default_prompt_cache(8 * GiB, None) == 8 * GiB  # memory unknown: the setting


async def test_a_full_prompt_cache_is_trimmed_to_make_room_not_its_model_unloaded(
        aiohttp_client, write_config, random_model):
    """The cache counts in its model's RAM (``server.memory_budget`` covers it) but is reclaimed
    first: a budget that holds both models only without most of the first's cache trims that
    cache (the worker reports the bytes it holds), and the first model stays loaded."""
    from dataclasses import replace

    from gateway.api.appkeys import REGISTRY
    from gateway.hardware.sysmem import RAM

    cfg = write_config(f"server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\n"
                       f"  max_loaded_models: 0\nmodels:\n"
                       f"  a:\n    path: {random_model}\n    parallel: 1\n    prompt_cache_bytes: 64MiB\n"
                       f"  b:\n    path: {random_model}\n    parallel: 1\n    prompt_cache_bytes: 0\n")
    app = create_app(load_config(cfg))
    client = await aiohttp_client(app)
    for talk in TALKS:  # three conversations over one slot: the first two kept in RAM
        await chat(client, "a", talk)
    registry = app[REGISTRY]
    a = registry.supervisor(await registry.lookup("a"))
    worker = a.backend
    cached = worker.cache_bytes
    assert cached > 0 and await worker.trim_cache(cached) == cached  # as reported; nothing to drop
    need = registry.placer.need(await registry.lookup("b"))[RAM]
    budget = registry.placer.held(a)[RAM] + need + cached // 2
    server = replace(registry.config.server, memory_budget={RAM: budget})
    registry.config = replace(registry.config, server=server)

    await chat(client, "b", TALKS[0])
    states = {m["id"]: m["state"] for m in (await (await client.get("/models")).json())["data"]}
    assert states == {"a": "ready", "b": "ready"} and a.backend is worker  # not unloaded, not reloaded
    assert worker.cache_bytes <= cached // 2  # trimmed as far as needed, the least recently used first
    assert await worker.trim_cache(cached) == worker.cache_bytes  # what the worker holds now
    assert await worker.trim_cache(0) == 0


def test_a_prompt_chunk_ends_where_a_cold_read_of_the_whole_prompt_splits_it():
    from gateway.worker.slots import chunk_end

    assert chunk_end(0, 512, 512) == 512
    assert chunk_end(13, 512, 512) == 512  # read on from a cached prefix: up to the cold read's boundary
    assert chunk_end(512, 512, 512) == 1024
    assert chunk_end(13, 512, 128) == 512  # several micro-batches, each where the cold read has one
    assert chunk_end(130, 512, 128) == 640
    assert chunk_end(5, 8, 16) == 13  # no boundary within a batch: a whole batch


def first_turn(name: str) -> str:
    """A first turn of ``bench.py --conversations`` (one whose greedy answer flipped)."""
    return bench_conversation(name).next_prompt()


@pytest.mark.real
@pytest.mark.parametrize("before", ["warm up: the city by the river", "round 0 conversation 0"])
def test_a_prompt_read_on_from_a_cached_prefix_answers_bit_for_bit_as_a_cold_read(before):
    """A slot holding another prompt's first token (a warm-up's), or another long prompt that
    shares an opening: the rest of the prompt is read in the micro-batches a cold read of the
    whole prompt has, so its first answer token's log-probabilities are the cold read's to the
    last bit (read in chunks counted from where the prefix ends, they were not, and a greedy
    answer flipped on Gemma 3). (A prefix that an earlier read split otherwise, a short prompt's
    or the tokens a turn generated one at a time, keeps its own last bits.)"""
    from realmodel import gemma_path

    path = gemma_path()
    prompt = first_turn("round 0 conversation 1")
    want = InProcessEngine(path, n_ctx=4096).first_token(prompt)
    engine = InProcessEngine(path, n_ctx=4096)
    engine.run(before if before.startswith("warm") else first_turn(before), max_tokens=2)
    assert engine.first_token(prompt) == want
    assert engine.last_done.cached_tokens > 0
