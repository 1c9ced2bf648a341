"""Where an answer's text cites what a hosted tool found: ``find(text, sources)``. Pure; no I/O.

A source (a search result, a fetched page) is cited where the text holds its URL, or quotes it:
a run of at least ``MIN_RUN`` characters, or a whole sentence of at least ``MIN_SENTENCE_WORDS``
words, of its content (a search result's snippet, a page's text) word for word. Words are
compared without case, and whatever lies between them (spaces, line breaks, punctuation) is not
compared, so a quote the model re-spaced or re-punctuated still counts.

The work is near-linear: each source's words are indexed once as shingles (runs of ``SHINGLE``
words) and sentences, the text's words are looked up in that index, never searched for in every
source. Each source is indexed up to ``MAX_INDEXED`` characters and at most ``MAX_CITATIONS``
citations are given, the earliest in the text."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hosted import Page, SearchResult

SHINGLE = 5  # words in one indexed run
MIN_RUN = 40  # characters a quote not a whole sentence must span in the text
MIN_SENTENCE_WORDS = 4  # words a whole quoted sentence must have
MAX_INDEXED = 200_000  # characters of one source indexed
MAX_CITATIONS = 64
CITED_TEXT = 150  # characters of ``cited_text`` where a citation is a bare URL

_WORD = re.compile(r"\w+")
_SENTENCE = re.compile(r"[^.!?\n]+")
_URL = re.compile(r"https?://[^\s<>\"'`]+")
_URL_TAIL = ".,;:!?)]}>*_"


@dataclass(frozen=True)
class Citation:
    """One citation: ``text[start:end]`` cites ``sources[source]`` (its ``url`` and ``title``);
    ``cited_text`` is what of the source it quotes (where the text names the URL only, the
    source's opening words)."""

    start: int
    end: int
    url: str
    title: str
    cited_text: str
    source: int


def _content(source: SearchResult | Page) -> str:
    text = source.text if isinstance(source, Page) else source.content
    return text[:MAX_INDEXED]


def _words(text: str, start: int = 0) -> list[tuple[str, int, int]]:
    """The words of ``text`` from ``start``, lower-cased, with their offsets."""
    return [(m.group().lower(), m.start(), m.end()) for m in _WORD.finditer(text, start)]


def _plain_url(url: str) -> str:
    return url.rstrip("/")


class _Index:
    """The sources' shingles and sentences, each to the first source that has it."""

    def __init__(self, sources: list[SearchResult | Page]):
        self.shingles: dict[tuple[str, ...], int] = {}
        self.sentences: dict[tuple[str, ...], int] = {}
        self.urls: dict[str, int] = {}
        for n, source in enumerate(sources):
            self.urls.setdefault(_plain_url(source.url), n)
            content = _content(source)
            words = [w for w, _, _ in _words(content)]
            for i in range(len(words) - SHINGLE + 1):
                self.shingles.setdefault(tuple(words[i:i + SHINGLE]), n)
            for m in _SENTENCE.finditer(content):
                said = tuple(w.lower() for w in _WORD.findall(m.group()))
                if len(said) >= MIN_SENTENCE_WORDS:
                    self.sentences.setdefault(said, n)


def _runs(text: str, index: _Index, sources: list[SearchResult | Page]) -> list[Citation]:
    words = _words(text)
    found, i = [], 0
    while i + SHINGLE <= len(words):
        n = index.shingles.get(tuple(w for w, _, _ in words[i:i + SHINGLE]))
        if n is None:
            i += 1
            continue
        j = i  # extend while the next shingle is the same source's
        while j + 1 + SHINGLE <= len(words) and \
                index.shingles.get(tuple(w for w, _, _ in words[j + 1:j + 1 + SHINGLE])) == n:
            j += 1
        start, end = words[i][1], words[j + SHINGLE - 1][2]
        if end - start >= MIN_RUN:
            found.append(_cite(text, start, end, n, sources))
            i = j + SHINGLE
        else:
            i += 1
    return found


def _sentences(text: str, index: _Index, sources: list[SearchResult | Page]) -> list[Citation]:
    found = []
    for m in _SENTENCE.finditer(text):
        words = _words(m.group())
        if len(words) < MIN_SENTENCE_WORDS:
            continue
        n = index.sentences.get(tuple(w for w, _, _ in words))
        if n is not None:
            found.append(_cite(text, m.start() + words[0][1], m.start() + words[-1][2], n, sources))
    return found


def _urls(text: str, index: _Index, sources: list[SearchResult | Page]) -> list[Citation]:
    found = []
    for m in _URL.finditer(text):
        url = m.group().rstrip(_URL_TAIL)
        n = index.urls.get(_plain_url(url))
        if n is not None:
            source = sources[n]
            quoted = " ".join(_content(source)[:CITED_TEXT * 2].split())[:CITED_TEXT] or source.title
            found.append(Citation(m.start(), m.start() + len(url), source.url, source.title, quoted, n))
    return found


def _cite(text: str, start: int, end: int, n: int, sources: list[SearchResult | Page]) -> Citation:
    source = sources[n]
    return Citation(start, end, source.url, source.title, text[start:end], n)


def find(text: str, sources: list[SearchResult | Page]) -> list[Citation]:
    """The citations of ``sources`` in ``text``, in the text's order, none overlapping another
    (where two would, the one that starts first, or the longer of two that start together)."""
    if not text or not sources:
        return []
    index = _Index(sources)
    every = _urls(text, index, sources) + _runs(text, index, sources) + _sentences(text, index, sources)
    every.sort(key=lambda c: (c.start, c.start - c.end))
    kept: list[Citation] = []
    for c in every:
        if kept and c.start < kept[-1].end:
            continue
        kept.append(c)
        if len(kept) == MAX_CITATIONS:
            break
    return kept
