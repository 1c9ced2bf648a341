"""CSRF in a real browser: a page on another origin (another port of this host, the likeliest
attacker on a workstation: any local dev server or a page it serves) makes Debian's Chromium
post to a gateway that has no keys, as forms and as no-cors fetches need no permission to. The
gateway must act on none of it: the model stays unloaded, no prompt runs.

Skipped, with the reason, where Playwright or a Chromium is missing (as the page's tests)."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
import urllib.request

import pytest
from helpers import ServerProcess, free_port

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ATTACK = """<!doctype html><html><body>
<form id="f" method="POST" action="{gw}/models/load" enctype="text/plain" target="sink">
  <input name='{{"model": "plain", "x": "' value='"}}'>
</form>
<form id="g" method="POST" action="{gw}/v1/completions" target="sink2">
  <input name="model" value="plain"><input name="prompt" value="hi">
</form>
<iframe name="sink"></iframe><iframe name="sink2"></iframe>
<script>
  document.getElementById("f").submit();
  document.getElementById("g").submit();
  const body = JSON.stringify({{model: "plain", prompt: "stolen", max_tokens: 3}});
  Promise.allSettled([
    fetch("{gw}/models/load", {{method: "POST", mode: "no-cors", body: '{{"model": "plain"}}'}}),
    fetch("{gw}/v1/completions", {{method: "POST", mode: "no-cors", body}}),
    fetch("{gw}/v1/completions", {{method: "POST", mode: "no-cors", body,
                                   headers: {{"Content-Type": "application/x-www-form-urlencoded"}}}}),
  ]).then(() => {{ document.title = "done"; }});
</script></body></html>"""


@pytest.fixture
def gateway(tmp_path):
    tm.plain(tmp_path / "plain.gguf", ["Hello", "!"])
    events = tmp_path / "events.jsonl"
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {events}\n"
                   f"models:\n  plain:\n    path: {tmp_path / 'plain.gguf'}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(tmp_path)}) as srv:
        yield srv, events


@pytest.fixture
def attacker(tmp_path, gateway):
    """The attacking page, served from another port of 127.0.0.1."""
    srv, _ = gateway
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(ATTACK.format(gw=srv.url))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    httpd.shutdown()
    httpd.server_close()


def test_a_page_of_another_origin_makes_the_browser_do_nothing(browser, gateway, attacker):
    srv, events = gateway
    page = browser.new_page()
    try:
        page.goto(attacker)
        page.wait_for_function("document.title === 'done'", timeout=15000)
        time.sleep(1.0)  # the forms' navigations land in their frames
    finally:
        page.close()
    with urllib.request.urlopen(srv.url + "/models", timeout=10) as r:
        state = {m["id"]: m["state"] for m in json.loads(r.read())["data"]}
    assert state == {"plain": "unloaded"}  # nothing loaded it, nothing ran a prompt on it
    seen = [json.loads(line) for line in events.read_text().splitlines()]
    posts = [e for e in seen if e.get("endpoint") in ("/models/load", "/v1/completions")]
    assert len(posts) == 5 and all(e["status"] == 403 for e in posts), posts
