"""Pulling a model by name from the page at /, in a real browser: Debian's Chromium driven by
Playwright, against the real `gguf-gateway serve` process and a Hugging Face hub on loopback
(tests/hubserver.py), so nothing leaves the machine.

The page POSTs /models/pull and reads its NDJSON progress; its Downloads list is drawn from the
live snapshots' ``pulls``, so a pull started elsewhere shows too; Cancel POSTs /models/pull/cancel;
a finished pull's model appears in the models table (the gateway rescans its stores).

Skipped, with the reason, where Playwright or a Chromium is missing (see test_dashboard_browser.py).
``GGUF_GATEWAY_SCREENSHOTS`` names a folder to keep screenshots of the Downloads area in."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

import pytest
from helpers import Console, ServerProcess
from hubserver import Hub

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
expect = sync_api.expect

KEY = "s3cret"
REPO = "acme/Tiny-GGUF"
OTHER = "acme/Other-GGUF"
PADDING = 5 * 2**20  # a few MiB at RATE: long enough to watch the bar grow and to cancel it midway
RATE = 500_000  # bytes a second from the CDN while a test watches a pull run: ~10 s for the whole file


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hubfiles")
    tiny = d / "tiny-Q4_K_M.gguf"
    tm.plain(tiny, ["Hello", " there"])
    with tiny.open("ab") as f:  # bytes past the tensors, which readers of the header never reach
        f.write(b"\0" * PADDING)
    tm.plain(d / "other-Q8_0.gguf", ["Something", " else"])
    return d


@pytest.fixture(scope="module")
def hub(models_dir):
    with Hub() as h:
        h.add_hf_repo(REPO, {"tiny-Q4_K_M.gguf": models_dir / "tiny-Q4_K_M.gguf",
                             "README.md": b"# Tiny\n"})
        h.add_hf_repo(OTHER, {"other-Q8_0.gguf": models_dir / "other-Q8_0.gguf"})
        yield h


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub):
    home = tmp_path_factory.mktemp("home")  # pulls land in HOME/.cache/huggingface/hub
    cfg = home / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: true\n  api_keys: [{KEY}]\n")
    env = {"HOME": str(home), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1",
           # the stores are HOME's alone, whatever the environment running the tests says
           "HF_HOME": "", "HF_HUB_CACHE": "", "OLLAMA_MODELS": "", "LLAMA_CACHE": "", "HF_TOKEN": "",
           "HF_HUB_OFFLINE": ""}
    with ServerProcess("--config", str(cfg), env=env) as srv:
        srv.home = home
        yield srv
    assert srv.proc.returncode == 0


def api(server, path: str, body: dict | None = None, timeout: float = 60) -> dict:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def pulls(server) -> dict[str, dict]:
    return {p["asked"]: p for p in api(server, "/models")["pulls"]}


def open_page(browser, server, allow: tuple[int, ...] = (), **context_args):
    context = browser.new_context(**({"viewport": {"width": 1280, "height": 900}} | context_args))
    p = context.new_page()
    console = Console(p, allow=(401, *allow))  # its first look, without a key, is refused
    p.goto(server.url + "/")
    p.fill("#key-input", KEY)
    p.press("#key-input", "Enter")
    expect(p.locator("#app")).to_be_visible()
    expect(p.locator("#conn-status")).to_have_text("Live")
    return context, p, console


@pytest.fixture
def page(browser, server):
    context, p, console = open_page(browser, server)
    yield p
    context.close()
    assert console.errors == []


def screenshot(page, name: str) -> None:
    folder = os.environ.get("GGUF_GATEWAY_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.locator("#downloads").scroll_into_view_if_needed()
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def item(page, asked: str):
    return page.locator(f'#pulls li.pull[data-pull="{asked}"]')


def bar_value(page, asked: str) -> float:
    return item(page, asked).locator("progress.file-progress").evaluate("b => b.value")


def wait_bar_above(page, asked: str, value: float, timeout: float = 20_000) -> float:
    page.wait_for_function(
        """([asked, v]) => { const li = [...document.querySelectorAll('#pulls li.pull')]
             .find(e => e.dataset.pull === asked);
           const b = li && li.querySelector('progress.file-progress');
           return !!b && b.hasAttribute('value') && b.value > v; }""",
        arg=[asked, value], timeout=timeout)
    return bar_value(page, asked)


def test_the_downloads_area_is_empty_and_the_form_asks_for_a_name(page):
    expect(page.locator("#pulls-empty")).to_be_visible()
    expect(page.locator("#pulls")).to_be_hidden()
    expect(page.get_by_label("insecure (http registry)")).not_to_be_checked()
    page.click("#pull-submit")
    expect(page.locator("#pull-status")).to_have_text("Enter the name of a model to pull.")
    expect(page.locator("#pull-status")).to_have_class(re.compile(r"\berror\b"))
    expect(page.locator("#pull-name")).to_be_focused()
    expect(page.locator("#pull-name")).to_have_attribute("aria-invalid", "true")


def test_a_name_the_gateway_refuses_shows_its_message(browser, server):
    context, p, console = open_page(browser, server, allow=(400, 404))
    sent: list[dict] = []
    p.on("request", lambda r: sent.append({"url": r.url, "headers": r.headers, "body": r.post_data})
         if r.url.endswith("/models/pull") else None)
    p.fill("#pull-name", "bad name")
    p.click("#pull-submit")
    status = p.locator("#pull-status")
    expect(status).to_contain_text("Could not pull bad name:")
    expect(status).to_contain_text("white space")  # the gateway's own words
    expect(status).to_have_class(re.compile(r"\berror\b"))
    p.fill("#pull-name", "hf.co/acme/Nothing-GGUF")
    p.check("#pull-insecure")
    p.click("#pull-submit")
    expect(status).to_contain_text("Could not pull hf.co/acme/Nothing-GGUF:")
    expect(status).to_contain_text("acme/Nothing-GGUF")
    assert json.loads(sent[0]["body"]) == {"model": "bad name", "insecure": False}
    assert json.loads(sent[1]["body"]) == {"model": "hf.co/acme/Nothing-GGUF", "insecure": True}
    assert all(s["headers"].get("authorization") == f"Bearer {KEY}" for s in sent)
    expect(p.locator("#pull-name")).to_have_value("hf.co/acme/Nothing-GGUF")  # kept, to fix
    context.close()
    assert console.errors == []


def test_a_pull_started_elsewhere_shows_in_the_list(page, server, hub):
    hub.faults.rate = None
    done = api(server, "/models/pull", {"model": OTHER, "stream": False})  # as the CLI or another tab would
    assert done["status"] == "success"
    other = item(page, OTHER)
    expect(other).to_have_attribute("data-state", "done", timeout=10_000)
    expect(other.locator(".pull-name")).to_have_text(f"hf.co/{OTHER}")
    expect(other.locator(".pull-asked")).to_have_text(f"asked as {OTHER}")
    expect(other.locator(".badge")).to_have_text("done")
    expect(other.locator(".pull-cancel")).to_be_hidden()  # nothing left to cancel
    expect(other.locator(".pull-file-name")).to_have_text("other-Q8_0.gguf")
    bar = other.locator("progress.file-progress")
    assert bar.evaluate("b => b.value === b.max && b.max > 0")
    expect(page.locator("#pulls-empty")).to_be_hidden()
    expect(page.locator('#models tbody tr[data-model*="other"]')).to_have_count(1, timeout=10_000)


def test_a_pull_from_the_page_shows_its_progress_and_can_be_cancelled_then_lands_in_the_table(page, server, hub,
                                                                                               models_dir):
    size = (models_dir / "tiny-Q4_K_M.gguf").stat().st_size
    hub.faults.rate = RATE
    try:
        page.fill("#pull-name", REPO)
        page.click("#pull-submit")
        tiny = item(page, REPO)
        expect(tiny).to_have_attribute("data-state", "downloading", timeout=15_000)
        expect(tiny.locator(".pull-name")).to_have_text(f"hf.co/{REPO}")
        expect(tiny.locator(".badge")).to_have_text("downloading")
        bar = tiny.locator("progress.file-progress")
        expect(bar).to_have_count(1)  # the one GGUF the pull fetches: one bar
        expect(tiny.locator(".pull-file-name")).to_have_text("tiny-Q4_K_M.gguf")
        assert bar.evaluate("b => b.max") == size
        first = wait_bar_above(page, REPO, 0)
        later = wait_bar_above(page, REPO, first)  # it grows as the bytes come
        assert 0 < first < later < size
        expect(tiny.locator(".pull-file-bytes")).to_contain_text(re.compile(r"[\d.]+ MiB of [\d.]+ MiB \(\d+%\)"))
        expect(tiny.locator(".pull-meta")).to_contain_text(re.compile(r"huggingface .* of .* · [\d.]+ KiB/s"))
        expect(page.locator("#pull-status")).to_contain_text(f"Pulling hf.co/{REPO}: pulling")
        assert pulls(server)[REPO]["state"] == "downloading"
        screenshot(page, "downloading")

        page.get_by_role("button", name=f"Cancel pull of {REPO}", exact=True).click()
        expect(tiny).to_have_attribute("data-state", "cancelled", timeout=20_000)
        expect(tiny.locator(".badge")).to_have_text("cancelled")
        expect(tiny.locator(".pull-error")).to_contain_text("cancelled")
        expect(tiny.locator(".pull-cancel")).to_be_hidden()
        expect(page.locator("#pull-status")).to_have_text(f"Pull of {REPO} cancelled.")
        cancelled = pulls(server)[REPO]
        assert cancelled["state"] == "cancelled" and cancelled["error"]["code"] == "pull_cancelled"
        assert cancelled["completed"] < size
        expect(page.locator('#models tbody tr[data-model*="tiny"]')).to_have_count(0)
        screenshot(page, "cancelled")
    finally:
        hub.faults.rate = None

    page.fill("#pull-name", REPO)
    page.click("#pull-submit")
    expect(tiny).to_have_attribute("data-state", "done", timeout=30_000)
    expect(page.locator("#pull-status")).to_have_text(f"Pulled hf.co/{REPO}: it is in the models table.")
    expect(page.locator("#pull-name")).to_have_value("")
    expect(tiny.locator(".pull-error")).to_be_hidden()
    assert bar.evaluate("b => b.value === b.max") and bar.evaluate("b => b.max") == size
    row = page.locator('#models tbody tr[data-model*="tiny"]')
    expect(row).to_have_count(1, timeout=10_000)
    expect(row.locator(".m-state")).to_have_text("unloaded")
    expect(row.locator(".m-source")).to_have_text("huggingface")
    expect(row.locator("button.load")).to_be_enabled()
    # it answers to many spellings of its name: a few beside it, all of them in the tooltip and the filter
    expect(row.locator(".aliases")).to_contain_text(re.compile(r"\+\d+ more$"))
    assert f"hf.co/{REPO.lower()}" in row.locator(".aliases").get_attribute("title").split("\n")
    page.fill("#model-filter", f"hf.co/{REPO}")
    expect(page.locator("#models tbody tr[data-model]").locator("visible=true")).to_have_count(1)
    page.fill("#model-filter", "")
    assert pulls(server)[REPO]["state"] == "done"
    assert list((server.home / ".cache" / "huggingface" / "hub").glob("models--acme--Tiny-GGUF/snapshots/*/*.gguf"))
    screenshot(page, "done")


def test_a_phones_width_does_not_scroll_sideways_with_downloads_listed(browser, server):
    api(server, "/models/pull", {"model": OTHER, "stream": False})  # at least one row, whatever ran before
    context, p, console = open_page(browser, server, viewport={"width": 375, "height": 812}, is_mobile=True,
                                    has_touch=True)
    expect(item(p, OTHER)).to_have_attribute("data-state", "done", timeout=10_000)
    p.locator("#downloads").scroll_into_view_if_needed()
    assert p.evaluate("document.documentElement.scrollWidth") <= 375
    for box in (p.locator("#pull-submit").bounding_box(), item(p, OTHER).locator("progress").bounding_box()):
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375
    screenshot(p, "phone")
    context.close()
    assert console.errors == []


HOSTILE = "<img src=x onerror=\"document.title='owned'\">"


def test_rows_the_page_does_not_know_neither_break_it_nor_run_as_markup(browser, server):
    """GET /models lists downloads among the models ("state": "downloading"): the table leaves
    them to the Downloads list. A state this page does not know offers no Load or Unload; every
    string the server sends is text, never markup."""
    downloading = {"name": "hf.co/acme/Big-GGUF", "asked": "acme/Big-GGUF", "state": "downloading",
                   "step": "pulling", "source": "huggingface", "total": 4 * 2**30, "completed": 2**30,
                   "bytes_per_second": 50 * 2**20, "eta_seconds": 3725.0,
                   "files": [{"digest": "sha256:" + "a" * 64, "name": "acme/Big-GGUF/big-Q4_K_M.gguf",
                              "total": 4 * 2**30, "completed": 2**30}]}
    first = {"object": "list", "pulls": [downloading], "data": [
        {"id": "odd", "state": "sleeping", "source": "discovered"},
        {"id": "hf.co/acme/Big-GGUF", "state": "downloading", "progress": 0.25, "download": downloading}]}
    strange = {"name": HOSTILE, "asked": HOSTILE, "state": "paused-by-" + HOSTILE, "step": HOSTILE,
               "source": HOSTILE, "total": None, "completed": "lots", "bytes_per_second": None,
               "files": [{"digest": HOSTILE, "name": HOSTILE, "total": 0, "completed": 5}, None, "x"],
               "error": {"message": HOSTILE, "code": "x", "status": 500}}
    snap = {"time": 0, "series": {}, "recent": [],
            "models": [{"id": "odd", "state": "sleeping"}, {"id": HOSTILE, "state": "ready", "error": HOSTILE}],
            "pulls": [downloading, strange, {"state": "done"}, None, 7]}

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    console = Console(p, allow=(503,))
    p.route(re.compile(r"/models$"), lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps(first)))
    p.route(re.compile(r"/usage(\?|$)"), lambda route: route.fulfill(  # the page was given no key to ask with
        status=200, content_type="application/json", body=json.dumps({"object": "usage", "data": [], "limits": {},
                                                                      "recording": True, "group": "day"})))
    p.route(re.compile(r"/dashboard/mcp$"), lambda route: route.fulfill(  # the MCP card's, likewise
        status=200, content_type="application/json", body=json.dumps({"endpoint": "/mcp", "servers": []})))
    p.route(re.compile(r"/dashboard/live$"), lambda route: route.fulfill(
        status=503, content_type="application/json", body=json.dumps({"error": {"message": "not yet"}})))
    p.goto(server.url + "/")
    expect(p.locator("#app")).to_be_visible()
    expect(p.locator("#conn-status")).to_contain_text("not yet")  # no live data: what GET /models said stays
    rows = p.locator("#models tbody tr[data-model]")
    expect(rows).to_have_count(1)  # the download is in the Downloads list, not the table
    odd = p.locator('#models tbody tr[data-model="odd"]')
    expect(odd.locator(".m-state")).to_have_text("sleeping")
    expect(odd.locator("button.load")).to_be_disabled()
    expect(odd.locator("button.unload")).to_be_disabled()
    big = item(p, "acme/Big-GGUF")
    expect(big.locator(".badge")).to_have_text("downloading")
    expect(big.locator(".pull-meta")).to_contain_text("1.0 GiB of 4.0 GiB (25%) · 50 MiB/s · 1 h 2 min left")
    expect(big.locator(".pull-cancel")).to_be_enabled()
    assert p.locator("#pg-model option", has_text="Big").count() == 0  # nothing to chat with yet

    p.unroute(re.compile(r"/dashboard/live$"))
    p.route(re.compile(r"/dashboard/live$"), lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"},
        body=f"event: snapshot\ndata: {json.dumps(snap)}\n\n"))
    expect(p.locator("#pulls li.pull")).to_have_count(2, timeout=10_000)  # a row without a name is none
    weird = p.locator("#pulls li.pull").nth(1)
    expect(weird.locator(".pull-name")).to_have_text(HOSTILE)
    expect(weird.locator(".pull-error")).to_have_text(HOSTILE)
    expect(weird.locator(".pull-file-name")).to_have_count(1)
    expect(weird.locator(".pull-cancel")).to_be_hidden()  # not a running state
    expect(p.locator("#models tbody tr[data-model]")).to_have_count(2)
    expect(p.locator("#models tbody tr[data-model] .m-error")).to_have_text(HOSTILE)
    assert p.locator("#main img").count() == 0 and p.title() == "gguf-gateway"
    context.close()
    assert console.errors == []
