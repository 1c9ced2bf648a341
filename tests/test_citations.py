"""tools/citations.find: where an answer's text cites a search result or a fetched page (its
URL, a quoted run, a quoted sentence), the offsets it gives, and its bounded work."""

from __future__ import annotations

import time

from gateway.tools import citations
from gateway.tools.citations import MIN_RUN, find
from gateway.tools.hosted import Page, SearchResult

RAIN = SearchResult("Paris weather", "https://weather.example/paris",
                    "Paris will see steady rain through the weekend, with highs near twelve degrees. Bring a warm coat.")
LEASE = Page("https://docs.example/lease", "Leases",
             "The registry holds each model under a lease.\nA lease ends when its last request is answered and the "
             "model may then be unloaded to make room for another one.")


def test_a_url_in_the_text_cites_its_source():
    text = "See https://weather.example/paris/. It is wet."
    (c,) = find(text, [RAIN, LEASE])
    assert text[c.start:c.end] == "https://weather.example/paris/"  # the sentence's full stop is not the URL's
    assert (c.url, c.title, c.source) == (RAIN.url, "Paris weather", 0)
    assert c.cited_text.startswith("Paris will see steady rain")


def test_a_quoted_run_is_found_whatever_its_case_spacing_and_punctuation():
    text = "Well: PARIS will see steady\n rain through the   weekend with highs near twelve degrees, they say."
    (c,) = find(text, [LEASE, RAIN])
    assert c.source == 1 and c.url == RAIN.url
    assert text[c.start:c.end] == ("PARIS will see steady\n rain through the   weekend with highs near twelve "
                                   "degrees")
    assert c.cited_text == text[c.start:c.end]


def test_a_whole_short_sentence_is_a_quote_and_a_short_common_run_is_not():
    (c,) = find("The forecast is clear. Bring a warm coat! Nothing more.", [RAIN])
    assert c.cited_text == "Bring a warm coat" and c.end - c.start < MIN_RUN
    assert find("Paris will see steady rain, maybe.", [RAIN]) == []  # a run under MIN_RUN, not a whole sentence
    assert find("A lease ends. Rain.", [RAIN, LEASE]) == []  # a sentence too short to count


def test_citations_come_in_the_texts_order_and_never_overlap():
    text = ("First, the registry holds each model under a lease. Then, per https://weather.example/paris, Paris "
            "will see steady rain through the weekend, with highs near twelve degrees.")
    found = find(text, [RAIN, LEASE])
    assert [c.source for c in found] == [1, 0, 0]
    assert all(a.end <= b.start for a, b in zip(found, found[1:]))
    assert [text[c.start:c.end] for c in found][0] == "the registry holds each model under a lease"


def test_nothing_to_cite_gives_nothing():
    assert find("", [RAIN]) == [] and find("Bring a warm coat.", []) == []
    assert find("Nothing like any of it is said here at all, not one word of it.", [RAIN, LEASE]) == []


def test_the_work_is_bounded_and_near_linear():
    words = [f"w{i}" for i in range(60_000)]
    sources = [SearchResult(f"r{n}", f"https://s.example/{n}", " ".join(words[n * 1000:(n + 1) * 1000]))
               for n in range(50)]
    text = " ".join(words[::2]) + " " + " ".join(words[25_000:25_020])  # half a million characters, one quote
    began = time.monotonic()
    found = find(text, sources)
    assert time.monotonic() - began < 5
    assert [c.source for c in found] == [25]
    many = " ".join(["Bring a warm coat."] * (citations.MAX_CITATIONS * 2))
    assert len(find(many, [RAIN])) == citations.MAX_CITATIONS
