"""Pictures and sounds against the real `gguf-gateway serve` process: a random-weight model on
llama.cpp's Qwen2 vocabulary with a projector the project writes (``testprojector``: libmtmd's
real encoder graphs, random weights), found beside it by discovery; through the official SDKs
(openai: chat, streamed chat, Responses; anthropic; ollama: chat and generate) with PNG, JPEG
and WAV bytes made here. The media reach the model as tokens (the prompt's count grows by the
picture's; greedy answers change with the picture), a repeated conversation reuses its cached
picture, and bad media get a 400 naming the part while the worker keeps serving."""

import base64
import json
import shutil
import struct
import time
import zlib

import anthropic
import ollama
import openai
import pytest
from helpers import ServerProcess, noise_picture, request, tiny_projector, tiny_random_model, tone_wav

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

N_EMBD = 64  # tiny_random_model's


def noise(seed: int, fmt: str = "PNG") -> bytes:
    return noise_picture(seed, fmt)


def tone(hz: float) -> bytes:
    return tone_wav(hz)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{b64(data)}"


def huge_png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims a size: enough for the pixel check, never decoded."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    for sub, audio in (("vl", False), ("audio", True)):
        (d / sub).mkdir()
        shutil.copy(tiny_random_model("qwen2", seed=1), d / sub / f"{sub}.gguf")  # (a link would be one model)
        (d / sub / f"mmproj-{sub}-f16.gguf").symlink_to(tiny_projector(N_EMBD, audio))
    tm.plain(d / "text.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  models_dirs: [{d}]\n  max_media_bytes: 200000\n  max_media_pixels: 1000000\n"
                   f"  events_path: {d / 'events.jsonl'}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        srv.events = d / "events.jsonl"
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def oc(server):
    with ollama.Client(host=server.url) as c:
        yield c


def ask(client, content, model="vl", max_tokens=8, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=0, **kw)


def picture_part(data: bytes, kind: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": data_uri(data, kind)}}


def test_the_models_say_what_they_take(server, oc):
    status, body = server.get("/v1/models")
    by_id = {m["id"]: m for m in body["data"]}
    assert by_id["vl"]["input_modalities"] == ["text", "image"]
    assert by_id["audio"]["input_modalities"] == ["text", "audio"]
    assert by_id["text"]["input_modalities"] == ["text"]
    status, body = server.get("/models")
    rows = {m["id"]: m for m in body["data"]} if "data" in body else {m["id"]: m for m in body["models"]}
    assert rows["vl"]["media"] == ["image"] and rows["vl"]["mmproj"].endswith("mmproj-vl-f16.gguf")
    show = oc.show("vl")
    assert "vision" in show.capabilities


def test_a_picture_reaches_the_model_as_tokens_through_openai_chat(client, server):
    plain = ask(client, "Describe it.")
    one = ask(client, [{"type": "text", "text": "Describe it."}, picture_part(noise(1))])
    other = ask(client, [{"type": "text", "text": "Describe it."}, picture_part(noise(2, "JPEG"), "image/jpeg")])
    again = ask(client, [{"type": "text", "text": "Describe it."}, picture_part(noise(1))])
    grown = one.usage.prompt_tokens - plain.usage.prompt_tokens
    assert grown >= 16, grown  # the picture's tokens (and mtmd's markers around them)
    assert other.usage.prompt_tokens == one.usage.prompt_tokens  # every picture is resized to the same grid
    assert one.choices[0].message.content != plain.choices[0].message.content
    assert one.choices[0].message.content != other.choices[0].message.content
    assert again.choices[0].message.content == one.choices[0].message.content
    # the same picture at the same place: its cells reused
    assert again.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens - 2
    status, props = server.get("/props?model=vl")
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["media_marker"] == "<__media__>"


def test_a_streamed_answer_matches_the_whole_one(client):
    content = [{"type": "text", "text": "Describe it."}, picture_part(noise(3))]
    whole = ask(client, content).choices[0].message.content
    stream = ask(client, content, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage.prompt_tokens > 16


def test_a_picture_through_anthropic_responses_and_ollama(client, claude, oc):
    picture = noise(4)
    plain = ask(client, "What is this?")
    via_openai = ask(client, [picture_part(picture), {"type": "text", "text": "What is this?"}])
    msg = claude.messages.create(model="vl", max_tokens=8, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(picture)}},
        {"type": "text", "text": "What is this?"}]}])
    # (Anthropic counts the prompt's cached tokens apart: the picture is in the cache by now)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == via_openai.usage.prompt_tokens
    assert msg.usage.cache_read_input_tokens > plain.usage.prompt_tokens
    assert msg.content[0].text == via_openai.choices[0].message.content
    counted = claude.messages.count_tokens(model="vl", messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(picture)}},
        {"type": "text", "text": "What is this?"}]}])
    assert counted.input_tokens == via_openai.usage.prompt_tokens
    resp = client.responses.create(model="vl", max_output_tokens=8, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_uri(picture)}, {"type": "input_text", "text": "What is this?"}]}])
    assert resp.usage.input_tokens == via_openai.usage.prompt_tokens
    assert resp.output_text == via_openai.choices[0].message.content
    chat = oc.chat(model="vl", messages=[{"role": "user", "content": "What is this?", "images": [picture]}],
                   options={"temperature": 0, "num_predict": 8})
    assert chat.prompt_eval_count == via_openai.usage.prompt_tokens
    assert chat.message.content == via_openai.choices[0].message.content
    gen = oc.generate(model="vl", prompt="What is this?", images=[picture], options={"temperature": 0, "num_predict": 8})
    assert gen.prompt_eval_count == via_openai.usage.prompt_tokens and gen.response == chat.message.content


def test_a_sound_reaches_an_audio_model(client):
    plain = ask(client, "Transcribe.", model="audio")
    heard = [ask(client, [{"type": "text", "text": "Transcribe."},
                          {"type": "input_audio", "input_audio": {"data": b64(tone(hz)), "format": "wav"}}],
                 model="audio") for hz in (440, 1200)]
    assert heard[0].usage.prompt_tokens > plain.usage.prompt_tokens + 4
    assert heard[0].choices[0].message.content != plain.choices[0].message.content
    assert heard[0].choices[0].message.content != heard[1].choices[0].message.content


def bad(server, content, model="vl"):
    status, body, _ = request(server.url + "/v1/chat/completions", {
        "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": content}]})
    return status, body.get("error", {})


@pytest.mark.parametrize("part, param, says", [
    (picture_part(noise(5)[:200]), "messages[0].content[1]", "could not be decoded"),  # truncated
    (picture_part(b"GIF89a" + b"\x00" * 40, "image/gif"), "messages[0].content[1]", "0x0 pixels"),
    (picture_part(b"%PDF-1.7 not a picture"), "messages[0].content[1]", "not an image"),
    (picture_part(b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 20), "messages[0].content[1]",
     "not an image"),
    (picture_part(huge_png_header(5000, 5000)), "messages[0].content[1]", "5000x5000 pixels"),
    (picture_part(b"\x89PNG" + b"\x00" * 300000), "messages[0].content[1]", "server.max_media_bytes"),
    ({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}, "messages[0].content[1]",
     "server.allow_remote_media"),
    ({"type": "input_audio", "input_audio": {"data": b64(tone(300)), "format": "wav"}},
     "messages[0].content[1]", "does not take audio"),
])
def test_bad_media_are_400s_naming_the_part_and_the_worker_goes_on(server, client, part, param, says):
    status, error = bad(server, [{"type": "text", "text": "hi"}, part])
    assert status == 400, error
    assert error["param"] == param and says in error["message"], error
    assert ask(client, "still there?").choices[0].finish_reason in ("stop", "length")


def test_a_picture_to_a_text_model_is_refused_in_each_wire(server):
    status, error = bad(server, [{"type": "text", "text": "hi"}, picture_part(noise(6))], model="text")
    assert status == 400 and error["param"] == "messages[0].content[1]"
    assert "does not take images" in error["message"]
    status, body, _ = request(server.url + "/v1/messages", {"model": "text", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": b64(noise(6))}}]}]})
    assert status == 400 and body["type"] == "error" and "does not take images" in body["error"]["message"]
    status, body, _ = request(server.url + "/api/chat", {"model": "text", "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": [b64(noise(6))]}]})
    assert status == 400 and "does not take images" in body["error"]


def test_the_inference_event_counts_the_media(server, client):
    ask(client, [{"type": "text", "text": "two"}, picture_part(noise(7)), picture_part(noise(8))])
    ask(client, "none")
    deadline = time.monotonic() + 120  # only how long before the test fails
    while time.monotonic() < deadline:  # each line is written once its answer has gone out
        events = [json.loads(line) for line in server.events.read_text().splitlines()]
        if events and events[-1]["media"] == {}:
            break
        time.sleep(0.05)
    assert events[-2]["media"] == {"image": 2} and events[-1]["media"] == {}


def test_pictures_read_on_prep_threads_while_another_answer_streams(client):
    """Prompts with pictures are read (and encoded) on the worker's prep threads while a slot
    generates: each answer is the one it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    alone = [ask(client, [{"type": "text", "text": f"Picture {i}"}, picture_part(noise(20 + i))]).choices[0]
             .message.content for i in range(4)]
    with ThreadPoolExecutor(5) as pool:
        long = pool.submit(ask, client, "Tell a long story.", max_tokens=200)
        together = list(pool.map(lambda i: ask(client, [{"type": "text", "text": f"Picture {i}"},
                                                        picture_part(noise(20 + i))]).choices[0].message.content,
                                 range(4)))
        assert long.result().usage.completion_tokens > 0
    assert together == alone


def test_a_picture_by_url_is_fetched_only_where_allowed_and_never_from_loopback_unless_allowed(tmp_path):
    """``server.allow_remote_media``: a picture named by URL is fetched (here from a loopback
    server, which only ``allow_remote_media_private`` reaches) and answers as the same bytes
    sent inline; without the private allowance the same URL is a 400 naming the part."""
    import http.server
    import threading

    picture = noise(9)

    class Pictures(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(picture)))
            self.end_headers()
            self.wfile.write(picture)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/cat.png"
    shutil.copy(tiny_random_model("qwen2", seed=1), tmp_path / "vl.gguf")
    (tmp_path / "mmproj-vl.gguf").symlink_to(tiny_projector(N_EMBD))
    answers = {}
    try:
        for private in (True, False):
            cfg = tmp_path / f"models-{private}.yaml"
            cfg.write_text(f"server:\n  models_dirs: [{tmp_path}]\n  allow_remote_media: true\n"
                           f"  allow_remote_media_private: {str(private).lower()}\n")
            with ServerProcess("--config", str(cfg), env={"HOME": str(tmp_path)}) as srv:
                for key, part in (("url", {"type": "image_url", "image_url": {"url": url}}),
                                  ("inline", picture_part(picture))):
                    answers[private, key] = request(srv.url + "/v1/chat/completions", {
                        "model": "vl", "max_tokens": 6, "temperature": 0,
                        "messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}, part]}]})[:2]
    finally:
        httpd.shutdown()
        httpd.server_close()
    status, body = answers[True, "url"]
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == answers[True, "inline"][1]["choices"][0]["message"]["content"]
    assert body["usage"]["prompt_tokens"] == answers[True, "inline"][1]["usage"]["prompt_tokens"]
    status, body = answers[False, "url"]
    assert status == 400 and body["error"]["param"] == "messages[0].content[1]"
    assert "allow_remote_media_private" in body["error"]["message"]
    assert answers[False, "inline"][0] == 200


def test_a_tool_results_picture_reaches_a_vision_model_and_is_a_note_to_a_text_model(server, claude):
    """Claude Code's Read of a picture: a valid PNG in a tool result is read by the vision model
    (its tokens counted) and told as a note to the text-only one, never refused."""
    def body(model: str) -> dict:
        return {"model": model, "max_tokens": 4, "messages": [
            {"role": "user", "content": "look at a.png"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                               "input": {"file_path": "a.png"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": b64(noise(11))}}]}]}]}

    status, text_answer, _ = request(server.url + "/v1/messages", body("text"))
    assert status == 200, text_answer
    status, seen, _ = request(server.url + "/v1/messages", body("vl"))
    assert status == 200, seen
    blank = body("vl")
    blank["messages"][-1]["content"][0]["content"] = "no picture"
    _, unseen, _ = request(server.url + "/v1/messages", blank)
    counted = lambda a: a["usage"]["input_tokens"] + a["usage"].get("cache_read_input_tokens", 0)  # noqa: E731
    assert counted(seen) >= counted(unseen) + 16 - 4  # the picture's tokens in place of two words
