"""The page's MCP card in a real browser (Debian's Chromium driven by Playwright): the MCP servers
the key may use, their transport, state (and the error of a failed one), their tools as
``SERVER_TOOL`` and their calls, from ``GET /dashboard/mcp``, and the line that adds the gateway's
``/mcp`` to Claude Code. The gateway runs in-process on a loopback port, so that the test can
have its real MCP servers connect (or fail) before the page is read: the SDK's test server over
stdio (``tests/mcp_server.py``), a streamable HTTP server nobody has asked yet, and a program
that exits at once.

Skipped, with the reason, where Playwright or a Chromium is missing. The card's picture is kept
in ``$GGUF_GATEWAY_SHOTS`` where that is set, else in the test's tmp."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web
from helpers import Console, free_port

from gateway.api.appkeys import TOOLS
from gateway.app import create_app
from gateway.models.config import load_config
from gateway.tools.hosted import ToolError

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
expect = sync_api.expect

SHOTS = os.environ.get("GGUF_GATEWAY_SHOTS")
ADMIN, ALICE = "admin-key", "alice-key"
MCP_SERVER = Path(__file__).with_name("mcp_server.py")


class InProcess:
    """An application served on a loopback port by a loop in a thread of its own."""

    def __init__(self, app: web.Application):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(app, handler_cancellation=True)
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcp-card")
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  models_dirs: []\n  discover_default_stores: false\n"
                   f"  state_dir: {d / 'state'}\n  kv_cache_dir: {d / 'kv'}\n"
                   f"  api_keys:\n    root: {{key: {ADMIN}, role: admin}}\n"
                   f"    alice: {{key: {ALICE}, role: user, mcp: [docs]}}\n"
                   f"  mcp_servers:\n    docs: {{command: {sys.executable}, args: ['{MCP_SERVER}', stdio]}}\n"
                   f"    files-ro: {{url: 'http://127.0.0.1:{free_port()}/mcp'}}\n"
                   f"    down: {{command: {sys.executable}, args: [-c, 'raise SystemExit(1)']}}\n")
    app = create_app(load_config(cfg))
    served = InProcess(app)
    servers = app[TOOLS].mcp

    async def connect() -> None:  # docs lists its tools; down fails; files-ro is not asked
        await servers.tools("docs")
        try:
            await servers.tools("down")
        except ToolError:
            pass
    asyncio.run_coroutine_threadsafe(connect(), served.loop).result(60)
    yield served
    served.close()


def open_page(browser, gateway, key: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('gguf-gateway-key', {json.dumps(key)})")
    page = context.new_page()
    console = Console(page)
    page.goto(gateway.url + "/")
    expect(page.locator("#app")).to_be_visible()
    return context, page, console


def test_the_card_lists_the_servers_their_state_and_their_tools(browser, gateway, tmp_path):
    context, page, console = open_page(browser, gateway, ADMIN)
    card = page.locator("#mcp")
    rows = card.locator("#mcp-servers tbody tr")
    expect(rows).to_have_count(3)
    docs = card.locator('tr[data-server="docs"]')
    expect(docs.locator(".mcp-transport")).to_have_text("stdio")
    expect(docs.locator(".badge")).to_have_text("ready")
    expect(docs.locator(".mcp-tool")).to_have_text(["docs_echo", "docs_fail", "docs_hang", "docs_big",
                                                     "docs_search"])
    expect(docs.locator(".mcp-calls")).to_have_text("0")
    files = card.locator('tr[data-server="files-ro"]')
    expect(files.locator(".mcp-transport")).to_have_text("http")
    expect(files.locator(".badge")).to_have_text("idle")
    expect(files.locator(".mcp-more")).to_have_text("listed once connected")
    down = card.locator('tr[data-server="down"]')
    expect(down.locator(".badge")).to_have_class("badge state-failed")
    expect(down.locator(".mcp-error")).to_contain_text("exit")
    expect(down.locator(".mcp-more")).to_have_text("not listed")
    expect(card.locator("#mcp-summary")).to_have_text("3 servers, 1 ready, 5 tools")
    expect(card.locator("#mcp-add")).to_have_text(f"claude mcp add --transport http gateway {gateway.url}/mcp")
    expect(card.locator("#mcp-empty")).to_be_hidden()
    page.locator('#nav a[href="#mcp"]').click()
    shots = Path(SHOTS) if SHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    card.screenshot(path=str(shots / "mcp-card.png"))
    context.close()
    assert console.errors == []


def test_a_user_key_sees_only_the_servers_it_may_use(browser, gateway):
    context, page, console = open_page(browser, gateway, ALICE)
    rows = page.locator("#mcp-servers tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-server", "docs")
    context.close()
    assert console.errors == []
