"""Hostile pictures and sounds against the real `gguf-gateway serve` process (issue 50, items 5
to 7): each is a 400 naming its part, refused from its header before the worker decodes it, and
the worker's peak memory (VmHWM in /proc, reset before each request) shows it; legal media are
decoded one at a time; the worker answers the next request. The files are made byte by byte
(``hostile_media``): a 141-byte JPEG claiming 16000x16000 behind a padding byte, a PNG whose
CgBI chunk comes before IHDR, an MP3 of silence at 8 kbit/s, a 2 kB MP3 whose Xing header claims
hours."""

from __future__ import annotations

import base64
import io
import shutil
import time
from pathlib import Path

import hostile_media as h
import pytest
from helpers import ServerProcess, request, tiny_projector, tiny_random_model
from hostile_upstream import peak_rss, reset_peak
from PIL import Image

pytestmark = pytest.mark.slow

MiB = 2**20


def worker_pids(server: ServerProcess) -> list[int]:
    """The server's child processes (its workers: the config keeps no spare)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == server.proc.pid:
                    out.append(int(proc.name))
            except (OSError, ValueError):
                pass
    return out


class Peak:
    """The workers' peak resident memory over a block, above where each stood at its start."""

    def __init__(self, server: ServerProcess):
        self.server = server

    def __enter__(self) -> Peak:
        self.pids = worker_pids(self.server)
        assert self.pids
        self.base = {pid: reset_peak(pid) for pid in self.pids}  # VmHWM back to VmRSS
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self.started
        self.bytes = max(peak_rss(pid) - self.base[pid] for pid in self.pids)


def serve(tmp_path: Path, **server) -> ServerProcess:
    for sub, audio in (("vl", False), ("audio", True)):
        (tmp_path / sub).mkdir(exist_ok=True)
        shutil.copy(tiny_random_model("qwen2", seed=1), tmp_path / sub / f"{sub}.gguf")
        if not (tmp_path / sub / f"mmproj-{sub}-f16.gguf").exists():
            (tmp_path / sub / f"mmproj-{sub}-f16.gguf").symlink_to(tiny_projector(64, audio))
    settings = {"models_dirs": f"[{tmp_path}]", "spare_worker": "false", "max_body_bytes": 64 * MiB, **server}
    cfg = tmp_path / "models.yaml"
    cfg.write_text("server:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items()))
    return ServerProcess("--config", str(cfg), env={"HOME": str(tmp_path)})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def picture(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(data)}}


def sound(data: bytes) -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": "mp3"}}


def ask(server: ServerProcess, model: str, parts: list[dict]) -> tuple[int, dict]:
    status, body, _ = request(server.url + "/v1/chat/completions", {
        "model": model, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, *parts]}]}, timeout=300)
    return status, body


def answers(server: ServerProcess, model: str) -> bool:
    return ask(server, model, [])[0] == 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("bounds"), max_media_pixels=1_000_000, max_media_per_request=4,
               max_media_pixels_per_request=1_500_000, max_media_seconds_per_request=60) as srv:
        for model in ("vl", "audio"):  # both loaded: their workers measured from here on
            assert answers(srv, model)
        yield srv


@pytest.mark.parametrize("data, says", [
    (h.jpeg(16000, 16000, padding=b"\x00"), "16000x16000 pixels"),  # 141 bytes: 768 MB of RGB
    (h.jpeg(16000, 16000, fill=2, app=b"x" * 30), "16000x16000 pixels"),
    (h.png(6000, 5000, cgbi=True), "6000x5000 pixels"),  # Apple's CgBI chunk before IHDR
    (h.png(64, 64, before_ihdr=[b"tEXt"]), "no size"),  # stb_image fails it: nothing to size
    (b"P6\n30000 30000\n255\n" + b"\x00" * 100, "no size"),  # a PNM stb_image would read: never sized here
])
def test_a_picture_whose_header_claims_too_much_or_nothing_is_refused_undecoded(server, data, says):
    with Peak(server) as peak:
        status, body = ask(server, "vl", [picture(data)])
    assert status == 400, body
    assert body["error"]["param"] == "messages[0].content[1]" and says in body["error"]["message"], body
    assert peak.bytes < 16 * MiB, peak.bytes  # (before: the padded JPEG cost the worker 1.47 GiB)
    assert answers(server, "vl")


def test_a_request_is_bounded_in_media_and_pixels(server):
    small = [picture(h.png(100, 100)) for _ in range(5)]
    status, body = ask(server, "vl", small)
    assert status == 400 and body["error"]["param"] == "messages[0].content[5]", body  # the fifth part
    assert "server.max_media_per_request" in body["error"]["message"]
    big = [picture(h.png(1000, 1000)), picture(h.png(800, 700))]  # 1.56 million pixels together
    status, body = ask(server, "vl", big)
    assert status == 400 and body["error"]["param"] == "messages[0].content[2]", body
    assert "server.max_media_pixels_per_request" in body["error"]["message"]
    assert ask(server, "vl", big[:1] + small[:3])[0] == 200


@pytest.mark.parametrize("data, says", [
    (h.silent_mp3(1000), "more than 60 seconds"),  # 1 MB of silence at 8 kbit/s: 17 minutes
    (h.xing_mp3(0x8000), "more than 60 seconds"),  # 2 kB claiming 32,768 frames: 14 minutes
    (h.flac(10**9, 1), "more than 60 seconds"),  # a STREAMINFO claiming 17 hours
    (h.wav(100, rate=1), "more than 60 seconds"),  # 100 frames at 1 Hz: resampled, 1.6 million samples
])
def test_a_sound_longer_than_the_request_takes_is_refused_from_its_header(server, data, says):
    with Peak(server) as peak:
        status, body = ask(server, "audio", [sound(data)])
    assert status == 400, body
    assert body["error"]["param"] == "messages[0].content[1]" and says in body["error"]["message"], body
    assert peak.bytes < 16 * MiB and peak.seconds < 5, (peak.bytes, peak.seconds)  # (before: seconds and 150+ MiB)
    assert answers(server, "audio")


def test_sounds_within_the_bound_are_heard_and_together_they_are_bounded(server):
    status, body = ask(server, "audio", [sound(h.silent_mp3(20))])
    assert status == 200 and body["usage"]["prompt_tokens"] > 750, body  # one window of the projector's
    status, body = ask(server, "audio", [sound(h.silent_mp3(35)), sound(h.silent_mp3(35))])
    assert status == 400 and body["error"]["param"] == "messages[0].content[2]", body
    assert "server.max_media_seconds_per_request" in body["error"]["message"]


def huge_picture(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (7680, 4320), (seed, 255 - seed, 0)).save(out, format="PNG")
    return out.getvalue()


def test_legal_pictures_are_decoded_one_at_a_time(tmp_path):
    """Six legal 7680x4320 PNGs (600 kB of JSON): the worker holds one decoded picture at a time
    (stb_image's pixels and libmtmd's copy, about 95 MiB each), not six."""
    pictures = [picture(huge_picture(10 * i)) for i in range(6)]
    one = 7680 * 4320 * 3
    with serve(tmp_path) as srv:
        assert answers(srv, "vl")
        with Peak(srv) as peak:
            status, body = ask(srv, "vl", pictures)
        assert status == 200, body
        assert peak.bytes < 3 * one, peak.bytes  # (before: 16 such pictures cost 1.6 GiB, four 475 MiB)
        assert answers(srv, "vl")
