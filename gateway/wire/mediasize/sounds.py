"""Sounds as miniaudio reads them (the one llama.cpp vendors, libmtmd's decoder), opened from
memory: with each decoder's memory reader first, in turn (dr_wav, dr_flac, dr_mp3: a seek past
the end fails there), and only where all three fail with its own stream reader (which stops at
the end instead, and hands dr_mp3 16 KiB at a time). These readers follow the memory readers, and
a sound none of them opens is refused, so that second round never runs. The lengths read here
are the ones miniaudio allocates for (before it reads a sample):

- WAV: dr_wav's frame count (the first data chunk after fmt, cut to the bytes present, over the
  frame size), whatever the format tag (miniaudio sizes its buffer before it finds it cannot
  decode); a RIFF file dr_wav refuses is refused (dr_mp3 would search it for frames);
- FLAC: STREAMINFO's total (dr_flac after any ID3 tags; metadata blocks it refuses fall to MP3);
- MP3: ``mp3``'s."""

from __future__ import annotations

from .mp3 import mp3
from .sniffed import AUDIO, WORK, Sniffed, Unsized


def is_audio(data: bytes) -> bool:
    """libmtmd's ``is_audio_file``."""
    return len(data) >= 12 and ((data[:4] == b"RIFF" and data[8:12] == b"WAVE") or data[:4] == b"fLaC"
                                or data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0))


def sound(data: bytes, max_seconds: float) -> Sniffed | None:
    try:
        if data[:4] == b"RIFF":  # dr_wav takes it, or it is refused: never left to dr_mp3's search
            return _wav(data) or Sniffed(AUDIO, "WAV", problem="a WAV miniaudio does not open")
        flac = _flac(data)
        return flac if flac is not None else mp3(data, max_seconds)
    except Unsized as e:
        fmt = "WAV" if data[:4] == b"RIFF" else "FLAC" if b"fLaC" in data[:4] else "MP3"
        return Sniffed(AUDIO, fmt, problem=str(e))


def _le(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at:at + n], "little")


_PCM, _ADPCM, _ALAW, _MULAW, _DVI_ADPCM, _EXTENSIBLE = 1, 2, 6, 7, 0x11, 0xFFFE


def _wav(data: bytes) -> Sniffed | None:
    """``ma_dr_wav_init__internal`` on a RIFF file, as miniaudio opens it (no metadata): its
    frame count and sample rate, or None where dr_wav refuses the file."""
    n, pos = len(data), 12
    fmt: tuple[int, int, int, int, int] | None = None  # tag, channels, rate, block align, bits
    sub = 0
    data_pos = size = 0
    for _ in range(WORK):
        if pos + 8 > n:
            return None  # no data chunk
        cid, size = data[pos:pos + 4], _le(data, pos + 4, 4)
        pad, pos = size & 1, pos + 8
        if cid == b"fmt ":
            if pos + 16 > n:
                return None
            sub = 0
            fmt = (_le(data, pos, 2), _le(data, pos + 2, 2), _le(data, pos + 4, 4), _le(data, pos + 12, 2),
                   _le(data, pos + 14, 2))
            if size > 16:
                if pos + 18 > n:
                    return None
                extra = _le(data, pos + 16, 2)
                if extra and fmt[0] == _EXTENSIBLE:
                    if extra != 22 or pos + 40 > n:
                        return None
                    sub = _le(data, pos + 24, 2)  # the sub-format GUID's first two bytes
                if size < 18 + extra:
                    raise Unsized("a fmt chunk shorter than its own extension")
                pos += size
            else:
                pos += 16  # (dr_wav reads 16 bytes of a shorter one)
            pos = min(pos + pad, n)
        elif cid == b"data":
            data_pos = pos
            break
        elif cid == b"fact":  # its count is read for ADPCM only, which RIFF's loop never knows yet
            if pos + 4 > n:
                return None
            if size < 4:  # dr_wav would seek 2^64 bytes forward, 2^31 at a time
                raise Unsized("a fact chunk shorter than its count")
            pos = min(pos + size + pad, n)
        else:
            pos = min(pos + size + pad, n)
    else:
        raise Unsized("too many chunks before its data")
    if fmt is None:
        return None
    tag, channels, rate, block, bits = fmt
    if not 0 < rate <= 384000 or not 0 < channels <= 256 or not 0 < bits <= 64 or not block:
        return None
    if tag == _EXTENSIBLE:
        tag = sub
    size = min(size, n - data_pos)
    per_frame = (bits * channels) >> 3 if not bits & 7 else block
    if tag in (_ALAW, _MULAW) and per_frame != channels:
        per_frame = 0
    if tag not in (_ADPCM, _DVI_ADPCM) and per_frame:
        size -= size % per_frame
    if not per_frame:
        return None
    frames = size // per_frame
    if tag in (_ADPCM, _DVI_ADPCM):
        if channels > 2:
            return None
        wrap = (1 << 64) - 1  # dr_wav's uint64 arithmetic
        blocks = -(-size // block)
        frames = (((size - blocks * (6 if tag == _ADPCM else 4) * channels) & wrap) * 2 & wrap) // channels
        if tag == _DVI_ADPCM:
            frames = (frames + blocks) & wrap
    return Sniffed(AUDIO, "WAV", frames=frames, rate=rate)


def _flac(data: bytes) -> Sniffed | None:
    """``ma_dr_flac_open``: after any ID3 tags, a native FLAC's STREAMINFO and the metadata blocks
    dr_flac checks; None where dr_flac does not open it (miniaudio then tries MP3)."""
    n, pos = len(data), 0
    for _ in range(WORK):
        if pos + 4 > n:
            return None
        tag, pos = data[pos:pos + 4], pos + 4
        if tag[:3] != b"ID3":
            break
        if pos + 6 > n:
            return None
        size = sum((b & 0x7F) << (21 - 7 * i) for i, b in enumerate(data[pos + 2:pos + 6]))
        pos += 6 + size + (10 if data[pos + 1] & 0x10 else 0)
        if pos > n:  # (a seek past the end fails)
            return None
    else:
        raise Unsized("too many ID3 tags")
    if tag == b"OggS":
        raise Unsized("an Ogg FLAC")
    if tag != b"fLaC" or pos + 38 > n or data[pos] & 0x7F != 0 or _be(data, pos + 1, 3) != 34:
        return None
    last = data[pos] & 0x80
    props = _be(data, pos + 14, 8)
    rate, frames = props >> 44, props & ((1 << 36) - 1)
    pos += 38
    at, seektable = 42, 0  # where dr_flac thinks it is (from 42, whatever came before fLaC)
    for _ in range(WORK):
        if last:
            break
        if pos + 4 > n:
            return None
        kind, size = data[pos] & 0x7F, _be(data, pos + 1, 3)
        last = data[pos] & 0x80
        if size < {2: 4, 4: 8, 5: 396, 6: 32}.get(kind, 0):
            return None
        at += 4
        seektable = at if kind == 3 else seektable
        at += size
        pos += 4 + size
        if pos > n:  # a seek past the end fails: dr_flac takes it for the last block
            break
    else:
        raise Unsized("too many metadata blocks")
    if seektable and seektable <= n < at:  # it reads the seek table, then cannot seek to the first frame
        return None
    if not rate or not frames:
        raise Unsized("no sample rate or no length in its STREAMINFO")
    return Sniffed(AUDIO, "FLAC", frames=frames, rate=rate)


def _be(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at:at + n], "big")
