"""Pictures and sounds as each wire carries them (``wire.media``, the four parsers): the parts
read into ``protocol.Media`` in prompt order with their markers, the bytes checked (format, size,
pixels) with a 400 naming the part. Pure: the engine's side is ``test_media_engine.py``."""

import base64
import io
import struct
import wave

import pytest
from PIL import Image

from gateway.base.errors import InvalidRequest
from gateway.protocol import GenerationRequest, Media
from gateway.wire import anthropic, ollama, openai, responses
from gateway.wire import media as wm


def picture(fmt: str = "PNG", size: tuple[int, int] = (37, 21), color=(200, 30, 60)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=fmt)
    return out.getvalue()


def tone(seconds: float = 0.25, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", (i * 97) % 2000 - 1000) for i in range(int(seconds * rate))))
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


LIMITS = wm.Limits(pixels=10**6, count=8, total_pixels=10**7, seconds=60)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP"])
def test_sniff_reads_each_picture_format_and_its_size(fmt):
    found = wm.sniff(picture(fmt, (37, 21)))
    assert (found.kind, found.format, found.width, found.height, found.problem) == ("image", fmt, 37, 21, None)


def test_sniff_tells_sounds_and_refuses_the_rest():
    found = wm.sniff(tone())
    assert (found.kind, found.format, found.frames, found.rate) == ("audio", "WAV", 4000, 16000)
    assert wm.sniff(b"ID3\x04\x00\x00\x00\x00\x00\x00rest") is None  # no frame in it: miniaudio opens nothing
    assert wm.sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") is None  # WebP: llama.cpp's stb_image cannot read it
    assert wm.sniff(b"%PDF-1.7") is None and wm.sniff(b"") is None


def test_openai_chat_parts_become_markers_and_media_in_order():
    png, jpg = picture("PNG"), picture("JPEG")
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Compare "},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(png)}"}},
                                     {"type": "text", "text": " with "},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                                     {"type": "input_audio", "input_audio": {"data": b64(jpg), "format": "wav"}}]}]}
    req = openai.parse_chat(body).request
    assert req.messages[1]["content"] == f"Compare {wm.MARKER} with {wm.MARKER}{wm.MARKER}"
    assert [(m.kind, m.param, m.url) for m in req.media] == [
        ("image", "messages[1].content[1]", None),
        ("image", "messages[1].content[3]", "https://example.com/cat.jpg"),
        ("audio", "messages[1].content[4]", None)]
    assert base64.b64decode(req.media[0].data) == png


@pytest.mark.parametrize("part, param, says", [
    ({"type": "image_url", "image_url": {"url": "data:image/png,notbase64"}}, "messages[0].content[0].image_url.url",
     "base64 data: URI"),
    ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "messages[0].content[0].image_url.url",
     "data: URI or an http(s) URL"),
    ({"type": "image_url", "image_url": {}}, "messages[0].content[0].image_url.url", "data: URI"),
    ({"type": "input_audio", "input_audio": "x"}, "messages[0].content[0].input_audio", "object"),
    ({"type": "input_audio", "input_audio": {"format": "wav"}}, "messages[0].content[0].input_audio.data", "base64"),
    ({"type": "file", "file": {}}, "messages[0].content[0].type", "not supported"),
])
def test_openai_bad_parts_are_400s_naming_the_part(part, param, says):
    with pytest.raises(InvalidRequest) as e:
        openai.parse_chat({"model": "m", "messages": [{"role": "user", "content": [part]}]})
    assert e.value.param == param and says in e.value.message and e.value.status == 400


def test_anthropic_image_blocks_and_the_tool_result_note():
    png = picture()
    body = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": b64(png)}},
                                     {"type": "text", "text": "What is this?"}]}]}
    req = anthropic.parse(body).request
    assert req.messages[-1]["content"] == f"{wm.MARKER}What is this?"
    assert [(m.kind, m.param) for m in req.media] == [("image", "messages.0.content.0")]
    with pytest.raises(InvalidRequest) as e:
        anthropic.parse({**body, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})
    assert e.value.param == "messages.0.content.0.source"


def test_ollama_images_go_before_the_text_in_chat_and_generate():
    png = b64(picture())
    req = ollama.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi", "images": [png, png]}]}).request
    assert req.messages[0]["content"] == f"{wm.MARKER}{wm.MARKER}hi"
    assert [m.param for m in req.media] == ["messages[0].images[0]", "messages[0].images[1]"]
    gen = ollama.parse_generate({"model": "m", "prompt": "describe", "images": [png]}).request
    assert gen.messages[-1]["content"] == f"{wm.MARKER}describe" and len(gen.media) == 1
    raw = ollama.parse_generate({"model": "m", "prompt": "describe", "images": [png], "raw": True}).request
    assert raw.prompt == f"{wm.MARKER}describe"
    with pytest.raises(InvalidRequest) as e:
        ollama.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi", "images": "x"}]})
    assert e.value.param == "messages[0].images"


def test_responses_input_image_and_a_file_id():
    png = b64(picture())
    parsed = responses.parse({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "look: "}, {"type": "input_image", "image_url": f"data:image/png;base64,{png}"}]}]})
    assert parsed.request.messages[-1]["content"] == f"look: {wm.MARKER}"
    assert [m.param for m in parsed.request.media] == ["input[0].content[1]"]
    with pytest.raises(InvalidRequest) as e:
        responses.parse({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image",
                                                                              "file_id": "file-1"}]}]})
    assert e.value.param == "input[0].content[0].file_id"


def test_checked_refuses_what_llama_cpp_would_not_read():
    part = Media("image", "messages[0].content[0]")
    png = picture("PNG", (40, 30))
    kept, spent = wm.checked(part, png, LIMITS, wm.Spent())
    assert base64.b64decode(kept.data) == png and kept.size == (40, 30) and spent.pixels == 1200
    kept, _ = wm.checked(Media("image", "t", url="https://x/a.png", note="[note]"), png, LIMITS, wm.Spent())
    assert (kept.note, kept.url, kept.param) == ("[note]", None, "t")  # a tool's picture keeps its note
    with pytest.raises(InvalidRequest) as e:
        wm.checked(part, png, wm.Limits(40 * 30 - 1, 8, 10**7, 60), wm.Spent())
    assert "40x30 pixels" in e.value.message and e.value.param == part.param
    with pytest.raises(InvalidRequest) as e:
        wm.checked(part, b"%PDF-1.7 not a picture", LIMITS, wm.Spent())
    assert "not an image" in e.value.message and e.value.code == "invalid_media"
    with pytest.raises(InvalidRequest) as e:
        wm.checked(part, tone(), LIMITS, wm.Spent())  # a sound sent as a picture
    assert "WAV audio" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        wm.checked(Media("audio", "p"), png, LIMITS, wm.Spent())
    assert "not audio" in e.value.message and "PNG image" in e.value.message


def test_decoded_bounds_bytes_before_and_after_decoding():
    data = picture()
    assert wm.decoded(Media("image", "p", b64(data)), len(data)) == data
    for limit in (len(data) - 1, len(data) // 2):
        with pytest.raises(InvalidRequest) as e:
            wm.decoded(Media("image", "p", b64(data)), limit)
        assert e.value.code == "media_too_large" and "server.max_media_bytes" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        wm.decoded(Media("image", "p", "not*base64"), 100)
    assert "not valid base64" in e.value.message


def test_require_names_the_first_part_a_model_cannot_take():
    req = GenerationRequest(messages=[], media=[Media("image", "a"), Media("audio", "b")])
    wm.require(req, {"vision": True, "audio": True}, "m")
    with pytest.raises(InvalidRequest) as e:
        wm.require(req, {"vision": True}, "m")
    assert e.value.param == "b" and e.value.code == "audio_not_supported"
    with pytest.raises(InvalidRequest) as e:
        wm.require(req, {}, "m")
    assert e.value.param == "a" and "does not take images" in e.value.message


def test_unmarked_tells_a_kept_conversations_media_as_notes():
    kept = wm.unmarked([{"role": "user", "content": f"see {wm.MARKER}"}, {"role": "assistant", "content": "ok"}])
    assert kept[0]["content"] == f"see {wm.KEPT_NOTE}" and kept[1]["content"] == "ok"


def test_tool_pictures_are_told_as_notes_in_their_own_places():
    messages = [{"role": "user", "content": f"a{wm.MARKER}b"},
                {"role": "tool", "content": f"{wm.MARKER}c{wm.MARKER}"}, {"role": "user", "content": "d"}]
    media = [Media("image", "u"), Media("image", "t1", note="[1]"), Media("audio", "t2", note="[2]")]
    req = GenerationRequest(messages=messages, media=media)
    wm.require(req, {"vision": True}, "m")  # the pictures are read, the sound told
    assert [m.param for m in req.media] == ["u", "t1"]
    assert messages[1]["content"] == f"{wm.MARKER}c[2]" and messages[0]["content"] == f"a{wm.MARKER}b"
    req = GenerationRequest(messages=[{"role": "tool", "content": f"{wm.MARKER}x{wm.MARKER}"}],
                            media=[Media("image", "t1", note="[1]"), Media("image", "t2", note="[2]")])
    wm.require(req, {}, "m")
    assert req.messages[0]["content"] == "[1]x[2]" and req.media == []
    raw = GenerationRequest(prompt=f"{wm.MARKER}{wm.MARKER}!", media=[Media("image", "a"), Media("image", "b", note="n")])
    wm.tell(raw, 1)
    assert raw.prompt == f"{wm.MARKER}n!" and [m.param for m in raw.media] == ["a"]
