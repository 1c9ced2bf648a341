"""Pictures as stb_image reads them (the one llama.cpp vendors, libmtmd's decoder): it decodes
with the first of its formats whose test passes (PNG, BMP, GIF, PSD, PIC, JPEG, PNM, HDR, TGA)
and never falls back to another. The sizes read here are the ones it allocates for:

- PNG: IHDR, after any number of Apple's CgBI chunks (stb_image reads an iPhone PNG);
- JPEG: the first SOF0/1/2 that stb_image's marker walk reaches: 0xFF fill bytes and any bytes
  between segments skipped, tables and APPn/COM segments passed over by their lengths;
- GIF: the logical screen (stb_image allocates for it, and refuses a frame outside it);
- BMP: its header's width and height (16-bit in the 12-byte form; a negative height flipped).

Its other formats are named and never sized."""

from __future__ import annotations

import re

from .sniffed import IMAGE, WORK, Sniffed

MAX_DIMENSION = 1 << 24  # stb_image's STBI_MAX_DIMENSIONS: larger is refused by stb itself


class _Bytes:
    """stb_image's reader over memory: a byte past the end reads as 0, a skip stops at the end."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos, self.end = data, pos, len(data)

    def u8(self) -> int:
        if self.pos < self.end:
            self.pos += 1
            return self.data[self.pos - 1]
        return 0

    def be16(self) -> int:
        return (self.u8() << 8) | self.u8()

    def be32(self) -> int:
        return (self.be16() << 16) | self.be16()

    def le16(self) -> int:
        return self.u8() | (self.u8() << 8)

    def le32(self) -> int:
        return self.le16() | (self.le16() << 16)

    def skip(self, n: int) -> None:
        """``stbi__skip`` (its count a C int: past 2^31 it is negative, which goes to the end)."""
        if n >= 1 << 31 or n < 0:
            self.pos = self.end
        else:
            self.pos = min(self.pos + n, self.end)


def picture(data: bytes) -> Sniffed | None:
    """stb_image's tests in its order: the first that passes is the format it decodes with."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data)
    if data[:2] == b"BM" and _Bytes(data, 14).le32() in (12, 40, 56, 108, 124):
        return _bmp(data)
    if data[:4] == b"GIF8" and data[4:6] in (b"7a", b"9a"):
        r = _Bytes(data, 6)
        return _dimensions("GIF", r.le16(), r.le16())
    for name, matches in (("PSD", data[:4] == b"8BPS"), ("PIC", data[:4] == b"\x53\x80\xf6\x34")):
        if matches:
            return _unread(name)
    if data[:1] == b"\xff" and _marker(_Bytes(data)) == 0xD8:
        return _jpeg(data)
    if data[:1] == b"P" and data[1:2] in (b"5", b"6"):
        return _unread("PNM")
    if data.startswith((b"#?RADIANCE\n", b"#?RGBE\n")):
        return _unread("HDR")
    return None  # (stb_image may still take it for a TGA, whose test proves little: refused as unknown)


def _unread(name: str) -> Sniffed:
    return Sniffed(IMAGE, name, problem="only PNG, JPEG, GIF and BMP are sized")


def _png(data: bytes) -> Sniffed:
    r = _Bytes(data, 8)
    for _ in range(WORK):
        length, kind = r.be32(), r.be32()
        if kind != 0x43674249:  # CgBI: skipped wherever it comes, IHDR first otherwise
            break
        r.skip(length)
        r.be32()  # its CRC
    else:
        return Sniffed(IMAGE, "PNG", problem="too many CgBI chunks")
    if kind != 0x49484452 or length != 13:  # IHDR
        return Sniffed(IMAGE, "PNG", problem="its first chunk (after CgBI) is not an IHDR")
    return _dimensions("PNG", r.be32(), r.be32())


def _dimensions(fmt: str, width: int, height: int) -> Sniffed:
    if not width or not height or width > MAX_DIMENSION or height > MAX_DIMENSION:
        return Sniffed(IMAGE, fmt, width, height, problem=f"its header says {width}x{height} pixels")
    return Sniffed(IMAGE, fmt, width, height)


def _bmp(data: bytes) -> Sniffed:
    r = _Bytes(data, 14)
    if r.le32() == 12:
        width, height = r.le16(), r.le16()
    else:
        width, height = r.le32(), r.le32()
        height = abs(height - (1 << 32) if height >= 1 << 31 else height)  # stb: abs((int) img_y)
    return _dimensions("BMP", width, height)


_NO_MARKER = 0xFF
_NOT_FF = re.compile(rb"[^\xff]")


def _marker(r: _Bytes) -> int:
    """``stbi__get_marker``: 0xFF, then any 0xFF fill bytes, then the marker; no marker (0xFF)
    where the byte read is not 0xFF."""
    if r.u8() != 0xFF:
        return _NO_MARKER
    m = _NOT_FF.search(r.data, r.pos)
    r.pos = m.start() if m else r.end
    return r.u8()


def _jpeg(data: bytes) -> Sniffed:
    """``stbi__decode_jpeg_header``: the segments before the frame header, then its size."""
    r = _Bytes(data)
    _marker(r)  # SOI
    m = _marker(r)
    for _ in range(WORK):
        if m in (0xC0, 0xC1, 0xC2):
            return _frame_header(r)
        if m == _NO_MARKER:
            return Sniffed(IMAGE, "JPEG", problem="no marker where stb_image expects one")
        if not _segment(r, m):
            return Sniffed(IMAGE, "JPEG", problem=f"a segment stb_image does not read (marker {m:#04x}) "
                                                 "before its frame header")
        m = _marker(r)
        while m == _NO_MARKER:  # bytes between segments: stb_image scans over them
            if r.pos >= r.end:
                return Sniffed(IMAGE, "JPEG", problem="no frame header")
            ff = data.find(b"\xff", r.pos)
            r.pos = ff if ff >= 0 else r.end
            m = _marker(r) if ff >= 0 else _NO_MARKER
    return Sniffed(IMAGE, "JPEG", problem="too many segments before its frame header")


def _segment(r: _Bytes, m: int) -> bool:
    """``stbi__process_marker``: DRI, DQT and DHT read by their contents, APPn and COM skipped by
    their lengths; False for anything else (stb_image fails there)."""
    if m == 0xDD:
        if r.be16() != 4:
            return False
        r.be16()
        return True
    if m == 0xDB:
        left = r.be16() - 2
        while left > 0:
            q = r.u8()
            if q >> 4 > 1 or q & 15 > 3:
                return False
            r.skip(128 if q >> 4 else 64)
            left -= 129 if q >> 4 else 65
        return left == 0
    if m == 0xC4:
        left = r.be16() - 2
        while left > 0:
            q = r.u8()
            if q >> 4 > 1 or q & 15 > 3:
                return False
            n = sum(r.u8() for _ in range(16))
            if n > 256:
                return False
            r.skip(n)
            left -= 17 + n
        return left == 0
    if 0xE0 <= m <= 0xEF or m == 0xFE:
        length = r.be16()
        if length < 2:
            return False
        r.skip(length - 2)
        return True
    return False


def _frame_header(r: _Bytes) -> Sniffed:
    """``stbi__process_frame_header``'s checks, then the size stb_image allocates for."""
    lf, precision, height, width, n = r.be16(), r.u8(), r.be16(), r.be16(), r.u8()
    if lf < 11 or precision != 8 or n not in (1, 3, 4) or lf != 8 + 3 * n:
        return Sniffed(IMAGE, "JPEG", width, height, problem="a frame header stb_image refuses")
    for _ in range(n):
        r.u8()
        hv, tq = r.u8(), r.u8()
        if not 1 <= hv >> 4 <= 4 or not 1 <= hv & 15 <= 4 or tq > 3:
            return Sniffed(IMAGE, "JPEG", width, height, problem="a frame header stb_image refuses")
    return _dimensions("JPEG", width, height)
