"""The page's Requests section in a real browser: Debian's Chromium driven by Playwright, against
the real `gguf-gateway serve` with ``server.capture`` on and real llama.cpp workers on scripted
models: the captured requests listed, one opened (its messages, tools, thinking, content, calls,
timings and stream), replayed on another model beside the original, and copied as curl.

Skipped, with the reason, where Playwright or a Chromium is missing (as the dashboard's test)."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers import WEATHER, Console, ServerProcess, agent_model

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
expect = sync_api.expect

KEY = "s3cret"
SHOTS = os.environ.get("GGUF_GATEWAY_SHOTS")  # a folder to keep the screenshots in; else the test's tmp


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("captures-page")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two make four.", "It is 4.")
    agent_model(d / "caller.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  models_dirs: []\n  discover_default_stores: false\n  api_keys: [{KEY}]\n"
                   f"  capture: true\n"
                   f"models:\n  chat: {d / 'plain.gguf'}\n  thinker: {d / 'thinker.gguf'}\n"
                   f"  caller: {d / 'caller.gguf'}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv
    assert srv.proc.returncode == 0


def call(server, path: str, body: dict | None = None) -> bytes:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def captures(server, **filters) -> list[dict]:
    return json.loads(call(server, "/captures?" + urllib.parse.urlencode(filters)))["data"]


@pytest.fixture(scope="module")
def traffic(server):
    """A streamed chat with a thinking model and a tool-calling one, captured; their ids."""
    call(server, "/v1/chat/completions", {"model": "thinker", "stream": True, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is two and two?"}]})
    call(server, "/v1/chat/completions", {"model": "caller", "tools": [WEATHER], "max_tokens": 40,
                                          "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    return {"thinker": captures(server, model="thinker")[-1]["id"], "caller": captures(server, model="caller")[-1]["id"]}


@pytest.fixture
def open_page(browser, server):
    """open_page(**context options) -> the page, its key already given; no console errors by the end."""
    opened = []

    def open_(allow: tuple[int, ...] = (), **options):
        context = browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **options})
        context.add_init_script(f"sessionStorage.setItem('gguf-gateway-key', {json.dumps(KEY)})")
        p = context.new_page()
        console = Console(p, allow=allow)
        opened.append((context, console))
        p.goto(server.url + "/")
        expect(p.locator("#app")).to_be_visible()
        expect(p.locator("#conn-status")).to_have_text("Live")
        return p

    yield open_
    for context, console in opened:
        context.close()
        assert console.errors == []


def shot(page, tmp_path: Path, name: str) -> Path:
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.evaluate("document.querySelector('.topbar').style.position = 'static'")  # not over the section
    page.locator("#requests").screenshot(path=str(path), animations="disabled")  # the section, to look at
    page.evaluate("document.querySelector('.topbar').style.position = ''")
    return path


def capture_row(page, capture_id: str):
    return page.locator(f'#captures tbody tr[data-capture="{capture_id}"]')


def open_capture(page, capture_id: str):
    page.get_by_role("link", name="Requests", exact=True).click()
    row = capture_row(page, capture_id)
    expect(row).to_be_visible(timeout=10_000)
    row.locator("button.cap-open").click()
    detail = page.locator("#cap-detail")
    expect(detail.locator("#cap-answer .cap-answer")).to_be_visible(timeout=10_000)
    return detail


def test_the_list_shows_the_captured_requests_newest_first(open_page, server, traffic):
    page = open_page()
    page.get_by_role("link", name="Requests", exact=True).click()
    want = captures(server)
    rows = page.locator("#captures tbody tr[data-capture]")
    expect(rows.first).to_be_visible(timeout=10_000)
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.capture)") == [c["id"] for c in want]
    thinker = capture_row(page, traffic["thinker"])
    expect(thinker.locator(".c-route")).to_have_text("/v1/chat/completions")
    expect(thinker.locator(".c-model")).to_have_text("thinker")
    expect(thinker.locator(".c-key")).to_have_text(next(c for c in want if c["id"] == traffic["thinker"])["key"])
    expect(thinker.locator(".c-status")).to_have_text("200")
    expect(thinker.locator(".c-stream")).to_have_text("stream")
    expect(thinker.locator(".c-ttft")).to_have_text(re.compile(r"^\d[\d,]* ms$"))
    expect(capture_row(page, traffic["caller"]).locator(".c-stream")).to_have_text("whole")
    expect(page.locator("#cap-store")).to_contain_text("kept")
    # a filter asks the server again
    page.fill("#cap-model", "caller")
    expect(rows).to_have_count(len(captures(server, model="caller")))
    expect(rows.first).to_have_attribute("data-capture", traffic["caller"])
    page.fill("#cap-model", "")
    page.select_option("#cap-status", "4xx")
    expect(page.locator("#captures-empty")).to_have_text("No captured requests match these filters.")
    page.select_option("#cap-status", "")
    expect(rows).to_have_count(len(captures(server)))
    # a new request shows without a refresh, after the live data tells of it
    call(server, "/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    newest = captures(server)[0]["id"]
    expect(rows.first).to_have_attribute("data-capture", newest, timeout=15_000)


def test_a_streamed_capture_opened_shows_its_messages_thinking_content_and_timeline(open_page, server, traffic,
                                                                                   tmp_path):
    page = open_page()
    detail = open_capture(page, traffic["thinker"])
    expect(capture_row(page, traffic["thinker"])).to_have_class(re.compile(r"\bselected\b"))
    expect(detail.locator("#cap-title")).to_have_text("POST /v1/chat/completions")
    expect(detail.locator("#cap-meta")).to_contain_text(traffic["thinker"])
    msgs = detail.locator("#cap-request .cap-msg")
    expect(msgs).to_have_count(2)
    expect(msgs.nth(0).locator(".cap-role")).to_have_text("system")
    expect(msgs.nth(0).locator(".cap-text")).to_have_text("Be brief.")
    expect(msgs.nth(1).locator(".cap-role")).to_have_text("user")
    expect(msgs.nth(1).locator(".cap-text")).to_have_text("What is two and two?")
    expect(detail.locator("#cap-request .cap-params")).to_contain_text("stream true")
    answer = detail.locator("#cap-answer")
    expect(answer.locator(".thinking-text")).to_have_text("Two and two make four.")
    expect(answer.locator(".thinking-text")).to_be_visible()
    expect(answer.locator(".cap-content")).to_have_text("It is 4.")
    expect(answer.locator(".cap-finish")).to_have_text("finish: stop")
    summary = next(c for c in captures(server) if c["id"] == traffic["thinker"])
    stats = detail.locator("#cap-timing")
    expect(stats.locator(".cap-stat", has_text="TTFT").locator("dd")).to_have_text(
        f"{round(summary['time_to_first_token_s'] * 1000):,} ms")
    expect(stats.locator(".cap-stat", has_text="Completion tokens").locator("dd")).to_contain_text(
        str(summary["completion_tokens"]))
    expect(stats.locator(".cap-stat", has_text="Prompt tokens").locator("dd")).to_have_text(
        str(summary["prompt_tokens"]))
    # the stream: each write with its time, the last one the [DONE]
    timeline = detail.locator("#cap-timeline tbody tr")
    expect(detail.locator("#cap-stream")).to_be_visible()
    assert timeline.count() >= 2
    expect(timeline.last.locator(".tl-data")).to_have_text("data: [DONE]")
    expect(timeline.first.locator(".tl-at")).to_have_text(re.compile(r"^[\d,.]+ ms$"))
    expect(detail.locator("#cap-stream-sub")).to_contain_text(f"{timeline.count()} writes")
    # the raw bodies, on demand
    detail.locator("#cap-raw summary").click()
    expect(detail.locator("#cap-raw-body")).to_contain_text('"content": "What is two and two?"')
    expect(detail.locator("#cap-raw-body")).to_contain_text("data: [DONE]")
    path = shot(page, tmp_path, "requests-stream")
    assert path.stat().st_size > 10_000
    page.emulate_media(color_scheme="dark")
    shot(page, tmp_path, "requests-stream-dark")
    # closed, the focus goes back to its row
    page.click("#cap-close")
    expect(detail).to_be_hidden()
    expect(capture_row(page, traffic["thinker"]).locator("button.cap-open")).to_be_focused()


def test_a_tool_calling_capture_shows_the_tools_offered_and_the_call_made(open_page, traffic):
    page = open_page()
    detail = open_capture(page, traffic["caller"])
    expect(detail.locator("#cap-request .cap-tools .cap-chip")).to_have_text(["get_weather"])
    expect(detail.locator("#cap-request .cap-msg .cap-text")).to_have_text(["Weather in Paris?"])
    call_box = detail.locator("#cap-answer .tool-call")
    expect(call_box).to_have_count(1)
    expect(call_box.locator(".tool-name")).to_have_text("get_weather")
    assert json.loads(call_box.locator(".tool-args").inner_text()) == {"city": "Paris"}
    expect(detail.locator("#cap-answer .cap-finish")).to_have_text("finish: tool_calls")
    expect(detail.locator("#cap-stream")).to_be_hidden()  # a whole answer: no timeline


WIRES = [  # (route, body, the turns shown: (role, text)) for each wire's own shape
    ("/v1/messages", {"model": "chat", "max_tokens": 16, "system": [{"type": "text", "text": "Answer in French."}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]},
     [("system", "Answer in French."), ("user", "Say hello.")]),
    ("/v1/responses", {"model": "chat", "instructions": "Be terse.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Greet me."}]}]},
     [("instructions", "Be terse."), ("user", "Greet me.")]),
    ("/api/chat", {"model": "chat", "stream": False, "messages": [{"role": "user", "content": "Hi there."}]},
     [("user", "Hi there.")]),
    ("/api/generate", {"model": "chat", "stream": False, "system": "You are a poet.", "prompt": "Write a line."},
     [("system", "You are a poet."), ("prompt", "Write a line.")]),
]


def test_each_wires_request_shows_its_own_turns(open_page, server):
    ids = {}
    for route, body, _ in WIRES:
        call(server, route, body)
        ids[route] = captures(server, route=route)[0]["id"]
    page = open_page()
    for route, _, turns in WIRES:
        detail = open_capture(page, ids[route])
        expect(detail.locator("#cap-title")).to_have_text(f"POST {route}")
        msgs = detail.locator("#cap-request .cap-msg")
        expect(msgs.locator(".cap-role")).to_have_text([role for role, _ in turns])
        expect(msgs.locator(".cap-text")).to_have_text([text for _, text in turns])
        expect(detail.locator("#cap-answer .cap-content")).to_have_text("Hello, world!")


def test_a_replay_on_another_model_shows_both_answers_side_by_side(open_page, server, traffic, tmp_path):
    call(server, "/models/unload", {"model": "chat"})  # the replay loads it: long enough to see it busy
    page = open_page()
    detail = open_capture(page, traffic["thinker"])
    expect(page.locator("#cap-replay-model")).to_have_value("thinker")  # the capture's own by default
    page.select_option("#cap-replay-model", "chat")
    page.click("#cap-replay")
    expect(page.locator("#cap-replay")).to_have_text("Replaying…")
    expect(page.locator("#cap-replay")).to_have_attribute("aria-disabled", "true")
    compare = detail.locator("#cap-compare")
    replay = compare.locator(".side-replay")
    expect(replay.locator(".cap-content")).to_have_text("Hello, world!", timeout=30_000)
    expect(page.locator("#cap-replay")).to_have_text("Replay")
    again = captures(server, model="chat")
    again = next(c for c in again if c.get("replay_of") == traffic["thinker"])
    original = compare.locator(".side-original")
    expect(original.locator(".cap-side-id")).to_have_text(traffic["thinker"])
    expect(original.locator(".cap-side-model")).to_have_text("thinker")
    expect(original.locator(".thinking-text")).to_have_text("Two and two make four.")
    expect(original.locator(".cap-content")).to_have_text("It is 4.")
    expect(replay.locator(".cap-side-id")).to_have_text(again["id"])
    expect(replay.locator(".cap-side-model")).to_have_text("chat")
    for side, summary in ((original, next(c for c in captures(server) if c["id"] == traffic["thinker"])),
                          (replay, again)):
        expect(side.locator(".cap-stat dt")).to_have_text(["TTFT", "Duration", "Tokens/s", "Completion tokens"])
        expect(side.locator(".cap-stat", has_text="TTFT").locator("dd")).to_have_text(
            f"{round(summary['time_to_first_token_s'] * 1000):,} ms")
        expect(side.locator(".cap-stat", has_text="Completion tokens").locator("dd")).to_have_text(
            str(summary["completion_tokens"]))
    # side by side on a wide screen: the same top, the replay to the right
    a, b = original.bounding_box(), replay.bounding_box()
    assert a and b and abs(a["y"] - b["y"]) < 2 and b["x"] > a["x"] + a["width"] - 1
    expect(compare.locator(".cap-same")).to_contain_text("differs")
    expect(page.locator("#cap-replay-status")).to_contain_text(again["id"])
    # the replay joins the list, marked
    expect(capture_row(page, again["id"]).locator(".replay-badge")).to_be_visible(timeout=10_000)
    compare.scroll_into_view_if_needed()
    shot(page, tmp_path, "requests-replay")
    # and opens from there, naming its original
    replay.get_by_role("button", name=f"Open the replay's capture {again['id']}").click()
    expect(detail.locator("#cap-meta")).to_contain_text(again["id"])
    expect(detail.get_by_role("button", name=f"Open the original capture {traffic['thinker']}")).to_be_visible()
    expect(detail.locator("#cap-answer .cap-content")).to_have_text("Hello, world!")


def test_a_failed_replay_shows_its_error(open_page, traffic):
    page = open_page(allow=(409,))
    message = "This capture's request was cut at server.capture.max_body_bytes, so it cannot be sent again"
    page.route("**/captures/*/replay", lambda route: route.fulfill(
        status=409, content_type="application/json",
        body=json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": "capture_cut"}})))
    detail = open_capture(page, traffic["caller"])
    page.click("#cap-replay")
    alert = detail.locator("#cap-compare .side-replay [role=alert]")
    expect(alert).to_have_text(f"Replay failed: {message}")
    expect(detail.locator("#cap-compare .side-original .tool-name")).to_have_text("get_weather")
    expect(page.locator("#cap-replay-status")).to_contain_text("failed")
    expect(page.locator("#cap-replay")).to_be_enabled()


def test_copy_as_curl_copies_the_command(open_page, server, traffic):
    page = open_page(permissions=["clipboard-read", "clipboard-write"])
    detail = open_capture(page, traffic["thinker"])
    page.click("#cap-copy")
    expect(page.locator("#cap-copy-status")).to_contain_text("Copied the curl command")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("curl ") and f"{server.url}/v1/chat/completions" in copied
    assert "$GGUF_GATEWAY_API_KEY" in copied and KEY not in copied
    expect(detail.locator("#cap-curl")).to_have_value(copied)


def test_copy_as_curl_without_a_clipboard_selects_the_command(open_page, traffic):
    page = open_page()
    page.add_init_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    page.reload()
    expect(page.locator("#conn-status")).to_have_text("Live")
    detail = open_capture(page, traffic["thinker"])
    page.click("#cap-copy")
    field = detail.locator("#cap-curl")
    expect(field).to_be_visible()
    expect(field).to_be_focused()
    expect(page.locator("#cap-copy-status")).to_contain_text("press Ctrl+C")
    selected = page.evaluate("(() => { const t = document.getElementById('cap-curl');"
                             " return t.value.slice(t.selectionStart, t.selectionEnd); })()")
    assert selected.startswith("curl ") and "/v1/chat/completions" in selected


def test_capture_off_says_how_to_turn_it_on(open_page):
    page = open_page()
    page.route(re.compile(r"/captures\?"), lambda route: route.fulfill(
        status=200, content_type="application/json",
        body=json.dumps({"object": "list", "enabled": False, "redact_content": False, "count": 0, "bytes": 0,
                         "max_bytes": 64 << 20, "data": []})))
    page.reload()
    off = page.locator("#cap-off")
    expect(off).to_be_visible()
    expect(off).to_contain_text("Capture is off")
    expect(off).to_contain_text("server: {capture: true}")
    expect(page.locator("#cap-filters")).to_be_hidden()
    expect(page.locator("#captures-wrap")).to_be_hidden()


def test_the_keyboard_reaches_and_works_the_section(open_page, server, traffic):
    page = open_page()
    unnamed = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
        .map(e => e.outerHTML.slice(0, 80))""")
    assert unnamed == []
    expect(page.locator("#captures tbody tr").first).to_be_visible(timeout=10_000)
    ids = [c["id"] for c in captures(server)]
    page.focus("#cap-refresh")
    page.keyboard.press("Tab")  # the list's scroller
    page.keyboard.press("Tab")  # one row's button stands for the list in the Tab order
    first = capture_row(page, ids[0]).locator("button.cap-open")
    expect(first).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(capture_row(page, ids[1]).locator("button.cap-open")).to_be_focused()
    page.keyboard.press("Tab")  # past the list: the rest of the rows are not Tab stops
    assert page.evaluate("document.activeElement.classList.contains('cap-open')") is False
    page.keyboard.press("Shift+Tab")
    expect(capture_row(page, ids[1]).locator("button.cap-open")).to_be_focused()
    page.keyboard.press("Enter")
    detail = page.locator("#cap-detail")
    expect(detail).to_be_focused()
    expect(detail.locator("#cap-meta")).to_contain_text(ids[1])
    reached = set()
    for _ in range(30):
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.id || document.activeElement.className"))
    assert {"cap-copy", "cap-close", "cap-replay-model"} <= reached, reached
    page.focus("#cap-copy")
    page.keyboard.press("Escape")  # closes it, the focus back on its row
    expect(detail).to_be_hidden()
    expect(capture_row(page, ids[1]).locator("button.cap-open")).to_be_focused()


def test_a_phones_width_does_not_scroll_sideways(open_page, server, traffic, tmp_path):
    page = open_page(viewport={"width": 375, "height": 812}, is_mobile=True, has_touch=True)
    detail = open_capture(page, traffic["thinker"])
    page.select_option("#cap-replay-model", "chat")
    page.click("#cap-replay")
    expect(detail.locator("#cap-compare .side-replay .cap-content")).to_have_text("Hello, world!", timeout=30_000)
    page.click("#cap-copy")
    expect(page.locator("#cap-copy-status")).not_to_be_empty()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    for part in ("#cap-detail", "#cap-compare .side-original", "#cap-compare .side-replay", "#cap-timeline"):
        box = page.locator(part).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, (part, box)
    a = page.locator("#cap-compare .side-original").bounding_box()
    b = page.locator("#cap-compare .side-replay").bounding_box()
    assert a and b and b["y"] >= a["y"] + a["height"]  # one above the other
    shot(page, tmp_path, "requests-phone")
