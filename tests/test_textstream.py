"""Incremental UTF-8 and stop strings, fed in arbitrary cuts."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text.textstream import StopMatcher, Utf8Stream


def cuts(data, draw_points):
    points = sorted(set(p % (len(data) + 1) for p in draw_points))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def run_stop(text_pieces, stops):
    m = StopMatcher(stops)
    out, matched = [], None
    for piece in text_pieces:
        safe, matched = m.feed(piece)
        out.append(safe)
        if matched is not None:
            break
    if matched is None:
        out.append(m.flush())
    return out, matched


def reference(text, stops):
    """The whole-text rule: cut before the stop string that is completed first, then the one
    that starts first (tokens arrive in order; generation ends as soon as one is complete)."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    _, i, s = min(hits)
    return text[:i], s


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abc€ ", max_size=30), st.lists(st.text(alphabet="abc€ ", min_size=1, max_size=4), max_size=3),
       st.lists(st.integers(0, 100), max_size=8))
def test_stop_matcher_equals_the_whole_text_rule_in_any_cuts(text, stops, points):
    out, matched = run_stop(cuts(text, points), stops)
    expected, expected_stop = reference(text, stops)
    assert "".join(out) == expected
    if expected_stop is not None:
        assert matched is not None and text.find(matched) == text.find(expected_stop)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc€ ", max_size=30), st.lists(st.text(alphabet="abc€ ", min_size=1, max_size=4), max_size=3),
       st.lists(st.integers(0, 100), max_size=8))
def test_no_part_of_a_stop_string_is_ever_emitted(text, stops, points):
    out, _ = run_stop(cuts(text, points), stops)
    sent = ""
    for chunk in out:
        sent += chunk
        expected, _ = reference(text, stops)
        assert expected.startswith(sent)  # every prefix sent so far belongs to the final answer


def test_stop_examples():
    assert run_stop(["Hel", "lo wo", "rld"], ["o w"]) == (["Hel", "l"], "o w")
    assert run_stop(["ab", "cd"], ["x"]) == (["ab", "cd", ""], None)
    assert run_stop(["abc"], ["c", "b"]) == (["a"], "b")
    assert run_stop([" a", "aa"], ["a", " aa"]) == ([" "], "a")  # "a" completes before " aa" does
    assert run_stop([" aaa"], ["a", " aa"]) == ([" "], "a")


@given(st.text(max_size=40), st.lists(st.integers(0, 200), max_size=10))
def test_utf8_in_any_byte_cuts_comes_out_whole(text, points):
    data = text.encode()
    dec = Utf8Stream()
    pieces = [dec.feed(chunk) for chunk in cuts(data, points)] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text
