"""The sizes a picture or sound will decode to, read from its header (``wire.mediasize``) the way
llama.cpp's decoders read them, and the request's bounds on them (``wire.media.checked``).

The readers are compared with libmtmd itself (``mtmd_helper_bitmap_init_from_buf``: stb_image
and miniaudio, in this process) over files made here and many variants of them: padding, fill
bytes, chunk orders, other header forms, truncations and flipped header bytes. Wherever the
reader gives a size and the decoder decodes, the two are the same; a file the reader cannot
size is refused (never decoded), whatever the decoder would have made of it."""

from __future__ import annotations

import ctypes
import io
import random
import struct
import wave
from collections.abc import Iterator

import hostile_media as h
import numpy as np
import pytest
from helpers import REPO, noise_picture, tiny_projector, tiny_random_model
from PIL import Image

from gateway.base.errors import InvalidRequest
from gateway.models import testmodels as tm
from gateway.protocol import Media
from gateway.wire import media as wm
from gateway.wire.mediasize import sniff
from gateway.worker import media as engine_media

LIMITS = wm.Limits(pixels=10**6, count=3, total_pixels=2 * 10**6, seconds=60)


def picture(fmt: str, size: tuple[int, int] = (37, 21), **save) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(size[0]).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(
        out, format=fmt, **save)
    return out.getvalue()


def tone(seconds: float = 0.5, rate: int = 16000, channels: int = 1, width: int = 2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(bytes((i * 7) % 251 for i in range(int(seconds * rate) * channels * width)))
    return out.getvalue()


# --- pictures --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, save", [("PNG", {}), ("PNG", {"optimize": True}), ("JPEG", {}),
                                       ("JPEG", {"progressive": True}), ("GIF", {}), ("BMP", {})])
def test_each_picture_format_is_sized_by_its_header(fmt, save):
    for size in ((1, 1), (37, 21), (640, 3)):
        found = sniff(picture(fmt, size, **save))
        assert (found.kind, found.format, found.width, found.height, found.problem) == ("image", fmt, *size, None)


def test_jpeg_padding_fill_bytes_and_segments_are_walked_as_stb_image_walks_them():
    for data in (h.jpeg(16000, 16000, padding=b"\x00"), h.jpeg(16000, 16000, padding=b"junk" * 100),
                 h.jpeg(16000, 16000, fill=3), h.jpeg(16000, 16000, progressive=True, app=b"Exif\x00\x00" * 50)):
        assert (sniff(data).width, sniff(data).height, sniff(data).problem) == (16000, 16000, None)
    # a segment stb_image does not know (SOF3, lossless) before the frame header: it fails there
    bad = h.jpeg(100, 100).replace(b"\xff\xc0", b"\xff\xc3", 1)
    assert sniff(bad).problem and "marker 0xc3" in sniff(bad).problem
    assert sniff(b"\xff\xd8" + b"\x00" * 100).problem == "no marker where stb_image expects one"
    assert sniff(h.jpeg(100, 100)[:71] + b"\x00" * 3).problem == "no frame header"  # SOI, DQT, padding, the end


def test_png_cgbi_before_ihdr_is_read_and_any_other_chunk_first_is_refused():
    assert (sniff(h.png(6000, 5000, cgbi=True)).width, sniff(h.png(6000, 5000, cgbi=True)).height) == (6000, 5000)
    assert sniff(h.png(64, 64, before_ihdr=[b"tEXt"])).problem  # stb_image: "first not IHDR"
    assert sniff(b"\x89PNG\r\n\x1a\n").problem


def test_bmp_header_forms_and_a_negative_height():
    data = bytearray(picture("BMP", (30, 20)))
    struct.pack_into("<i", data, 22, -20)  # top-down
    assert (sniff(bytes(data)).width, sniff(bytes(data)).height) == (30, 20)
    struct.pack_into("<i", data, 22, -(2**31))
    assert sniff(bytes(data)).problem
    os2 = b"BM" + struct.pack("<IHHI", 0, 0, 0, 26) + struct.pack("<IHHHH", 12, 300, 200, 1, 24)
    assert (sniff(os2).width, sniff(os2).height) == (300, 200)  # the 12-byte header's 16-bit sizes


def test_gif_is_its_logical_screen_not_its_frame():
    data = bytearray(picture("GIF", (10, 10)))
    data[6:10] = struct.pack("<HH", 4000, 3000)
    assert (sniff(bytes(data)).width, sniff(bytes(data)).height) == (4000, 3000)


def test_stb_images_other_formats_are_named_and_never_sized():
    assert sniff(picture("PPM")).problem and sniff(picture("PPM")).format == "PNM"
    assert sniff(b"8BPS" + b"\x00" * 30).format == "PSD" and sniff(b"8BPS" + b"\x00" * 30).problem
    assert sniff(b"#?RADIANCE\n" + b"\x00" * 30).problem
    assert sniff(picture("TGA")) is None  # stb_image's weak TGA test: unknown here, so refused
    assert sniff(b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 20) is None


def test_bytes_libmtmd_takes_for_a_sound_are_a_sound_whatever_else_they_are():
    jpeg = b"\xff" + h.jpeg(64, 64)  # a fill byte first: libmtmd's MPEG sync test sends it to miniaudio
    assert sniff(jpeg) is None  # (which finds no frame in it)
    assert sniff(jpeg[:11]).kind == "image"  # under 12 bytes it is stb_image's


# --- sounds ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rate, channels, width", [(16000, 1, 2), (44100, 2, 2), (8000, 1, 1), (48000, 2, 4)])
def test_wav_is_its_data_over_its_frame_size(rate, channels, width):
    found = sniff(tone(0.5, rate, channels, width))
    assert (found.format, found.frames, found.rate, found.problem) == ("WAV", rate // 2, rate, None)


def test_wav_data_is_cut_to_the_bytes_present_and_dangerous_layouts_are_refused():
    assert sniff(h.wav(1600, claimed=10**8)).frames == 1600
    assert sniff(h.wav(1600, rate=1)).seconds == 1600  # a sample rate of 1: what miniaudio resamples from
    short_fact = h.wav(100).replace(b"data", b"fact\x02\x00\x00\x00\x00\x00data", 1)
    assert "fact" in sniff(short_fact).problem  # dr_wav would seek 2^64 bytes, 2^31 at a time
    no_fmt = h.wav(100).replace(b"fmt ", b"fmtX", 1)
    assert sniff(no_fmt).problem  # a WAV dr_wav refuses is never left to dr_mp3's search


def test_flac_is_its_streaminfo_and_an_id3_tag_before_it_is_skipped():
    assert (sniff(h.flac(10**9, 1)).frames, sniff(h.flac(10**9, 1)).rate) == (10**9, 16000)
    tagged = b"ID3\x04\x00\x00\x00\x00\x00\x05" + b"\x00" * 5 + h.flac(4096)
    assert sniff(tagged).format == "FLAC" and sniff(tagged).frames == 4096
    assert sniff(b"ID3\x04\x00\x00\x00\x00\x00\x00OggS" + b"\x00" * 60).problem == "an Ogg FLAC"


def test_mp3_frames_are_counted_and_a_xing_claim_is_taken_as_miniaudio_takes_it():
    quiet = sniff(h.silent_mp3(10))
    assert (quiet.rate, quiet.frames) == (8000, round(10 * 8000 / 576) * 576)
    assert sniff(h.xing_mp3(10**6)).frames == 10**6 * 1152  # a 2 kB file claiming 7 hours
    assert sniff(h.xing_mp3(2**23)).frames == (2**23 * 1152) & 0xFFFFFFFF  # (a uint32 product, as in C)
    long = sniff(h.silent_mp3(6000), max_seconds=60)
    assert 60 < long.seconds < 61  # counted just past the bound, not to the end
    tagged = b"ID3\x03\x00\x00\x00\x00\x01\x00" + b"\x00" * 128 + h.silent_mp3(2) + b"TAG" + b"\x00" * 125
    assert sniff(tagged).frames == sniff(h.silent_mp3(2)).frames
    layer2 = b"\xff\xfd\x80\xc0" + b"\x00" * 413  # MPEG-1 layer II, 128 kbit/s, 44.1 kHz
    assert "layer I or II" in sniff(layer2 * 4).problem


# --- the bounds (wire.media.checked) -----------------------------------------------------------------

def test_checked_refuses_what_it_cannot_size_and_gives_the_engine_the_size():
    part = Media("image", "messages[0].content[1]")
    kept, spent = wm.checked(part, picture("PNG", (40, 30)), LIMITS, wm.Spent())
    assert kept.size == (40, 30) and spent == wm.Spent(1, 1200, 0.0)
    for data in (picture("PPM"), h.png(10, 10, before_ihdr=[b"tEXt"])):
        with pytest.raises(InvalidRequest) as e:
            wm.checked(part, data, LIMITS, wm.Spent())
        assert e.value.param == part.param and e.value.code == "invalid_media" and "no size" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        wm.checked(part, h.jpeg(16000, 16000, padding=b"\x00"), LIMITS, wm.Spent())
    assert "16000x16000 pixels" in e.value.message and e.value.code == "media_too_large"
    sound, spent = wm.checked(Media("audio", "a"), h.silent_mp3(2), LIMITS, wm.Spent())
    assert sound.size == (sniff(h.silent_mp3(2)).frames, 8000) and spent.seconds == pytest.approx(2, abs=0.1)


def test_a_request_is_bounded_in_count_pixels_and_seconds():
    spent = wm.Spent()
    for i in range(2):
        wm.admit(Media("image", f"p{i}"), LIMITS, spent)
        _, spent = wm.checked(Media("image", f"p{i}"), picture("PNG", (1000, 900)), LIMITS, spent)
    with pytest.raises(InvalidRequest) as e:  # 2.7 million pixels with the third
        wm.checked(Media("image", "p2"), picture("PNG", (1000, 900)), LIMITS, spent)
    assert e.value.param == "p2" and "server.max_media_pixels_per_request" in e.value.message
    _, spent = wm.checked(Media("audio", "a"), h.silent_mp3(30), LIMITS, spent)
    with pytest.raises(InvalidRequest) as e:
        wm.admit(Media("image", "p3"), LIMITS, spent)
    assert e.value.param == "p3" and e.value.code == "too_many_media"
    with pytest.raises(InvalidRequest) as e:
        wm.checked(Media("audio", "b"), h.silent_mp3(31), LIMITS, wm.Spent(0, 0, 30))
    assert e.value.param == "b" and "server.max_media_seconds_per_request" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        wm.checked(Media("audio", "x"), h.xing_mp3(10**6), LIMITS, wm.Spent())
    assert e.value.param == "x" and e.value.code == "media_too_large"


def test_resampled_is_miniaudios_count():
    assert engine_media.resampled(80064, 8000, 16000) == 160128  # (as libmtmd decoded it)
    assert engine_media.resampled(1152000, 44100, 16000) == 417959
    assert engine_media.resampled(100, 16000, 16000) == 100 and engine_media.resampled(0, 8000, 16000) == 0


# --- against libmtmd ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mtmd():
    """libmtmd's helper for a vision and an audio projector: bytes -> (nx, ny) or samples, or None."""
    import llama_cpp as L
    from llama_cpp import mtmd_cpp as M

    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(tiny_random_model("qwen2", seed=1)).encode(), L.llama_model_default_params())
    params = M.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 1, False
    ctx = {audio: M.mtmd_init_from_file(str(tiny_projector(64, audio)).encode(), model, params) for audio in (0, 1)}
    opt = M.mtmd_helper_init_opt_default()
    opt.video_params.ffmpeg_bin_dir = engine_media.NO_FFMPEG

    def decode(data: bytes, audio: bool):
        buf = (ctypes.c_uint8 * max(1, len(data))).from_buffer_copy(data or b"\x00")
        bitmap = M.mtmd_helper_bitmap_init_from_buf_wrapper(ctx[audio], buf, len(data), True, opt).bitmap
        if not bitmap:
            return None
        try:
            if M.mtmd_bitmap_is_audio(bitmap):
                return M.mtmd_bitmap_get_nx(bitmap)
            return M.mtmd_bitmap_get_nx(bitmap), M.mtmd_bitmap_get_ny(bitmap)
        finally:
            M.mtmd_bitmap_free(bitmap)

    yield decode
    for c in ctx.values():
        M.mtmd_free(c)
    L.llama_model_free(model)


def picture_variants() -> Iterator[bytes]:
    bases = [picture(fmt, size, **save) for fmt, save in (("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}),
                                                          ("GIF", {}), ("BMP", {})) for size in ((33, 17), (64, 48))]
    bases += [picture("BMP", (20, 10)).replace(struct.pack("<i", 10), struct.pack("<i", -10), 1),
              b"BM" + struct.pack("<IHHI", 0, 0, 0, 26) + struct.pack("<IHHHH", 12, 30, 20, 1, 24) + b"\x80" * 1800,
              h.png(300, 200, cgbi=True), h.png(50, 40, before_ihdr=[b"tEXt"]), h.jpeg(300, 200, padding=b"\x00"),
              h.jpeg(300, 200, padding=b"\x11" * 7, fill=2), h.jpeg(320, 240, progressive=True, app=b"x" * 40)]
    gif = bytearray(picture("GIF", (10, 10)))
    gif[6:10] = struct.pack("<HH", 300, 200)
    bases.append(bytes(gif))
    jpg = picture("JPEG", (40, 30))
    for marker in (b"\xff\xdb", b"\xff\xc4", b"\xff\xc0"):  # padding or fill before each kind of segment
        bases += [jpg.replace(marker, b"\x00\x00" + marker, 1), jpg.replace(marker, b"\xff\xff" + marker, 1)]
    rng = random.Random(50)
    for base in bases:
        yield base
        for cut in (8, 24, len(base) // 2):
            yield base[:cut]
        for _ in range(40):  # a header byte or two flipped
            data = bytearray(base)
            for _ in range(rng.choice((1, 2))):
                data[rng.randrange(min(len(data), 200))] = rng.randrange(256)
            yield bytes(data)


def sound_variants() -> Iterator[bytes]:
    mp3 = tm.llama_cpp_source_file("tools/mtmd/test-2.mp3", REPO / ".cache" / "media").read_bytes()
    bases = [tone(0.3), tone(0.2, 44100, 2), tone(0.1, 8000, 1, 1), h.wav(500, claimed=10**6), h.wav(300, rate=7),
             h.silent_mp3(3), h.xing_mp3(500), h.xing_mp3(50, real_frames=60), mp3[:60000],
             b"ID3\x03\x00\x00\x00\x00\x00\x20" + b"\x00" * 32 + h.silent_mp3(1) + b"TAG" + b"\x00" * 125,
             h.silent_mp3(1) + b"\x00" * 3, b"\xff\xe3\x18\xc0" + b"\x00" * 30 + h.silent_mp3(1),
             h.flac(8192, 2), h.flac(10**5, 1), h.flac(4096, 1, metadata=[(1, b"\x00" * 10), (4, b"\x00" * 8)]),
             h.flac(4096, 1, metadata=[(2, b"\x00" * 2)]),  # an APPLICATION block dr_flac refuses
             b"ID3\x04\x00\x00\x00\x00\x00\x00" + h.flac(4096)]
    extensible = tone(0.1).replace(b"fmt \x10\x00\x00\x00\x01\x00",
                                   b"fmt \x28\x00\x00\x00\xfe\xff", 1)
    extensible = extensible.replace(b"data", b"\x16\x00\x10\x00\x04\x00\x00\x00\x01\x00" + b"\x00" * 14 + b"data", 1)
    bases += [extensible, tone(0.1).replace(b"data", b"LIST\x03\x00\x00\x00abc\x00data", 1)]
    rng = random.Random(51)
    for base in bases:
        yield base
        for cut in (12, 40, len(base) // 2, len(base) - 1):
            yield base[:cut]
        for _ in range(40):
            data = bytearray(base)
            for _ in range(rng.choice((1, 2))):
                data[rng.randrange(min(len(data), 120))] = rng.randrange(256)
            yield bytes(data)
    for base in (h.silent_mp3(2), mp3[:20000], h.xing_mp3(30, real_frames=10)):  # frames anywhere, junk between
        for _ in range(60):
            data = bytearray(base)
            for _ in range(rng.choice((1, 3, 8))):
                at = rng.randrange(len(data))
                if rng.random() < 0.5:
                    data[at] = rng.choice((0xFF, 0x00, rng.randrange(256)))
                else:
                    data[at:at] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 72))))
            yield bytes(data)


def test_the_readers_agree_with_what_libmtmd_decodes(mtmd):
    """Wherever a reader sizes a file that libmtmd decodes, the sizes are the same; a file too
    large to decode here safely is left to its size (refused by the bounds anyway)."""
    sized = refused = 0
    for i, data in enumerate([*picture_variants(), *sound_variants()]):
        found = sniff(data)
        if found is None or found.problem is not None:
            refused += 1  # never decoded by the gateway's engine
            continue
        if found.kind == "image":
            if found.pixels > 4 * 10**6:
                continue
            got = mtmd(data, False)
            assert got in (None, (found.width, found.height)), (i, found, got, data[:40])
        else:
            if found.seconds > 600:
                continue
            got = mtmd(data, True)
            assert got in (None, engine_media.resampled(found.frames, found.rate, 16000)), (i, found, got, data[:40])
        sized += got is not None
    assert sized > 1000 and refused > 100, (sized, refused)


def test_files_made_by_real_encoders_are_never_refused(mtmd):
    mp3 = tm.llama_cpp_source_file("tools/mtmd/test-2.mp3", REPO / ".cache" / "media").read_bytes()
    for data, audio in ((noise_picture(3, "PNG", (300, 200)), False), (noise_picture(4, "JPEG", (300, 200)), False),
                        (noise_picture(5, "GIF", (64, 64)), False), (noise_picture(6, "BMP", (64, 64)), False),
                        (mp3, True), (tone(1.5), True)):
        found = sniff(data)
        assert found.problem is None
        got = mtmd(data, audio)
        assert got == (engine_media.resampled(found.frames, found.rate, 16000) if audio
                       else (found.width, found.height))



def test_the_request_bounds_are_server_settings_with_checks(tmp_path):
    from gateway.models.config import ConfigError, load_config
    from gateway.models.config.specs import ServerConfig

    default = ServerConfig()
    assert (default.max_media_per_request, default.max_media_pixels_per_request,
            default.max_media_seconds_per_request) == (100, 8 * 7680 * 4320, 600)
    path = tmp_path / "models.yaml"
    path.write_text("server:\n  max_media_per_request: 4\n  max_media_pixels_per_request: 5000000\n"
                    "  max_media_seconds_per_request: 90\n")
    server = load_config(path, check_files=False).server
    assert (server.max_media_per_request, server.max_media_pixels_per_request,
            server.max_media_seconds_per_request) == (4, 5_000_000, 90)
    path.write_text("server:\n  max_media_per_request: 0\n  max_media_pixels_per_request: x\n"
                    "  max_media_seconds_per_request: -1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, check_files=False)
    assert len(e.value.problems) == 3 and all("server.max_media_" in p for p in e.value.problems)
