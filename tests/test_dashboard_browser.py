"""The page at / in a real browser: Debian's Chromium driven by Playwright, against the real
`gguf-gateway serve` process and real llama.cpp workers on scripted models.

Skipped, with the reason, where Playwright or a Chromium is missing (``./scripts/test``
installs both where it can: Playwright from the test extra, Chromium from the system's packages);
nothing here downloads a browser. ``GGUF_GATEWAY_CHROMIUM`` names another Chromium binary."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse
import urllib.request

import pytest
from helpers import Console, ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
expect = sync_api.expect

KEY = "s3cret"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("page")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two make four.", "It is 4.")
    tm.endless(d / "loop.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  models_dirs: [{d}]\n  discover_default_stores: false\n  api_keys: [{KEY}]\n"
                   f"models:\n  chat:\n    path: {d / 'plain.gguf'}\n    aliases: [chat:latest]\n"
                   f"  loop:\n    path: {d / 'loop.gguf'}\n    n_ctx: 131072\n    parallel: 1\n"  # outlasts the test
                   f"  drafting:\n    path: {d / 'loop.gguf'}\n    spec_type: ngram\n    parallel: 1\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv
    assert srv.proc.returncode == 0


def api(server, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def models(server) -> dict[str, dict]:
    return {m["id"]: m for m in api(server, "/models")["data"]}


@pytest.fixture
def page(browser, server):
    """The page, its key given once through its form; no console errors by the test's end."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    console = log_in(p, server)
    yield p
    context.close()
    assert console.errors == []


def log_in(p, server) -> Console:
    """Open the page and give it the key through its form; the page's console from then on."""
    console = Console(p)
    p.goto(server.url + "/")
    expect(p.locator("#key-form")).to_be_visible()
    expect(p.locator("#key-input")).to_be_focused()
    p.fill("#key-input", KEY)
    p.press("#key-input", "Enter")
    expect(p.locator("#app")).to_be_visible()
    expect(p.locator("#conn-status")).to_have_text("Live")
    # the page's first look, without a key, was refused: Chromium logged that 401 itself
    assert [e for e in console.errors if "status of 401" not in e] == []
    console.errors.clear()
    return console


def row(page, name: str):
    return page.locator(f'#models tbody tr[data-model="{name}"]')


def test_the_model_table_matches_models(page, server):
    api(server, "/models/load", {"model": "thinker"})
    want = models(server)
    rows = page.locator("#models tbody tr[data-model]")
    expect(rows).to_have_count(len(want))
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.model)")) == sorted(want)
    for name, m in want.items():
        r = row(page, name)
        expect(r.locator(".m-state")).to_have_text(m["state"])
        expect(r.locator(".m-source")).to_have_text(m["source"])
        expect(r.locator(".m-arch")).to_contain_text(m["architecture"])
        expect(r.locator(".m-file")).to_contain_text(m["path"].rsplit("/", 1)[-1])
    expect(row(page, "chat").locator(".m-name")).to_contain_text("chat:latest")  # aliases beside the name
    thinker = want["thinker"]
    expect(row(page, "thinker").locator(".m-device")).to_have_text(thinker["device"])
    expect(row(page, "thinker").locator(".m-slots")).to_have_text(f"0/{thinker['slots']['total']}")
    expect(row(page, "thinker").locator(".m-queue")).to_have_text("0")
    expect(row(page, "thinker").locator(".m-memory")).to_have_text(re.compile(r"\d+(\.\d+)? (KiB|MiB|GiB)"))
    page.fill("#model-filter", "THINK")
    expect(rows.locator("visible=true")).to_have_count(1)
    page.fill("#model-filter", "chat:latest")  # an alias finds its model
    expect(rows.locator("visible=true")).to_have_count(1)
    page.fill("#model-filter", "")
    expect(rows.locator("visible=true")).to_have_count(len(want))


def test_a_speculating_models_requests_show_the_drafts_it_kept(page, server):
    answer = api(server, "/v1/completions", {"model": "drafting", "prompt": "\n", "max_tokens": 40, "temperature": 0})
    told = answer["usage"]["speculation"]
    assert told["drafted"] > 0
    share = round(100 * told["accepted"] / told["drafted"])
    cell = page.locator("#recent tbody tr", has_text="drafting").first.locator("td.r-tokens")
    expect(cell).to_contain_text(f"{share}% of {told['drafted']} drafts kept", timeout=10_000)
    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        metrics = r.read().decode()
    for name, n in (("drafted", told["drafted"]), ("accepted", told["accepted"])):
        assert f'gguf_gateway_{name}_tokens_total{{model="drafting"}} {float(n)}' in metrics


def test_load_and_unload_change_a_models_state(page, server):
    if models(server)["chat"]["state"] != "unloaded":
        api(server, "/models/unload", {"model": "chat"})
    r = row(page, "chat")
    expect(r.locator(".m-state")).to_have_text("unloaded")
    expect(r.locator("button.unload")).to_be_disabled()
    page.get_by_role("button", name="Load chat", exact=True).click()
    expect(r.locator(".m-state")).to_have_text("ready", timeout=20_000)
    assert models(server)["chat"]["state"] == "ready"
    expect(r.locator("button.load")).to_be_disabled()
    page.get_by_role("button", name="Unload chat", exact=True).click()
    expect(r.locator(".m-state")).to_have_text("unloaded", timeout=20_000)
    assert models(server)["chat"]["state"] == "unloaded"


def test_a_playground_chat_streams_its_answer_with_the_thinking_folded_apart(page, server):
    page.select_option("#pg-model", "thinker")
    page.fill("#pg-system", "Be brief.")
    page.fill("#pg-input", "What is two and two?")
    page.click("#pg-send")
    answer = page.locator("#pg-transcript .msg.assistant").last
    expect(answer.locator(".stats")).to_contain_text("completion tokens", timeout=20_000)
    expect(answer.locator(".content")).to_have_text("It is 4.")
    thinking = answer.locator("details.thinking")
    expect(thinking).to_have_count(1)
    assert thinking.get_attribute("open") is None  # folded
    expect(answer.locator(".thinking-text")).to_have_text("Two and two make four.")
    expect(answer.locator(".thinking-text")).to_be_hidden()
    thinking.locator("summary").click()
    expect(answer.locator(".thinking-text")).to_be_visible()
    expect(answer.locator(".stats")).to_have_text(re.compile(r"\d+ prompt \+ \d+ completion tokens · [\d.]+ tok/s"))
    # the request shows in the live data: the recent table and the charts, over the live stream
    expect(page.locator("#recent tbody tr").first).to_contain_text("thinker", timeout=10_000)


def test_the_stop_button_cancels_the_request(page, server):
    page.select_option("#pg-model", "loop")
    page.fill("#pg-input", "go on forever")
    page.click("#pg-send")
    answer = page.locator("#pg-transcript .msg.assistant").last
    expect(answer.locator(".content")).to_contain_text("tick", timeout=20_000)
    expect(page.locator("#pg-stop")).to_be_enabled()
    assert models(server)["loop"]["in_flight"] == 1
    page.click("#pg-stop")
    expect(answer).to_have_class(re.compile(r"\bstopped\b"))
    expect(page.locator("#pg-send")).to_be_enabled()
    deadline = time.monotonic() + 10
    while models(server)["loop"]["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert models(server)["loop"]["in_flight"] == 0  # the gateway saw the client leave and stopped


def test_a_wrong_key_is_refused(browser, server):
    context = browser.new_context()
    p = context.new_page()
    console = Console(p, allow=(401,))
    p.goto(server.url + "/")
    expect(p.locator("#key-form")).to_be_visible()
    expect(p.locator("#app")).to_be_hidden()
    assert p.locator("#models tbody tr").count() == 0  # nothing shown without a key
    p.fill("#key-input", "wrong")
    p.click("#key-submit")
    expect(p.locator("#key-error")).to_contain_text("refused")
    expect(p.locator("#app")).to_be_hidden()
    assert p.evaluate("sessionStorage.length") == 0
    context.close()
    assert console.errors == []


def test_the_key_is_kept_for_the_browser_session(page, server):
    page.reload()
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#key-form")).to_be_hidden()


def test_a_phones_width_does_not_scroll_sideways(browser, server):
    context = browser.new_context(viewport={"width": 375, "height": 812}, is_mobile=True, has_touch=True)
    p = context.new_page()
    console = log_in(p, server)
    expect(p.locator("#models tbody tr[data-model]").first).to_be_visible()
    assert p.evaluate("document.documentElement.scrollWidth") <= 375
    wrap = p.locator("#models").locator("xpath=..")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth")  # each model a card, not a wide table
    state = row(p, "thinker").locator(".m-state").bounding_box()
    assert state is not None and state["x"] >= 0 and state["x"] + state["width"] <= 375
    context.close()
    assert console.errors == []


def test_every_control_has_a_name_and_the_keyboard_reaches_it(page):
    unnamed = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
        .map(e => e.outerHTML.slice(0, 80))""")
    assert unnamed == []
    page.focus("#model-filter")
    reached = set()
    for _ in range(60):  # Tab walks the page in order: the filter, then the first model's buttons
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.getAttribute('aria-label') || document.activeElement.id"))
    assert {"Load chat", "pg-model", "pg-input", "pg-send"} <= reached, reached
    page.focus("#pg-input")
    page.fill("#pg-input", "hi")
    page.select_option("#pg-model", "chat")
    page.press("#pg-input", "Control+Enter")  # sends without the mouse
    expect(page.locator("#pg-transcript .msg.assistant .content").last).to_have_text("Hello, world!", timeout=20_000)


def test_light_and_dark(browser, server):
    colors = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(color_scheme=scheme)
        p = context.new_page()
        log_in(p, server)
        colors[scheme] = p.evaluate("""() => { const s = getComputedStyle(document.body);
            const lum = c => { const [r, g, b] = c.match(/\\d+/g).map(Number); return (r + g + b) / 3; };
            return [lum(s.backgroundColor), lum(s.color)]; }""")
        context.close()
    (light_bg, light_text), (dark_bg, dark_text) = colors["light"], colors["dark"]
    assert light_bg > 200 and light_text < 80 and dark_bg < 60 and dark_text > 180, colors


def test_the_queues_card_shows_who_waits_for_a_busy_model(page, server):
    """The loop model has one slot: one endless generation holds it and three more wait. The
    Queues card shows the model, its slot taken, the three waiting by key and priority with the
    longest wait; once the clients leave, the queue empties and the card says so."""
    assert models(server)["loop"]["in_flight"] == 0
    url = urllib.parse.urlsplit(server.url)
    body = json.dumps({"model": "loop", "messages": [{"role": "user", "content": "go"}], "max_tokens": 100_000,
                       "stream": True})
    conns = []
    try:
        for _ in range(4):
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            conns.append(conn)
            if len(conns) == 1:  # the first holds the slot before the others come
                deadline = time.monotonic() + 20
                while models(server)["loop"]["in_flight"] != 1 and time.monotonic() < deadline:
                    time.sleep(0.05)
        group = page.locator('#queues tbody[data-model="loop"]')
        expect(group.locator(".q-slots")).to_have_text("1/1", timeout=20_000)
        expect(group.locator(".q-waiting")).to_have_text("3")
        expect(group.locator(".q-state")).to_have_text("open")
        waiting = group.locator("tr[data-key]")
        expect(waiting).to_have_count(1)
        expect(waiting.locator(".q-priority")).to_have_text("normal")
        expect(waiting.locator(".q-count")).to_have_text("3")
        expect(waiting.locator(".q-longest")).to_have_text(re.compile(r"^\d+(\.\d+)? (ms|s)$"))
        queues = api(server, "/admin/queues")["queues"]
        (loop,) = [q for q in queues if q["model"] == "loop"]
        expect(waiting.locator(".q-key")).to_have_text(loop["queue"][0]["key"])
    finally:
        for conn in conns:  # the clients leave: the running one is stopped, the waiting ones dropped
            if conn.sock is not None:
                conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
    expect(page.locator("#queues-empty")).to_be_visible(timeout=20_000)
    expect(page.locator('#queues tbody[data-model="loop"]')).to_have_count(0)
    assert models(server)["loop"]["in_flight"] == 0
