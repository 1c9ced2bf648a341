/* The MCP servers card. GET /dashboard/mcp: the MCP servers the gateway connects to that this key
 * may use, each with its transport, state (idle, connecting, ready, failed, and the error that
 * failed it), its tools as the model and /mcp name them (SERVER_TOOL) and its calls; and how to
 * add the gateway's own MCP endpoint to a client. Fetched when the page starts and every 10 s, not
 * on the live snapshots. Every name in it is the server's: text, never markup. */

import { AuthError, HttpError, apiJSON } from "../lib/api.js";
import { $, el, placeRows, setAttr, setText } from "../lib/dom.js";
import { fmtNumber, isNum } from "../lib/format.js";
import { card, needKey } from "../lib/panels.js";

const MCP_REFRESH_MS = 10000;
const MCP_TOOLS_SHOWN = 24; // tools drawn per server; the rest are counted, and named in the title
const MCP_ERROR_CHARS = 300;

const mcpSummary = $("mcp-summary");
const mcpUrl = $("mcp-url");
const mcpAdd = $("mcp-add");
const mcpError = $("mcp-error");
const mcpWrap = $("mcp-wrap");
const mcpBody = $("mcp-servers").tBodies[0];
const mcpEmpty = $("mcp-empty");
const mcpRows = new Map(); // server name -> row record
const mcp = { running: false, timer: 0, ctrl: null, seq: 0 };

function showMcpError(text) {
  setText(mcpError, text || "");
  mcpError.hidden = !text;
}

const text = (v) => (v === undefined || v === null ? "" : String(v));

function createMcpRow(name) {
  const tr = el("tr");
  tr.dataset.server = name;
  const cells = {
    name: el("th", "mcp-name"),
    transport: el("td", "mcp-transport"),
    state: el("td", "mcp-state"),
    tools: el("td", "mcp-tools-cell"),
    calls: el("td", "mcp-calls num"),
  };
  cells.name.scope = "row";
  const badge = el("span", "badge");
  const error = el("span", "m-error mcp-error");
  error.hidden = true;
  cells.state.append(badge, error);
  const tools = el("ul", "mcp-tools");
  cells.tools.append(tools);
  tr.append(cells.name, cells.transport, cells.state, cells.tools, cells.calls);
  return { tr, cells, badge, error, tools, sig: "" };
}

function updateMcpRow(row, s) {
  const name = text(s.name);
  setText(row.cells.name, name);
  setText(row.cells.transport, text(s.transport) || "—");
  const state = text(s.state) || "unknown";
  row.badge.className = `badge state-${state.replace(/[^a-z-]/gi, "")}`;
  setText(row.badge, state);
  const err = text(s.error);
  setText(row.error, err.length > MCP_ERROR_CHARS ? `${err.slice(0, MCP_ERROR_CHARS)}…` : err);
  setAttr(row.error, "title", err.length > MCP_ERROR_CHARS ? err : "");
  row.error.hidden = !err;
  setText(row.cells.calls, isNum(s.calls) ? fmtNumber(s.calls, 0) : "—");
  const tools = Array.isArray(s.tools) ? s.tools.map(text).filter(Boolean) : [];
  const sig = JSON.stringify([name, tools]);
  if (sig === row.sig) return;
  row.sig = sig;
  const items = tools.slice(0, MCP_TOOLS_SHOWN).map((t) => el("li", "mcp-tool", `${name}_${t}`));
  if (tools.length > MCP_TOOLS_SHOWN) {
    const more = el("li", "mcp-more", `and ${tools.length - MCP_TOOLS_SHOWN} more`);
    more.title = tools.slice(MCP_TOOLS_SHOWN).map((t) => `${name}_${t}`).join("\n");
    items.push(more);
  }
  if (!items.length) {
    const none = { ready: "no tools", failed: "not listed" }[state] || "listed once connected";
    items.push(el("li", "mcp-more", none));
  }
  row.tools.replaceChildren(...items);
}

function renderMcp(body) {
  const servers = body && Array.isArray(body.servers)
    ? body.servers.filter((s) => s && typeof s === "object" && typeof s.name === "string") : [];
  const endpoint = body && typeof body.endpoint === "string" ? body.endpoint : "/mcp";
  const url = `${location.origin}${endpoint}`;
  setText(mcpUrl, url);
  setText(mcpAdd, `claude mcp add --transport http gateway ${url}`);
  placeRows(mcpBody, mcpRows, servers.map((s) => [s.name, s]), createMcpRow, updateMcpRow, (row) => row.tr);
  mcpWrap.hidden = !servers.length;
  mcpEmpty.hidden = !!servers.length;
  const ready = servers.filter((s) => s.state === "ready").length;
  const tools = servers.reduce((n, s) => n + (Array.isArray(s.tools) ? s.tools.length : 0), 0);
  setText(mcpSummary, servers.length
    ? `${servers.length} server${servers.length === 1 ? "" : "s"}, ${ready} ready, ${tools} tool${tools === 1 ? "" : "s"}`
    : "");
}

async function loadMcp() {
  const seq = ++mcp.seq;
  clearTimeout(mcp.timer);
  mcp.timer = 0;
  if (mcp.ctrl) mcp.ctrl.abort();
  const ctrl = new AbortController();
  mcp.ctrl = ctrl;
  try {
    const body = await apiJSON("/dashboard/mcp", { signal: ctrl.signal });
    if (seq !== mcp.seq) return;
    showMcpError("");
    renderMcp(body);
  } catch (err) {
    if (ctrl.signal.aborted || seq !== mcp.seq) return;
    if (err instanceof AuthError) {
      needKey(true);
      return;
    }
    const message = (err && err.message ? err.message : String(err)).replace(/\.$/, "");
    showMcpError(err instanceof HttpError ? `Could not list the MCP servers: ${message}.`
      : `Could not reach the gateway for the MCP servers: ${message}.`);
  } finally {
    if (seq === mcp.seq) {
      mcp.ctrl = null;
      if (mcp.running) mcp.timer = setTimeout(loadMcp, MCP_REFRESH_MS);
    }
  }
}

card({
  start() {
    if (mcp.running) return;
    mcp.running = true;
    loadMcp();
  },
  stop() {
    mcp.running = false;
    mcp.seq++;
    clearTimeout(mcp.timer);
    mcp.timer = 0;
    if (mcp.ctrl) mcp.ctrl.abort();
    mcp.ctrl = null;
    // what one key was shown is not left for the next to see
    renderMcp({ servers: [] });
    mcpEmpty.hidden = true;
    showMcpError("");
  },
});
