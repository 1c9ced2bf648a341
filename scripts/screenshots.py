#!/usr/bin/env python3
"""Screenshots of the gateway's page for the README: the real server on scripted test models,
some traffic, a model pulled by name from a Hugging Face hub on loopback (tests/hubserver.py), a
playground chat, then the whole page wide (every card: Models, Downloads, Live, Usage, Recent
requests, Requests, Playground) and at a phone's width, in Chromium; and its Requests section
(``server.capture`` on) with a capture opened and replayed on another model.

    .venv/bin/python scripts/screenshots.py [--out scripts/screenshots] [--chromium /usr/bin/chromium]

Needs the test extra (Playwright) and a system Chromium; nothing downloads a browser.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test suite's server and browser helpers

from helpers import CHROMIUM_ARGS, ServerProcess, chromium  # noqa: E402
from hubserver import Hub  # noqa: E402

from gateway.models import testmodels as tm  # noqa: E402


def post(url: str, body: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def write_models(d: Path) -> Path:
    tm.thinking(d / "thinker.gguf", "Two and two: four.", "It is 4.")
    tm.plain(d / "hello.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "ticker.gguf")
    tm.plain(d / "vectors.bin", ["x"])  # not a .gguf: found only through models.yaml
    (d / "broken.gguf").write_bytes((d / "hello.gguf").read_bytes().replace(b"llama", b"zzzzz"))
    cfg = d / "models.yaml"
    # the default stores (HOME's alone: see main) take the model the Downloads card pulls
    cfg.write_text(f"server:\n  models_dirs: [{d}]\n  discover_default_stores: true\n  capture: true\n"
                   f"models:\n  embed:\n    path: {d / 'vectors.bin'}\n    embeddings: true\n")
    return cfg


def traffic(url: str, seconds: float) -> None:
    """A little of everything over a few of the live charts' intervals."""
    hi = [{"role": "user", "content": "hi"}]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        post(url + "/v1/chat/completions", {"model": "hello", "messages": hi})
        post(url + "/v1/chat/completions", {"model": "thinker", "messages": hi, "stream": True})
        post(url + "/v1/embeddings", {"model": "embed", "input": "hi"})
        time.sleep(0.7)
    post(url + "/v1/chat/completions", {"model": "broken", "messages": hi})  # a failed load, with its reason


def server_env(home: str, hub: Hub) -> dict[str, str]:
    """The server's stores are HOME's alone, whatever the environment running the script says;
    its Hugging Face is the loopback hub."""
    return {"HOME": home, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HOME": "", "HF_HUB_CACHE": "",
            "OLLAMA_MODELS": "", "LLAMA_CACHE": "", "HF_TOKEN": "", "HF_HUB_OFFLINE": ""}


PULLED = "acme/Tiny-GGUF"  # the hub's one repo, pulled through the Downloads card


def pull_on_page(page, hub: Hub, files: Path) -> None:
    """A model pulled by name through the Downloads card: its finished pull, and its row in Models.
    files: where the hub's copy is written (not a folder the gateway scans)."""
    from playwright.sync_api import expect

    tm.plain(files / "tiny-Q4_K_M.gguf", ["Hi"])
    hub.add_hf_repo(PULLED, {"tiny-Q4_K_M.gguf": files / "tiny-Q4_K_M.gguf", "README.md": b"# Tiny\n"})
    page.fill("#pull-name", PULLED)
    page.click("#pull-submit")
    expect(page.locator("#pull-status")).to_contain_text(f"Pulled hf.co/{PULLED}", timeout=60_000)


def requests_shot(browser, url: str, path: Path) -> None:
    """The Requests section: a streamed chat with a thinking model opened, and replayed on another
    model beside it."""
    from playwright.sync_api import expect

    post(url + "/v1/chat/completions", {"model": "thinker", "stream": True, "temperature": 0.2, "max_tokens": 256,
                                        "messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "What is two and two?"}]})
    with urllib.request.urlopen(url + "/captures?model=thinker&limit=1", timeout=30) as r:
        capture = json.loads(r.read())["data"][0]["id"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url + "/")
    page.get_by_role("link", name="Requests", exact=True).click()
    page.locator(f'#captures tbody tr[data-capture="{capture}"] button.cap-open').click()
    expect(page.locator("#cap-answer .cap-content")).to_have_text("It is 4.", timeout=30_000)
    page.select_option("#cap-replay-model", "hello")
    page.click("#cap-replay")
    expect(page.locator("#cap-compare .side-replay .cap-content")).to_have_text("Hello, world!", timeout=60_000)
    time.sleep(2)  # the list shows the replay too
    page.evaluate("document.activeElement.blur(); document.querySelector('.topbar').style.position = 'static'")
    page.locator("#requests").screenshot(path=str(path), animations="disabled")
    page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "scripts" / "screenshots")
    ap.add_argument("--chromium", default=chromium())
    ap.add_argument("--traffic", type=float, default=16.0, help="seconds of requests before the shots")
    args = ap.parse_args()
    from playwright.sync_api import expect, sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as hubfiles:
        d = Path(tmp)
        cfg = write_models(d)
        with Hub() as hub, ServerProcess("--config", str(cfg), env=server_env(tmp, hub)) as server:
            url = server.url
            background = threading.Thread(target=traffic, args=(url, args.traffic))
            background.start()
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, args=[*CHROMIUM_ARGS, "--hide-scrollbars"])
                wide = browser.new_page(viewport={"width": 1280, "height": 900})
                wide.goto(url + "/")
                pull_on_page(wide, hub, Path(hubfiles))
                wide.select_option("#pg-model", "thinker")
                wide.fill("#pg-system", "Be brief.")
                wide.fill("#pg-input", "What is two and two?")
                wide.click("#pg-send")
                answer = wide.locator("#pg-transcript .msg.assistant").last
                expect(answer.locator(".stats")).to_contain_text("completion tokens", timeout=30_000)
                answer.locator("details.thinking summary").click()
                wide.fill("#pg-input", "And again?")
                background.join()
                # the Usage card asks again when a choice changes: by model, the traffic just sent
                wide.select_option("#usage-by", "model")
                expect(wide.locator("#usage-plot rect.seg").first).to_be_visible(timeout=45_000)
                time.sleep(2)  # a snapshot after the last request
                wide.mouse.move(0, 0)  # no row under the pointer, lit as hovered
                wide.evaluate("document.activeElement.blur(); window.scrollTo(0, 0)")
                wide.screenshot(path=str(args.out / "wide.png"), full_page=True)
                wide.emulate_media(color_scheme="dark")
                wide.screenshot(path=str(args.out / "wide-dark.png"))
                phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                         device_scale_factor=1)
                phone.goto(url + "/")
                expect(phone.locator("#recent tbody tr").first).to_be_visible(timeout=10_000)
                time.sleep(1.5)
                phone.screenshot(path=str(args.out / "narrow.png"))
                requests_shot(browser, url, args.out / "requests.png")
                browser.close()
    for name in ("wide.png", "wide-dark.png", "narrow.png", "requests.png"):
        print(args.out / name)


if __name__ == "__main__":
    main()
