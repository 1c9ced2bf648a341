"""What a picture or a sound will decode to in llama.cpp, read from its bytes before anything
decodes them, the way llama.cpp's own decoders read them (``sniff``). Pure.

libmtmd's helper (``mtmd_helper_bitmap_init_from_buf``) hands bytes that open like a sound
(``is_audio_file``: at least 12 bytes of RIFF/WAVE, ID3 or an MPEG sync word, or fLaC) to
miniaudio (``sounds``), and everything else to stb_image (``pictures``). Each reader follows its
decoder's own header parsing, so the size it reads is the one the decoder allocates for; what
it cannot size exactly is ``Sniffed.problem`` (``sniffed``), which the caller refuses undecoded:
nothing is decoded that was not sized."""

from __future__ import annotations

from .pictures import picture
from .sniffed import AUDIO, IMAGE, Sniffed
from .sounds import is_audio, sound

__all__ = ["AUDIO", "IMAGE", "Sniffed", "sniff"]


def sniff(data: bytes, max_seconds: float = float("inf")) -> Sniffed | None:
    """The picture or sound ``data`` decodes as, with its size; None for bytes llama.cpp decodes
    as neither. A sound's frames are counted at most to just past ``max_seconds`` (enough to
    refuse it)."""
    return sound(data, max_seconds) if is_audio(data) else picture(data)
