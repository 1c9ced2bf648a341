"""Media files made here byte by byte, as a hostile caller would send them: headers that claim
sizes (or lengths) the bytes never paid for, laid out the ways llama.cpp's decoders (stb_image,
miniaudio) still accept. Each is small on the wire and large once decoded."""

from __future__ import annotations

import struct
import zlib


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def jpeg(width: int, height: int, *, padding: bytes = b"", fill: int = 0, progressive: bool = False,
         app: bytes = b"") -> bytes:
    """A grey baseline (or progressive) JPEG of ``width`` x ``height`` whose entropy data is
    empty: stb_image reads zero bits past the end, so every block decodes as flat grey.
    ``padding`` goes between two segments (stb_image skips it), ``fill`` 0xFF bytes before
    each marker (fill bytes), ``app`` an APP1 segment's body before the tables."""
    ff = b"\xff" * fill
    dqt = _segment(0xDB, b"\x00" + b"\x01" * 64)
    sof = _segment(0xC2 if progressive else 0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    dht_dc = _segment(0xC4, b"\x00" + b"\x01" + b"\x00" * 15 + b"\x00")  # one code of one bit: 0
    dht_ac = _segment(0xC4, b"\x10" + b"\x01" + b"\x00" * 15 + b"\x00")  # one code of one bit: EOB
    sos = _segment(0xDA, b"\x01\x01\x00" + (b"\x00\x00\x00" if progressive else b"\x00\x3f\x00"))
    parts = [_segment(0xE1, app)] if app else []
    parts += [dqt, padding, sof, dht_dc, dht_ac, sos]
    return b"\xff\xd8" + b"".join(ff + p if p[:1] == b"\xff" else p for p in parts) + b"\xff\xd9"


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, *, cgbi: bool = False, before_ihdr: list[bytes] = ()) -> bytes:
    """An RGB PNG of zero pixels, ``width`` x ``height``; with ``cgbi``, Apple's CgBI chunk
    before IHDR and its data as raw deflate (as stb_image reads an iPhone PNG); the chunks of
    ``before_ihdr`` (their types) go before IHDR too."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15 if cgbi else 15)
    row = b"\x00" * (1 + 3 * width)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    head = [_chunk(b"CgBI", b"\x00" * 4)] if cgbi else []
    head += [_chunk(kind, b"") for kind in before_ihdr]
    return (b"\x89PNG\r\n\x1a\n" + b"".join(head) + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", data)
            + _chunk(b"IEND", b""))


# MPEG-2.5 layer III, 8 kbit/s, 8 kHz, mono: 72 bytes for 576 samples (72 ms) a frame
_QUIET_HEADER = b"\xff\xe3\x18\xc0"
_QUIET_FRAME = _QUIET_HEADER + b"\x00" * 68


def silent_mp3(seconds: float) -> bytes:
    """An MP3 of silence at 8 kbit/s: about a kilobyte a second (every frame's side information
    zero: no bits of main data, the reservoir never needed)."""
    return _QUIET_FRAME * max(1, round(seconds * 8000 / 576))


def xing_mp3(claimed_frames: int, real_frames: int = 3) -> bytes:
    """A short MP3 whose first frame is a Xing header claiming ``claimed_frames`` frames of 1152
    samples at 44.1 kHz (MPEG-1 layer III, 128 kbit/s, mono): miniaudio sizes its buffer by the
    claim, not by the frames that follow."""
    header = b"\xff\xfb\x90\xc0"
    size = 1152 * 128 * 125 // 44100
    tag = b"Xing" + struct.pack(">II", 1, claimed_frames)
    first = header + b"\x00" * 17 + tag
    first += b"\x00" * (size - len(first))
    return first + (header + b"\x00" * (size - 4)) * real_frames


def wav(frames: int, rate: int = 16000, *, claimed: int | None = None, bits: int = 16, channels: int = 1) -> bytes:
    """A PCM WAV of ``frames`` frames of silence; ``claimed`` sets the data chunk's size field in
    frames (miniaudio cuts it to the bytes present)."""
    block = channels * bits // 8
    data = b"\x00" * (frames * block)
    size = (claimed if claimed is not None else frames) * block
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def flac_header(total_frames: int, rate: int = 16000, channels: int = 1, bits: int = 16) -> bytes:
    """A FLAC's signature and STREAMINFO (no audio frames): miniaudio takes its length from it."""
    props = (rate << 44) | ((channels - 1) << 41) | ((bits - 1) << 36) | total_frames
    info = struct.pack(">HH", 4096, 4096) + b"\x00" * 6 + struct.pack(">Q", props) + b"\x00" * 16
    return b"fLaC" + bytes([0x80, 0, 0, 34]) + info


def _crc(data: bytes, bits: int, poly: int) -> int:
    crc, top, mask = 0, 1 << (bits - 1), (1 << bits) - 1
    for byte in data:
        crc ^= byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
    return crc


def flac(total_frames: int, blocks: int = 1, block_size: int = 4096, rate: int = 16000,
         metadata: list[tuple[int, bytes]] = ()) -> bytes:
    """A mono 16-bit FLAC of ``blocks`` frames of silence, ``block_size`` samples each (each a
    few bytes: a constant subframe), whose STREAMINFO says ``total_frames``; ``metadata`` adds
    blocks (type, body) after STREAMINFO."""
    out = flac_header(total_frames, rate)
    if metadata:
        out = out[:4] + bytes([0]) + out[5:]  # STREAMINFO is no longer the last block
        for i, (kind, body) in enumerate(metadata):
            last = 0x80 if i == len(metadata) - 1 else 0
            out += bytes([last | kind]) + len(body).to_bytes(3, "big") + body
    for n in range(blocks):
        assert n < 128  # a one-byte frame number
        header = b"\xff\xf8" + bytes([0x70, 0x08, n]) + (block_size - 1).to_bytes(2, "big")
        frame = header + bytes([_crc(header, 8, 0x07)]) + b"\x00\x00\x00"
        out += frame + _crc(frame, 16, 0x8005).to_bytes(2, "big")
    return out
