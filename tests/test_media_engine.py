"""Pictures and sounds in the worker (``worker/media``), driven in this process on real
llama.cpp and libmtmd: a random-weight model on llama.cpp's Qwen2 vocabulary with a projector of
random weights (``testprojector``), so an answer depends on every cached value and on the
picture's pixels. A prompt whose picture comes from a slot's cache or the prompt cache answers as
a cold read; a cached prefix is kept to whole pictures; bad media and mismatched markers are
refusals naming the part."""

import base64
import ctypes

import pytest
from helpers import InProcessEngine, noise_picture, tiny_projector, tiny_random_model

from gateway import protocol
from gateway.models import testprojector
from gateway.worker import media
from gateway.worker.model import Model
from gateway.worker.prompts import Prompts
from gateway.worker.refusals import Refused

MARKER = "<__media__>"


def noise(seed: int) -> str:
    return base64.b64encode(noise_picture(seed)).decode()


@pytest.fixture(scope="module")
def files():
    return tiny_random_model("qwen2", seed=1), tiny_projector(64)


class Engine(InProcessEngine):
    """``InProcessEngine`` with a projector: prompts read by the worker's ``Prompts``."""

    def __init__(self, files, **load):
        super().__init__(files[0], mmproj=files[1], **load)
        self.prompts = Prompts(self.model)

    def ask(self, text: str, pictures: list[str], max_tokens: int = 8):
        self.rid += 1
        req = protocol.GenerationRequest(prompt=text, max_tokens=max_tokens, temperature=0,
                                    media=[protocol.Media("image", f"p{i}", data) for i, data in enumerate(pictures)])
        prompt = self.prompts.prepare(req)
        seq = self.decoder.admit(self.rid, req, prompt.tokens, prompt.tail, prompt.runs)
        while seq.slot.seq is seq:
            self.decoder.step()
        events = [protocol.decode_event(f[4:]) for f in self.out.frames]
        self.out.frames.clear()
        (done,) = [e for e in events if isinstance(e, protocol.Done) and e.id == self.rid]
        errors = [e for e in events if isinstance(e, protocol.Error)]
        assert not errors, errors
        return "".join(e.text for e in events if isinstance(e, protocol.Text) and e.id == self.rid), done, prompt


def talk(n: int) -> str:
    return f"Conversation {n}: here is a picture {MARKER} of the harbour at night. What do you see? "


def test_a_picture_from_the_slot_or_the_prompt_cache_answers_as_a_cold_read(files):
    cold = {n: Engine(files).ask(talk(n) + "And then?", [noise(n)]) for n in (1, 2)}
    engine = Engine(files, prompt_cache_bytes=64 * 2**20)
    for n in (1, 2):  # the second conversation takes the slot: the first is kept in RAM
        engine.ask(talk(n), [noise(n)])
    for n in (2, 1):
        answer, done, prompt = engine.ask(talk(n) + "And then?", [noise(n)])
        assert answer == cold[n][0]
        (run,) = prompt.runs.values()
        assert done.cached_tokens > run.start + run.n_pos  # the picture came from the cache
        assert done.cache_source == ("slot" if n == 2 else "ram")


def test_another_picture_at_the_same_place_is_read_from_its_start(files):
    engine = Engine(files)
    engine.ask(talk(1), [noise(1)])
    answer, done, prompt = engine.ask(talk(1), [noise(3)])
    (run,) = prompt.runs.values()
    assert done.cached_tokens == run.start  # the text before it, not one of its positions
    assert answer == Engine(files).ask(talk(1), [noise(3)])[0]


def test_a_cache_cut_inside_a_picture_goes_back_to_its_start(files):
    engine = Engine(files)
    _, _, prompt = engine.ask(talk(1), [noise(1)])
    (run,) = prompt.runs.values()
    slot = engine.decoder.slots[0]
    cut = run.start + run.n_pos // 2  # as a checkpoint or a kept state inside the picture would leave it
    engine.model.ll.llama_memory_seq_rm(engine.model.mem, slot.id, cut, -1)
    slot.keep(cut)
    answer, done, _ = engine.ask(talk(1) + "More?", [noise(1)])
    assert done.cached_tokens == run.start
    assert answer == Engine(files).ask(talk(1) + "More?", [noise(1)])[0]


def test_floor_and_next_start_are_whole_runs():
    runs = {3: media.Run(3, 4, 4, "image", b"k", None), 10: media.Run(10, 2, 2, "audio", b"j", None)}
    assert [media.floor(runs, p) for p in (0, 3, 4, 6, 7, 11, 12)] == [0, 3, 3, 3, 7, 10, 12]
    assert [media.next_start(runs, p, 20) for p in (0, 3, 4, 10, 11)] == [3, 3, 10, 10, 20]
    a, b = media.stand_ins(b"k", 4), media.stand_ins(b"j", 4)
    assert all(t < 0 for t in a) and len(set(a)) == 4 and a != b and a == media.stand_ins(b"k", 4)


def test_a_picture_met_again_is_not_encoded_again(files):
    engine = Engine(files)
    prompts, projector = engine.prompts, engine.model.projector
    first = prompts.prepare(protocol.GenerationRequest(prompt=f"a {MARKER} b", media=[protocol.Media("image", "p", noise(5))]))
    again = prompts.prepare(protocol.GenerationRequest(prompt=f"c {MARKER} d", media=[protocol.Media("image", "p", noise(5))]))
    (one,), (two,) = first.runs.values(), again.runs.values()
    assert one.embd is two.embd and one.key == two.key and one.tokens == two.tokens
    counted = prompts.tokens(protocol.PromptRequest(prompt=f"c {MARKER} d", media=[protocol.Media("image", "p", noise(5))]))
    assert counted.tokens == again.tokens and counted.runs is None  # counted, not kept
    projector.free(first.runs)
    projector.free(again.runs)


@pytest.mark.parametrize("prompt, pictures, param, says", [
    (f"two {MARKER} markers {MARKER}", 1, "p0", "2 media markers for 1"),
    ("no marker", 1, "p0", "0 media markers for 1"),
    (f"ends with {MARKER}", 1, "p0", "cannot end with a picture"),
])
def test_markers_that_do_not_match_the_media_are_refused(files, prompt, pictures, param, says):
    engine = Engine(files)
    req = protocol.GenerationRequest(prompt=prompt, media=[protocol.Media("image", f"p{i}", noise(i)) for i in range(pictures)])
    with pytest.raises(Refused) as e:
        engine.prompts.prepare(req)
    assert e.value.status == 400 and e.value.param == param and says in e.value.message


def test_bytes_llama_cpp_cannot_decode_and_a_sound_as_a_picture_are_refused(files):
    engine = Engine(files)
    for data, says in ((base64.b64decode(noise(1))[:100], "could not be decoded"), (b"garbage" * 10, "could not be")):
        req = protocol.GenerationRequest(prompt=f"{MARKER}?", media=[protocol.Media("image", "m[0]", base64.b64encode(data).decode())])
        with pytest.raises(Refused) as e:
            engine.prompts.prepare(req)
        assert e.value.param == "m[0]" and says in e.value.message
    with pytest.raises(Refused) as e:
        engine.prompts.prepare(protocol.GenerationRequest(prompt=f"{MARKER}?", media=[protocol.Media("audio", "a", noise(1))]))
    assert e.value.status == 400 and "does not take audio" in e.value.message


def test_a_projector_made_for_another_model_fails_the_load_unless_discovery_paired_it(files, tmp_path):
    wrong = testprojector.write_random_projector(tmp_path / "mmproj-32.gguf", 32)
    params = dict(name="m", path=str(files[0]), parallel=1, n_ctx=256, prompt_cache_bytes=0, mmproj=wrong)
    with pytest.raises(RuntimeError, match="could not load the projector"):
        Model(protocol.LoadParams(**params))
    model = Model(protocol.LoadParams(**params, mmproj_optional=True))
    assert model.projector is None and model.info()["vision"] is False


def test_the_projector_counts_in_what_the_model_holds(files):
    info = Engine(files).model.info()
    assert info["vision"] is True and info["audio"] is False
    assert info["buffers"]["projector"]["cpu"] >= files[1].stat().st_size // 2  # its weights, as libmtmd told them


def sized(seed: int, size: tuple[int, int] = (48, 40), param: str = "p") -> protocol.Media:
    """A picture as the gateway hands it on: with the size its header says."""
    return protocol.Media("image", param, noise(seed), size=size)


class Bitmaps:
    """libmtmd's decoder and bitmap free, watched: how many decoded (not placeholder) bitmaps
    are alive at once, and how many were made."""

    def __init__(self, projector, monkeypatch):
        mt = projector.mt
        self.alive, self.most, self.made = set(), 0, 0
        make, free = mt.mtmd_helper_bitmap_init_from_buf_wrapper, mt.mtmd_bitmap_free

        def made(ctx, buf, n, placeholder, opt):
            out = make(ctx, buf, n, placeholder, opt)
            if out.bitmap and not placeholder:
                self.made += 1
                self.alive.add(ctypes.cast(out.bitmap, ctypes.c_void_p).value)
                self.most = max(self.most, len(self.alive))
            return out

        def freed(bitmap):
            self.alive.discard(ctypes.cast(bitmap, ctypes.c_void_p).value)
            free(bitmap)

        monkeypatch.setattr(mt, "mtmd_helper_bitmap_init_from_buf_wrapper", made)
        monkeypatch.setattr(mt, "mtmd_bitmap_free", freed)


def test_pictures_are_counted_from_their_size_and_decoded_one_at_a_time(files, monkeypatch):
    engine = Engine(files)
    watch = Bitmaps(engine.model.projector, monkeypatch)
    text = f"one {MARKER} two {MARKER} three {MARKER} and?"
    counted = engine.prompts.tokens(protocol.PromptRequest(prompt=text, media=[sized(i) for i in range(3)]))
    assert watch.made == 0  # a count decodes nothing
    prompt = engine.prompts.prepare(protocol.GenerationRequest(prompt=text, media=[sized(i) for i in range(3)]))
    assert prompt.tokens == counted.tokens and all(run.embd is not None for run in prompt.runs.values())
    assert watch.made == 3 and watch.most == 1 and not watch.alive
    unsized = engine.prompts.prepare(protocol.GenerationRequest(prompt=text, media=[sized(i, (0, 0)) for i in range(3)]))
    assert unsized.tokens == prompt.tokens  # (sized by decoding where the gateway gave no size)
    engine.model.projector.free(prompt.runs)
    engine.model.projector.free(unsized.runs)


def test_a_prompt_too_long_for_the_context_is_refused_before_any_picture_is_decoded(files, monkeypatch):
    engine = Engine(files, n_ctx=256)
    watch = Bitmaps(engine.model.projector, monkeypatch)
    n = engine.model.n_ctx // 16  # sixteen tokens a picture
    req = protocol.GenerationRequest(prompt=f"{MARKER} " * n + "describe", max_tokens=8, media=[sized(i) for i in range(n)])
    with pytest.raises(Refused) as e:
        engine.prompts.prepare(req)
    assert e.value.code == "context_length_exceeded" and watch.made == 0


def test_a_picture_that_is_not_the_size_its_header_said_is_refused_unencoded(files):
    engine = Engine(files)
    req = protocol.GenerationRequest(prompt=f"look {MARKER} now", media=[sized(1, (48, 41), "messages[0].content[1]")])
    with pytest.raises(Refused) as e:
        engine.prompts.prepare(req)
    assert e.value.status == 400 and e.value.param == "messages[0].content[1]"
    assert "decodes to 48x40 pixels, not the 48x41" in e.value.message
    assert engine.ask(talk(1), [noise(1)])[0]  # the worker goes on


def test_a_sound_longer_than_its_header_said_is_refused(files):
    import hostile_media

    engine = Engine((files[0], tiny_projector(64, audio=True)))
    data = base64.b64encode(hostile_media.silent_mp3(2)).decode()
    req = protocol.GenerationRequest(prompt=f"hear {MARKER} this", media=[protocol.Media("audio", "a", data, size=(576, 8000))])
    with pytest.raises(Refused) as e:
        engine.prompts.prepare(req)
    assert e.value.param == "a" and "more than its header says" in e.value.message


def test_the_encoded_pictures_are_kept_per_cache_scope_and_bounded_by_bytes(files):
    engine = Engine(files)
    prompts = engine.prompts

    def encoded(scope: str):
        prompt = prompts.prepare(protocol.GenerationRequest(prompt=f"a {MARKER} b", media=[sized(5)], cache_scope=scope))
        (run,) = prompt.runs.values()
        engine.model.projector.free(prompt.runs)
        return run.embd

    alice = encoded("alice")
    assert encoded("alice") is alice  # reused within its scope
    assert encoded("bob") is not alice  # another key's picture is encoded afresh: no timing to tell it
    kept = media.EmbeddingCache(max_bytes=3 * ctypes.sizeof(alice))
    for i in range(5):
        kept.put("", bytes([i]), alice)
    assert kept.bytes == 3 * ctypes.sizeof(alice) and [k for _, k in kept.entries] == [b"\x02", b"\x03", b"\x04"]
    kept.put("", b"big", (ctypes.c_float * (len(alice) * 4))())
    assert (("", b"big") not in kept.entries) and kept.get("", b"\x04", len(alice)) is alice


def test_a_sound_too_long_for_the_context_is_refused_before_it_is_encoded(files, monkeypatch):
    """A sound's tokens are counted from its samples (mtmd_tokenize makes its mel spectrogram,
    it never runs the encoder): a prompt too long for the context is refused unencoded."""
    import hostile_media

    from gateway.wire.mediasize import sniff

    engine = Engine((files[0], tiny_projector(64, audio=True)), n_ctx=512)
    projector = engine.model.projector
    encoded = []
    encode = projector.mt.mtmd_encode_chunk
    monkeypatch.setattr(projector.mt, "mtmd_encode_chunk", lambda ctx, chunk: encoded.append(chunk) or encode(ctx, chunk))
    sound = hostile_media.silent_mp3(2)
    header = sniff(sound)
    req = protocol.GenerationRequest(prompt=f"hear {MARKER} this", max_tokens=8, media=[
        protocol.Media("audio", "a", base64.b64encode(sound).decode(), size=(header.frames, header.rate))])
    with pytest.raises(Refused) as e:  # one window of 750 tokens in a context of 512
        engine.prompts.prepare(req)
    assert e.value.code == "context_length_exceeded" and encoded == []
