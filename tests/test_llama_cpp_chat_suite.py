"""llama.cpp's chat-parsing suite through the gateway's answer path (issue 37).

``tests/test-chat.cpp`` of the llama.cpp that llama-cpp-python vendors is read from its source
distribution (``tests/llamachat.py`` reads and runs it), so a new llama.cpp brings its new cases.
Each case runs whole and in 1-3 character pieces. What is asserted:
- the reader still finds the cases (a floor) and reads nearly all of them;
- streamed and whole answers agree on every case;
- every case listed in ``tests/data/llama_chat_passing.txt`` still passes. A case that starts
  passing is told in the table (``-s``); add it to the file to keep it passing.
Cases of one kind are not run, with the reason (``Case.skip``): a prefill continuation. The
per-family table is printed, and is in the message of a failure.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import llamachat as lc
import pytest
from realmodel import CACHE

from gateway.models import testmodels as tm

PASSING = Path(__file__).parent / "data" / "llama_chat_passing.txt"
FLOOR = 450  # parse cases the reader finds in llama-cpp-python 0.3.36's test-chat.cpp (it finds 463)
UNREAD_SHARE = 0.05  # at most this share of the chains may be unreadable


@pytest.fixture(scope="module")
def suite() -> tuple[list[lc.Case], list[lc.Unread]]:
    source = tm.llama_cpp_source_file("tests/test-chat.cpp", CACHE / "llama-tests").read_text()
    return lc.read_cases(source)


@pytest.fixture(scope="module")
def results(suite) -> list[tuple[lc.Case, list[str], list[str]]]:
    """Each case run: (case, why whole failed, why streamed failed); empty lists pass."""
    cases, _ = suite
    gateways: dict[str, lc.Gateway] = {}
    out = []
    for case in cases:
        if case.skip:
            continue
        if case.template not in gateways:
            path = tm.llama_cpp_source_file(f"models/templates/{case.template}", CACHE / "templates")
            gateways[case.template] = lc.Gateway(path.read_text())
        gw = gateways[case.template]
        out.append((case, lc.differences(case, gw.run(case, False)), lc.differences(case, gw.run(case, True))))
    return out


def ids(cases: list[lc.Case]) -> list[str]:
    """Each case's id, a repeat of an identical case numbered on."""
    seen: Counter[str] = Counter()
    out = []
    for case in cases:
        seen[case.id] += 1
        out.append(case.id if seen[case.id] == 1 else f"{case.id}-{seen[case.id]}")
    return out


def table(results, suite) -> str:
    """Per family: cases passing whole and streamed of those run, and why the others fail."""
    cases, unread = suite
    rows: dict[str, list] = defaultdict(lambda: [0, 0, 0, Counter()])
    for case, whole, streamed in results:
        row = rows[case.family]
        row[0] += 1
        row[1] += not whole
        row[2] += not streamed
        row[3].update(set(whole) | set(streamed))
    lines = ["| family | whole | streamed | why the others fail |", "|---|---|---|---|"]
    for family in sorted(rows):
        n, whole, streamed, why = rows[family]
        lines.append(f"| {family} | {whole}/{n} | {streamed}/{n} | "
                     + "; ".join(f"{r} ({k})" for r, k in why.most_common()) + " |")
    n = len(results)
    lines.append(f"| **all** | {sum(not w for _, w, _ in results)}/{n} | {sum(not s for _, _, s in results)}/{n} | |")
    skipped = Counter(c.skip for c in cases if c.skip)
    lines += ["", f"found {len(cases)} cases in {len({c.template for c in cases})} templates; run {n}"]
    lines += [f"not run, {k}: {reason}" for reason, k in skipped.items()]
    lines += [f"unread, {k}: {reason}" for reason, k in Counter(u.reason for u in unread).items()]
    return "\n".join(lines)


def test_literal_reader():
    src = r'''x = "a\n\t\"b\\" R"(raw "q" \n)" R"#(x)"y)#" u8"\x41\u00e9" "c" '\'';'''
    toks = lc.tokenize(src)
    assert [t.kind for t in toks] == ["id", "op", "str", "chr", "op"]
    assert toks[2].value == 'a\n\t"b\\' + 'raw "q" \\n' + 'x)"y' + "Aé" + "c"
    assert lc.read_literal('R"delim(a)"b)delim" tail', 0) == ('a)"b', len('R"delim(a)"b)delim"'))
    assert lc.read_literal(r'"\xe2\x9c\x93 \101\0"', 0)[0] == "✓ A\0"
    assert lc.read_literal('"<｜tool▁sep｜>"', 0)[0] == "<｜tool▁sep｜>"
    assert [t.value for t in lc.tokenize('a // "no"\n/* "no" */ #define X "no"\nb')] == ["a", "b"]
    with pytest.raises(ValueError):
        lc.read_literal('"open\n"', 0)


def test_reader_reads_builder_chains():
    src = r'''
static common_chat_tool t1{ "t1", "a tool", R"({"type": "object"})" };
const common_chat_msg m1 = simple_assist_msg("", "thought", "t1", "{\"a\": 1}");
static void each(const std::string & path, bool flag) {
    auto tst = peg_tester(path, flag);
    tst.test("x" "y").tools({ t1 }).expect(m1).run();
    tst.test("z").unknown_step(1).run();
}
static void main_tests() {
    for (const char * p : { "models/templates/A.jinja", "models/templates/B.jinja" }) {
        each(p, false);
    }
    {
        auto tst = peg_tester("models/templates/C.jinja");
        const std::string call = "<call>";
        tst.test(call + "!").reasoning_format(COMMON_REASONING_FORMAT_AUTO).enable_thinking(false)
            .expect_tool_calls({ { "t1", R"({"a": 2})", {} } }).is_partial(true).run();
        tst.test("w").messages({ m1 }).continue_final_message(COMMON_CHAT_CONTINUATION_CONTENT).run();
    }
}
'''
    cases, unread = lc.read_cases(src)
    assert [(c.template, c.input) for c in cases] == [("A.jinja", "xy"), ("B.jinja", "xy"), ("C.jinja", "<call>!"),
                                                       ("C.jinja", "w")]
    assert cases[0].tools[0]["name"] == "t1" and cases[0].expect["tool_calls"] == [("t1", '{"a": 1}', "")]
    assert cases[0].expect["reasoning_content"] == "thought"
    c = cases[2]
    assert (c.reasoning_format, c.enable_thinking, c.is_partial) == ("AUTO", False, True)
    assert c.expect["tool_calls"] == [("t1", '{"a": 2}', "")] and c.skip is None
    assert cases[3].skip and cases[3].continuation == "CONTENT"
    assert [(u.template, u.reason) for u in unread] == [("A.jinja", "an unknown builder step .unknown_step()"),
                                                        ("B.jinja", "an unknown builder step .unknown_step()")]


def test_suite_is_read(suite):
    cases, unread = suite
    kinds = Counter(u.reason for u in unread)
    assert len(cases) >= FLOOR, f"found {len(cases)} cases (floor {FLOOR}); unread: {dict(kinds)}"
    assert len(unread) <= UNREAD_SHARE * (len(cases) + len(unread)), f"unread: {dict(kinds)}"
    assert len({c.template for c in cases}) >= 50


def test_cases_through_the_gateway(suite, results):
    report = table(results, suite)
    print("\n" + report)
    disagree = [(case.id, whole, streamed) for case, whole, streamed in results if whole != streamed]
    assert not disagree, f"streamed and whole answers differ: {disagree[:10]}\n{report}"
    passing = set(PASSING.read_text().split())
    now = dict(zip(ids([c for c, _, _ in results]), results, strict=True))
    assert passing <= set(now), f"ids no longer found: {sorted(passing - set(now))[:10]}"
    broken = [(i, now[i][1]) for i in sorted(passing) if now[i][1] or now[i][2]]
    assert not broken, f"cases that passed fail now: {broken[:20]}\n{report}"
    newly = sorted(i for i, (_, whole, streamed) in now.items() if not whole and not streamed and i not in passing)
    if newly:
        print(f"\n{len(newly)} cases pass that {PASSING.name} does not list yet:\n" + "\n".join(newly))
