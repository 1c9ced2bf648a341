"""MP3 as miniaudio's dr_mp3 reads it from memory (``mp3``), driving minimp3: the length it
allocates for is a Xing/Info frame count where its first decoded frame carries one (the claim
taken whatever frames follow), else its frames counted one by one: minimp3's frame search (a
header followed by matching ones), the layer III side information and the bit reservoir, over
all the stream's bytes from where dr_mp3 stands. A first frame of layer I or II is not sized
(whether it decodes depends on its data)."""

from __future__ import annotations

import re

from .sniffed import AUDIO, WORK, Sniffed, Unsized

_HALFRATE = (((0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80),
              (0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80),
              (0, 16, 24, 28, 32, 40, 48, 56, 64, 72, 80, 88, 96, 112, 128)),
             ((0, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160),
              (0, 16, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192),
              (0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224)))


def _valid_second(b: int) -> bool:
    return ((b & 0xF0) == 0xF0 or (b & 0xFE) == 0xE2) and (b >> 1) & 3 != 0


_HEADER = re.compile(b"\xff[" + b"".join(re.escape(bytes([b])) for b in range(256) if _valid_second(b)) + b"]["
                     + b"".join(re.escape(bytes([b])) for b in range(256) if b >> 4 != 15 and (b >> 2) & 3 != 3)
                     + b"]")


def _valid(d: bytes, p: int) -> bool:
    return d[p] == 0xFF and _valid_second(d[p + 1]) and d[p + 2] >> 4 != 15 and (d[p + 2] >> 2) & 3 != 3


def _compare(h1: bytes, d: bytes, p: int) -> bool:
    """``hdr_compare(h1, d + p)``."""
    return (_valid(d, p) and not (h1[1] ^ d[p + 1]) & 0xFE and not (h1[2] ^ d[p + 2]) & 0x0C
            and ((h1[2] & 0xF0) == 0) == ((d[p + 2] & 0xF0) == 0))


def _samples(h: bytes) -> int:
    return 384 if h[1] & 6 == 6 else 1152 >> int(h[1] & 14 == 2)


def _rate(h: bytes) -> int:
    return (44100, 48000, 32000)[(h[2] >> 2) & 3] >> int(not h[1] & 0x8) >> int(not h[1] & 0x10)


def _frame_bytes(h: bytes, free_format: int) -> int:
    kbps = 2 * _HALFRATE[int(bool(h[1] & 0x8))][((h[1] >> 1) & 3) - 1][h[2] >> 4]
    n = _samples(h) * kbps * 125 // _rate(h)
    if h[1] & 6 == 6:
        n &= ~3
    return n or free_format


def _padding(h: bytes) -> int:
    return (4 if h[1] & 6 == 6 else 1) if h[2] & 0x2 else 0


class _Bits:
    """minimp3's bit reader: past its limit a read gives 0 (and the position still moves)."""

    def __init__(self, d: bytes, start: int, n: int):
        self.d, self.start, self.pos, self.limit = d, start, 0, n * 8

    def get(self, n: int) -> int:
        s = self.pos & 7
        p = self.start + (self.pos >> 3)
        self.pos += n
        if self.pos > self.limit:
            return 0
        shl, cache, nxt = n + s - 8, 0, self.d[p] & (255 >> s)
        while shl > 0:
            cache |= nxt << shl
            p += 1
            nxt = self.d[p]
            shl -= 8
        return cache | (nxt >> -shl)


def _side_info(bs: _Bits, h: bytes) -> int:
    """``L3_read_side_info``: the main data's back pointer, or -1 where minimp3 refuses it."""
    mono, mpeg1 = h[3] & 0xC0 == 0xC0, h[1] & 0x8
    granules = 1 if mono else 2
    if mpeg1:
        granules *= 2
        begin = bs.get(9)
        bs.get(7 + granules)
    else:
        begin = bs.get(8 + granules) >> granules
    part23 = 0
    for _ in range(granules):
        part23 += bs.get(12)
        if bs.get(9) > 288:
            return -1
        bs.get(8)
        bs.get(4 if mpeg1 else 9)
        if bs.get(1):
            if not bs.get(2):
                return -1
            for width in (1, 10, 3, 3, 3):
                bs.get(width)
        else:
            for width in (15, 4, 3):
                bs.get(width)
        for width in (1, 1, 1) if mpeg1 else (1, 1):
            bs.get(width)
    return -1 if part23 + bs.pos > bs.limit + begin * 8 else begin


class _Decoder:
    """minimp3's decoder state as far as finding and counting frames needs it, and the steps
    (frames, candidate headers) left to take."""

    def __init__(self, work: int) -> None:
        self.header = b"\x00\x00\x00\x00"
        self.free_format = 0
        self.reservoir = 0
        self.work = work

    def reset(self) -> None:
        self.header, self.free_format, self.reservoir = b"\x00\x00\x00\x00", 0, 0

    def _spend(self) -> None:
        self.work -= 1
        if self.work < 0:
            raise Unsized("too many frames, or too much to search for them")

    def _match(self, d: bytes, p: int, n: int, frame_bytes: int) -> bool:
        """``mp3d_match_frame``."""
        i = 0
        for nmatch in range(10):
            h = d[p + i:p + i + 4]
            i += _frame_bytes(h, frame_bytes) + _padding(h)
            if i + 4 > n:
                return nmatch > 0
            if not _compare(d[p:p + 4], d, p + i):
                return False
        return True

    def _find(self, d: bytes, off: int, n: int) -> tuple[int, int]:
        """``mp3d_find_frame`` over ``d[off:off + n]``: where a frame starts and its bytes."""
        pos = off
        while True:
            m = _HEADER.search(d, pos, off + n - 2)
            if m is None:
                return n, 0
            p = m.start()
            i, h = p - off, d[p:p + 4]
            self._spend()
            fb = _frame_bytes(h, self.free_format)
            fap = fb + _padding(h)
            k = 4
            while not fb and k < 2304 and i + 2 * k < n - 4:  # a free-format frame: its size is where the next begins
                k = d.find(b"\xff", p + k, p + min(2304, (n - 4 - i + 1) // 2)) - p  # (only there can one begin)
                if k < 0:
                    break
                self._spend()
                if _compare(h, d, p + k):
                    fb_k = k - _padding(h)
                    after = fb_k + _padding(d[p + k:p + k + 4])
                    if not (i + k + after + 4 > n or not _compare(h, d, p + k + after)):
                        fap, fb, self.free_format = k, fb_k, fb_k
                k += 1
            if (fb and i + fap <= n and self._match(d, p, n - i, fb)) or (i == 0 and fap == n):
                return i, fap
            self.free_format = 0
            pos = p + 1

    def decode(self, d: bytes, off: int, n: int, counting: bool) -> tuple[int, int, int]:
        """``mp3dec_decode_frame`` (its samples only counted where ``counting``, as dr_mp3's
        length does): (samples, bytes consumed, where the frame's header is)."""
        self._spend()
        i = frame = 0
        if n > 4 and self.header[0] == 0xFF and _compare(self.header, d, off):
            h = d[off:off + 4]
            frame = _frame_bytes(h, self.free_format) + _padding(h)
            if frame != n and (frame + 4 > n or not _compare(h, d, off + frame)):
                frame = 0
        if not frame:
            self.reset()
            i, frame = self._find(d, off, n)
            if not frame or i + frame > n:
                return 0, i, -1
        p = off + i
        h = self.header = d[p:p + 4]
        if h[1] & 6 != 2:  # layer I or II: its samples, unless decoding them can fail
            if counting:
                return _samples(h), i + frame, p
            raise Unsized("its first frame is MPEG layer I or II")
        bs = _Bits(d, p + 4, frame - 4)
        if not h[1] & 1:
            bs.get(16)  # CRC
        begin = _side_info(bs, h)
        if begin < 0 or bs.pos > bs.limit:
            self.header = b"\x00" + h[1:]
            return 0, i + frame, p
        have, ok = min(self.reservoir, begin), self.reservoir >= begin
        self.reservoir = min(511, have + (bs.limit - bs.pos) // 8)
        return (_samples(h) if ok else 0), i + frame, p


def _signed_byte(b: int) -> int:
    return b | 0xFFFFFF00 if b & 0x80 else b  # a char (signed on the worker's x86-64) as a uint32


def mp3(data: bytes, max_seconds: float) -> Sniffed | None:
    """``ma_dr_mp3_init_memory`` then ``ma_dr_mp3_get_pcm_frame_count``: minimp3 handed all the
    stream's bytes from where dr_mp3 stands, frame after frame."""
    n = length = len(data)
    tail = 0
    if n > 128 and data[n - 128:n - 125] == b"TAG":
        tail, length = 128, length - 128
    if length > 32 and data[n - tail - 32:n - tail - 24] == b"APETAGEX":
        ape = data[n - tail - 8:n - tail - 4]
        size = (32 + sum(_signed_byte(b) << (8 * i) for i, b in enumerate(ape))) & 0xFFFFFFFF
        if size < length:
            length -= size
    if length < 10:
        return None
    start = 0
    if data[:3] == b"ID3":
        start = 10 + sum((b & 0x7F) << (21 - 7 * i) for i, b in enumerate(data[6:10])) + (10 if data[5] & 0x10 else 0)
        if start > length:  # (a seek past the end fails)
            return None
    # a stream of layer III (as its first frame must be) within max_seconds has at most 42 frames
    # a second (at 48 kHz); frames past that, or headers searched past WORK, are refused
    work = WORK + int(min(max_seconds, 1e7) * 42)
    dec, pos = _Decoder(work), start
    while True:  # the first frame, decoded
        first, used, _ = dec.decode(data, pos, length - pos, counting=False)
        if first or not used:
            break
        pos += used
    if not first:
        return None
    rate = _rate(dec.header)
    tagged, total = _xing(data, pos, used, first)
    if total is not None:
        return Sniffed(AUDIO, "MP3", frames=total, rate=rate)
    if tagged:
        start += used  # a Xing or Info frame without a count: dr_mp3 counts from past it
    dec, pos, counted = _Decoder(work), start, 0
    while counted <= max_seconds * rate:
        samples, used, _ = dec.decode(data, pos, length - pos, counting=True)
        if not samples and not used:
            break
        pos += used
        counted += samples
    return Sniffed(AUDIO, "MP3", frames=counted, rate=rate)


def _xing(data: bytes, at: int, used: int, first: int) -> tuple[bool, int | None]:
    """dr_mp3's Xing/Info check on its first decoded frame (read from where minimp3 began that
    frame's bytes, as dr_mp3 does): whether it has one, and the length it claims (its frame
    count, less the encoder's delay and padding), if it claims one."""
    bs = _Bits(data, at + 4, used - 4)
    if not data[at + 1] & 1:
        bs.get(16)
    try:
        if _side_info(bs, data[at:at + 4]) < 0:
            return False, None
    except IndexError:
        raise Unsized("a first frame shorter than its side information") from None
    tag = at + 4 + bs.pos // 8

    def read(p: int, k: int) -> bytes:
        if p + k > len(data):
            raise Unsized("a Xing header past the end")
        return data[p:p + k]

    if read(tag, 4) not in (b"Xing", b"Info"):
        return False, None
    flags = read(tag + 7, 1)[0]
    p, count = tag + 8, None
    if flags & 1:
        count = int.from_bytes(read(p, 4), "big")
        p += 4
    p += (4 if flags & 2 else 0) + (100 if flags & 4 else 0) + (4 if flags & 8 else 0)
    delay = padding = 0
    if read(p, 1)[0]:
        p += 21
        if p - at + 14 < used:
            lame = read(p, 3)
            delay = ((lame[0] << 4) | (lame[1] >> 4)) + 529
            padding = max(0, (((lame[1] & 0xF) << 8) | lame[2]) - 529)
    if count is None:
        return True, None
    total = (count * first) & 0xFFFFFFFF  # two uint32s multiplied in C
    total -= delay if total >= delay else 0
    total -= padding if total >= padding else 0
    return True, total
