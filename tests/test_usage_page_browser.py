"""The Usage panel of the page at /, in a real browser: Debian's Chromium driven by Playwright,
against the real `gguf-gateway serve` process and real llama.cpp workers on scripted models.

The panel reads GET /usage (tokens per key, model, wire and hour, kept by the gateway) and draws
a stacked bar chart of the tokens per period, one colour per key or model, as inline SVG; a table
per key and model below it, each budget's standing, and a warning where the usage database cannot
be written. An admin's key sees every key's; a user key its own. Every name in it (keys, models)
is the server's and shows as text, never markup.

Skipped, with the reason, where Playwright or a Chromium is missing (see test_dashboard_browser.py).
``GGUF_GATEWAY_SCREENSHOTS`` names a folder to keep screenshots of the panel in."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import Console, ServerProcess, request

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
expect = sync_api.expect

ROOTKEY = "root-s3cret"
ALICEKEY = "alice-s3cret"
EVILKEY = "evil-s3cret"
HOSTILE = "<img src=x onerror=alert(1)>"
BUDGET = 1_000_000
USAGE = re.compile(r"/usage(\?|$)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("usagepage")
    tm.plain(d / "plain.gguf", ["Hello", " there"])
    tm.plain(d / "plain2.gguf", ["Something", " else", "!"])
    cfg = d / "models.yaml"
    # a key's name is the operator's to choose, and a YAML map's key may hold anything: markup too
    cfg.write_text(f"server:\n  discover_default_stores: false\n  state_dir: {d / 'state'}\n"
                   f"  api_keys:\n    root: {ROOTKEY}\n"
                   f"    alice: {{key: {ALICEKEY}, models: [plain*], role: user, budget: {BUDGET}, "
                   f"budget_period: day}}\n"
                   f"    '{HOSTILE}': {{key: {EVILKEY}, role: user}}\n"
                   f"models:\n  plain:\n    path: {d / 'plain.gguf'}\n  plain2:\n    path: {d / 'plain2.gguf'}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        # (key's name, model) -> [requests, prompt, completion, total], as the answers told them
        srv.spent = defaultdict(lambda: [0, 0, 0, 0])
        for key, model, n in ((ROOTKEY, "plain", 2), (ROOTKEY, "plain2", 1), (ALICEKEY, "plain", 1),
                              (ALICEKEY, "plain2", 2), (EVILKEY, "plain", 1)):
            for i in range(n):
                chat(srv, key, model, f"question {i} about {model}")
        yield srv
    assert srv.proc.returncode == 0


NAMES = {ROOTKEY: "root", ALICEKEY: "alice", EVILKEY: HOSTILE}


def chat(server, key: str, model: str, text: str) -> None:
    status, answer, _ = request(server.url + "/v1/chat/completions",
                                {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4},
                                headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert status == 200, answer
    told = answer["usage"]
    spent = server.spent[(NAMES[key], model)]
    for i, n in enumerate((1, told["prompt_tokens"], told["completion_tokens"], told["total_tokens"])):
        spent[i] += n


def by_key(spent) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for (key, _), (_, _, _, total) in spent.items():
        out[key] += total
    return dict(out)


def by_model(spent) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for (_, model), (_, _, _, total) in spent.items():
        out[model] += total
    return dict(out)


def usage_api(server, key: str, query: str = "") -> dict:
    status, body = server.get("/usage" + query, headers={"Authorization": f"Bearer {key}"})
    assert status == 200, body
    return body


class Opened:
    """A page logged in with a key: its console, the dialogs it opened, the /usage URLs it asked."""

    def __init__(self, browser, server, key: str, allow: tuple[int, ...] = (), clock: bool = False,
                 route=None, **context_args):
        self.context = browser.new_context(**({"viewport": {"width": 1280, "height": 900}} | context_args))
        self.page = p = self.context.new_page()
        self.console = Console(p, allow=(401, *allow))  # its first look, without a key, is refused
        self.dialogs: list[str] = []
        self.asked: list[str] = []
        p.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        p.on("request", lambda r: self.asked.append(r.url) if USAGE.search(urllib.parse.urlsplit(r.url).path) else None)
        if route is not None:
            p.route(USAGE, route)
        if clock:
            p.clock.install()
        p.goto(server.url + "/")
        p.fill("#key-input", key)
        p.press("#key-input", "Enter")
        expect(p.locator("#app")).to_be_visible()
        expect(p.locator("#conn-status")).to_have_text("Live")

    def close(self) -> None:
        self.context.close()
        assert self.console.errors == []
        assert self.dialogs == []


@pytest.fixture
def opened(browser, server):
    pages: list[Opened] = []

    def open_(key: str, **kw) -> Opened:
        pages.append(o := Opened(browser, server, key, **kw))
        return o

    yield open_
    for o in pages:
        o.close()


def screenshot(page, name: str) -> None:
    folder = os.environ.get("GGUF_GATEWAY_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.locator("#usage").screenshot(path=str(Path(folder) / f"usage-{name}.png"))


def table(page) -> dict[tuple[str, str], list[int]]:
    """The table's rows in their order: (key, model) -> [requests, prompt, completion, total]."""
    rows = page.locator("#usage-table tbody tr").evaluate_all("""rs => rs.map(r => [r.dataset.key, r.dataset.model,
        r.querySelector('.u-key').textContent, r.querySelector('.u-model').textContent,
        ...['requests', 'prompt', 'completion', 'total'].map(c => r.querySelector('.u-' + c).textContent)])""")
    out = {}
    for key, model, key_text, model_text, *numbers in rows:
        assert (key_text, model_text) == (key, model)  # the names as text, as the server sent them
        out[(key, model)] = [int(n.replace(",", "")) for n in numbers]
    return out


def segments(page) -> list[dict]:
    return page.locator("#usage-plot svg rect.seg").evaluate_all("""rs => rs.map(r => ({
        series: r.dataset.series, period: r.dataset.period, tokens: Number(r.dataset.tokens),
        title: r.querySelector('title') ? r.querySelector('title').textContent : null,
        height: Number(r.getAttribute('height'))}))""")


def chart_sums(page) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for s in segments(page):
        out[s["series"]] += s["tokens"]
    return dict(out)


def expect_table(page, want) -> None:
    """The table shows `want` (the spending the answers told), the biggest total first."""
    rows = page.locator("#usage-table tbody tr")
    expect(rows).to_have_count(len(want), timeout=10_000)
    totals = sum(v[3] for v in want.values())
    expect(page.locator("#usage-table tfoot .u-total")).to_have_text(f"{totals:,}", timeout=10_000)
    got = table(page)
    assert got == {k: list(v) for k, v in want.items()}
    order = [v[3] for v in got.values()]
    assert order == sorted(order, reverse=True)


def test_an_admin_sees_every_keys_tokens_as_a_stacked_chart_and_a_table(opened, server):
    o = opened(ROOTKEY)
    p = o.page
    expect(p.locator('#nav a[href="#usage"]')).to_have_text("Usage")
    usage = p.locator("#usage")
    expect(usage.locator("h2")).to_have_text("Usage")
    expect(p.locator("#usage-range")).to_have_value("7d")
    expect(p.locator("#usage-by")).to_have_value("key")
    expect_table(p, server.spent)
    assert {k for k, _ in table(p)} == {"root", "alice", HOSTILE}

    # the chart: one stacked bar a day, a colour a key, each segment named in its <title>
    days = {period(0), period(1)}  # today's, or yesterday's where the test began before midnight (UTC)
    assert chart_sums(p) == by_key(server.spent)
    for s in segments(p):
        assert s["height"] > 0
        assert s["title"] == f"{s['series']}\n{s['period']}\n{s['tokens']:,} tokens"
        assert s["period"] in days
    colours = p.locator("#usage-plot svg rect.seg").evaluate_all(
        "rs => Object.fromEntries(rs.map(r => [r.dataset.series, getComputedStyle(r).fill]))")
    assert len(set(colours.values())) == 3, colours
    legend = p.locator("#usage-legend li")
    expect(legend).to_have_count(3)
    assert legend.evaluate_all("ls => ls.map(l => l.querySelector('.legend-name').textContent)") == \
        [k for k, _ in sorted(by_key(server.spent).items(), key=lambda kv: (-kv[1], kv[0]))]
    swatches = legend.evaluate_all("""ls => Object.fromEntries(ls.map(l => [l.dataset.series,
        getComputedStyle(l.querySelector('.swatch')).backgroundColor]))""")
    assert swatches == colours  # the legend's colours are the bars'
    periods = p.locator("#usage-plot svg text.period")
    assert 1 <= periods.count() <= 7
    assert periods.last.text_content() in {time.strftime("%b %-d", time.gmtime(time.time() - d)) for d in (0, 60)}
    top = float(p.locator("#usage-plot svg text.tick-max").get_attribute("data-value"))
    assert top >= sum(by_key(server.spent).values())  # the tallest bar is under the top tick
    expect(p.locator("#usage-empty")).to_be_hidden()
    expect(p.locator("#usage-warning")).to_be_hidden()
    expect(p.locator("#usage-error")).to_be_hidden()

    # alice's budget: spent of it, and when it starts again, as GET /usage says
    limits = usage_api(server, ROOTKEY)["limits"]
    assert set(limits) == {"alice"}
    budgets = p.locator("#usage-budgets tbody tr")
    expect(budgets).to_have_count(1)
    alice = budgets.first
    spent = by_key(server.spent)["alice"]
    assert limits["alice"]["spent"] == spent
    expect(alice.locator(".b-key")).to_have_text("alice")
    expect(alice.locator(".b-spent")).to_contain_text(f"{spent:,} (0%)")
    expect(alice.locator(".b-budget")).to_have_text(f"{BUDGET:,} per day")
    expect(alice.locator(".b-remaining")).to_have_text(f"{BUDGET - spent:,}")
    expect(alice.locator("time")).to_have_attribute("datetime", limits["alice"]["resets"])
    assert alice.locator("meter").evaluate("m => [m.value, m.max]") == [spent, BUDGET]

    # the key named like markup is text: in the table, the legend and the bars' titles
    assert usage.locator("img").count() == 0
    expect(usage.locator("#usage-legend .legend-name", has_text=HOSTILE)).to_have_text(HOSTILE)
    assert any(s["title"].startswith(HOSTILE + "\n") for s in segments(p))
    assert p.title() == "gguf-gateway"
    screenshot(p, "by-key")

    # by model: drawn again at once, from the answer in hand, and asked again
    asked = len(o.asked)
    p.select_option("#usage-by", "model")
    expect(p.locator("#usage-legend li")).to_have_count(2)
    assert chart_sums(p) == by_model(server.spent)
    assert {s["title"].split("\n")[0] for s in segments(p)} == {"plain", "plain2"}
    expect_table(p, server.spent)  # the table is per key and model either way
    screenshot(p, "by-model")

    # the last 24 hours, by hour
    p.select_option("#usage-range", "24h")
    p.wait_for_function("() => [...document.querySelectorAll('#usage-plot svg rect.seg')]"
                        ".every(r => r.dataset.period.includes('T'))")
    assert chart_sums(p) == by_model(server.spent)
    hours = {time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(time.time() - ago)) for ago in (0, 3600)}
    assert {s["period"] for s in segments(p)} <= hours
    assert p.locator("#usage-plot svg text.period").count() >= 6  # a label every few hours at least
    assert all(re.search(r"\d{4}-\d\d-\d\d \d\d:00 UTC\n", s["title"]) for s in segments(p))
    expect(p.locator("#usage-note")).to_contain_text("per hour, last 24 hours")
    last = urllib.parse.parse_qs(urllib.parse.urlsplit(o.asked[-1]).query)
    assert last["group"] == ["hour"] and float(last["until"][0]) - float(last["since"][0]) == 24 * 3600
    assert len(o.asked) >= asked + 2
    screenshot(p, "by-hour")


def test_a_user_key_sees_its_own_usage_alone(opened, server):
    o = opened(ALICEKEY)
    p = o.page
    mine = {k: v for k, v in server.spent.items() if k[0] == "alice"}
    expect_table(p, mine)
    assert chart_sums(p) == {"alice": by_key(server.spent)["alice"]}
    expect(p.locator("#usage-legend li")).to_have_count(1)
    expect(p.locator("#usage-budgets tbody tr")).to_have_count(1)
    expect(p.locator("#usage-budgets .b-key")).to_have_text("alice")
    assert "root" not in p.locator("#usage").inner_text() and HOSTILE not in p.locator("#usage").inner_text()
    p.select_option("#usage-by", "model")
    expect(p.locator("#usage-legend li")).to_have_count(2)
    assert chart_sums(p) == {m: v[3] for (k, m), v in mine.items()}
    # the captured requests are an admin's: the Requests section says so, without asking (no 403
    # in the console, which ``close`` checks)
    expect(p.locator("#cap-error")).to_contain_text("not available to this key")
    # GET /usage itself: another key's is refused
    status, body = server.get("/usage?key=root", headers={"Authorization": f"Bearer {ALICEKEY}"})
    assert status == 403 and body["error"]["code"] == "forbidden"


def test_it_refreshes_every_30_seconds_not_on_every_live_snapshot(opened, server):
    o = opened(ROOTKEY, clock=True)
    p = o.page
    expect_table(p, server.spent)
    assert len(o.asked) == 1
    p.wait_for_timeout(2500)  # the live stream sends a snapshot a second meanwhile
    expect(p.locator("#recent tbody tr").first).to_be_visible()
    assert len(o.asked) == 1
    chat(server, EVILKEY, "plain2", "one more")  # what the next refresh will show
    p.clock.fast_forward("00:31")
    expect_table(p, server.spent)
    assert len(o.asked) == 2
    expect(p.locator("#usage-legend .legend-name", has_text=HOSTILE)).to_have_count(1)


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_usage_request_is_said_in_the_panel_and_the_page_goes_on(opened, server, status):
    def refuse(route):
        route.fulfill(status=status, content_type="application/json",
                      body=json.dumps({"error": {"message": f"no usage for {HOSTILE}", "code": "forbidden"}}))

    o = opened(ROOTKEY, allow=(status,), route=refuse, clock=True)
    p = o.page
    error = p.locator("#usage-error")
    expect(error).to_have_text(f"Usage is not available to this key: no usage for {HOSTILE}")
    p.clock.fast_forward("01:00")
    p.wait_for_timeout(500)
    assert len(o.asked) == 1  # not asked again every 30 s, to be refused again
    expect(p.locator("#usage-chart")).to_be_hidden()
    expect(p.locator("#usage-table-wrap")).to_be_hidden()
    assert p.locator("#usage img").count() == 0
    # the rest of the page is as it was: the key kept, the models listed, the live stream on
    expect(p.locator("#app")).to_be_visible()
    expect(p.locator("#key-form")).to_be_hidden()
    expect(p.locator("#models tbody tr[data-model]")).to_have_count(2)
    expect(p.locator("#conn-status")).to_have_text("Live")
    p.unroute(USAGE)
    p.select_option("#usage-range", "30d")  # asked again, and answered this time
    expect_table(p, server.spent)
    expect(error).to_be_hidden()


def period(days_ago: int = 0) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() - days_ago * 86400))


def test_what_the_server_sends_is_text_and_more_series_than_colours_are_summed(opened, server):
    """An answer made up here: model names like markup, ten models, a store that cannot write."""
    models = [f"{HOSTILE}-{i}" for i in range(10)]
    rows = [{"period": period(i % 3), "key": "root", "model": m, "wire": "chat", "requests": 1,
             "prompt_tokens": 100 * (10 - i), "completion_tokens": 5, "total_tokens": 100 * (10 - i) + 5}
            for i, m in enumerate(models)]
    answer = {"object": "usage", "group": "day", "since": "x", "until": "y", "recording": False,
              "reason": f"cannot write /state/{HOSTILE}.db: disk full", "data": rows,
              "limits": {HOSTILE: {"budget": 1000, "budget_period": "month", "spent": 2500, "remaining": 0,
                                   "resets": "2026-12-01T00:00:00Z"}, "nobudget": {"budget": None}}}

    def fake(route):
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answer))

    o = opened(ROOTKEY, route=fake)
    p = o.page
    warning = p.locator("#usage-warning")
    expect(warning).to_have_text(f"Usage is not being saved: cannot write /state/{HOSTILE}.db: disk full. "
                                 "It is kept in memory until the gateway restarts.")
    expect(p.locator("#usage-table tbody tr")).to_have_count(10)
    assert [m for _, m in table(p)] == models  # biggest first
    p.select_option("#usage-by", "model")
    legend = p.locator("#usage-legend .legend-name")
    expect(legend).to_have_count(8)
    assert legend.all_text_contents() == [*models[:7], "3 others"]
    sums = chart_sums(p)
    assert sums == {**{m: r["total_tokens"] for m, r in zip(models[:7], rows[:7])},
                    "": sum(r["total_tokens"] for r in rows[7:])}
    assert {s["period"] for s in segments(p)} == {period(0), period(1), period(2)}
    budget = p.locator("#usage-budgets tbody tr")
    expect(budget).to_have_count(1)  # a key without a budget has no row
    expect(budget.locator(".b-key")).to_have_text(HOSTILE)
    expect(budget.locator(".b-spent")).to_contain_text("2,500 (250%)")
    assert p.locator("#usage img").count() == 0 and p.title() == "gguf-gateway"
    screenshot(p, "others")

    answer.update(data=[], recording=True, reason=None, limits={})
    p.select_option("#usage-range", "24h")
    expect(p.locator("#usage-empty")).to_have_text("No usage recorded in this range.")
    expect(p.locator("#usage-chart")).to_be_hidden()
    expect(p.locator("#usage-table-wrap")).to_be_hidden()
    expect(p.locator("#usage-budgets-wrap")).to_be_hidden()
    expect(warning).to_be_hidden()


def test_a_usage_database_that_cannot_be_written_is_warned_of(browser, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the database's folder should be\n")
    tm.plain(tmp_path / "plain.gguf", ["Hi"])
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  state_dir: {tmp_path / 'state'}\n"
                   f"  usage_db: {blocker / 'usage.db'}\n  api_keys: {{root: {ROOTKEY}}}\n"
                   f"models:\n  plain:\n    path: {tmp_path / 'plain.gguf'}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(tmp_path)}) as srv:
        told = usage_api(srv, ROOTKEY)
        assert told["recording"] is False and str(blocker) in told["reason"]
        o = Opened(browser, srv, ROOTKEY)
        p = o.page
        expect(p.locator("#usage-warning")).to_have_text(
            f"Usage is not being saved: {told['reason']}. It is kept in memory until the gateway restarts.")
        expect(p.locator("#usage-empty")).to_be_visible()  # nothing spent yet
        screenshot(p, "not-recording")
        o.close()


def test_a_phones_width_does_not_scroll_sideways_with_usage_shown(opened, server):
    o = opened(ROOTKEY, viewport={"width": 375, "height": 812}, is_mobile=True, has_touch=True)
    p = o.page
    expect(p.locator("#usage-table tbody tr")).to_have_count(len(server.spent), timeout=10_000)
    p.locator("#usage").scroll_into_view_if_needed()
    assert p.evaluate("document.documentElement.scrollWidth") <= 375
    box = p.locator("#usage-plot svg").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375
    screenshot(p, "phone")


def test_the_pages_usage_polling_is_not_listed_as_a_request(server):
    usage_api(server, ROOTKEY)  # as the page asks, every 30 s while it is open
    req = urllib.request.Request(server.url + "/dashboard/live", headers={"Authorization": f"Bearer {ROOTKEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:  # the stream goes on: its first snapshot
        assert r.readline() == b"event: snapshot\n"
        snap = json.loads(r.readline().decode().removeprefix("data: "))
    assert [e["endpoint"] for e in snap["recent"] if "usage" in e["endpoint"]] == []


@pytest.mark.parametrize("since", ["nan", "inf", "1e300"])
def test_a_time_out_of_range_is_refused_as_a_bad_request(server, since):
    status, body = server.get(f"/usage?since={since}", headers={"Authorization": f"Bearer {ROOTKEY}"})
    assert status == 400 and body["error"]["param"] == "since"
