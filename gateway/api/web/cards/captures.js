/* The Requests card. GET /captures (server.capture): the requests the gateway kept as received
 * and their answers as sent. The list is fetched when the page starts, when a filter changes, on
 * Refresh and a little after the live snapshots show new requests; one capture opened is GET
 * /captures/{id}, copied as curl or replayed on another model beside the original (capture.js).
 * Everything in them is the client's or the model's text: set as textContent, never markup. */

import { HttpError, apiJSON } from "../lib/api.js";
import { $, el, placeRows, setAttr, setText } from "../lib/dom.js";
import { fmtBytes, fmtClock, fmtDuration, fmtNumber, isNum } from "../lib/format.js";
import { card } from "../lib/panels.js";
import { bindList, closeCapture, openCapture, openedId, setModels } from "./capture.js";
import { fmtMs, fmtRate } from "./capture-views.js";

const CAP_LIMIT = 100; // rows asked for; the server keeps the newest first
const CAP_RELOAD_MS = 1500; // after new requests show in the live data, the list follows this much later

const capStore = $("cap-store");
const capOff = $("cap-off");
const capError = $("cap-error");
const capFilters = $("cap-filters");
const capModel = $("cap-model");
const capKey = $("cap-key");
const capStatus = $("cap-status");
const capRoute = $("cap-route");
const capturesWrap = $("captures-wrap");
const capturesBody = $("captures").tBodies[0];
const capturesEmpty = $("captures-empty");
const capturesNote = $("captures-note");
const capRows = new Map(); // capture id -> row record
let models = []; // the Models card's list: the filter's suggestions

const caps = {
  running: false, ctrl: null, seq: 0, timer: 0, body: null, refused: false,
  seen: { model: new Set(), key: new Set(), route: new Set() }, // for the filters' suggestions
};

function showCapError(text) {
  setText(capError, text || "");
  capError.hidden = !text;
}

function stopCaptures() {
  caps.running = false;
  caps.seq++;
  clearTimeout(caps.timer);
  caps.timer = 0;
  if (caps.ctrl) caps.ctrl.abort();
  caps.ctrl = null;
  // what one key was shown is not left for the next to see
  caps.body = null;
  caps.refused = false;
  for (const set of Object.values(caps.seen)) set.clear();
  closeCapture(false);
  showCapError("");
  renderCaptures();
}

function startCaptures() {
  if (caps.running) return;
  caps.running = true;
  loadCaptures();
}

/** New requests showed in the live data: the list follows, once, a little later. */
function capturesChanged() {
  if (!caps.running || caps.refused || caps.timer || (caps.body && caps.body.enabled === false)) return;
  caps.timer = setTimeout(() => {
    caps.timer = 0;
    loadCaptures();
  }, CAP_RELOAD_MS);
}

function capQuery() {
  const query = new URLSearchParams({ limit: String(CAP_LIMIT) });
  for (const [name, input] of [["model", capModel], ["key", capKey], ["status", capStatus], ["route", capRoute]]) {
    const value = input.value.trim();
    if (value) query.set(name, value);
  }
  return query;
}

const filtered = () => [capModel, capKey, capStatus, capRoute].some((i) => i.value.trim());

async function loadCaptures() {
  const seq = ++caps.seq;
  clearTimeout(caps.timer);
  caps.timer = 0;
  if (caps.ctrl) caps.ctrl.abort();
  const ctrl = new AbortController();
  caps.ctrl = ctrl;
  capturesWrap.setAttribute("aria-busy", "true");
  try {
    const body = await apiJSON(`/captures?${capQuery()}`, { signal: ctrl.signal });
    if (seq !== caps.seq) return;
    caps.body = body && typeof body === "object" ? body : {};
    caps.refused = false;
    showCapError("");
    renderCaptures();
  } catch (err) {
    if (ctrl.signal.aborted || seq !== caps.seq) return;
    if (err instanceof HttpError && (err.status === 401 || err.status === 403)) {
      // an admin's alone where keys have roles: the section says so, the rest of the page goes on
      caps.refused = true;
      caps.body = null;
      renderCaptures();
      showCapError(`Captured requests are not available to this key: ${err.message}`);
    } else {
      const message = (err && err.message ? err.message : String(err)).replace(/\.$/, "");
      showCapError(`Could not load the captured requests: ${message}.`);
    }
  } finally {
    if (seq === caps.seq) {
      caps.ctrl = null;
      capturesWrap.removeAttribute("aria-busy");
    }
  }
}

function createCapRow(id) {
  const tr = el("tr");
  tr.dataset.capture = id;
  const time = el("th", "c-time");
  time.scope = "row";
  const open = el("button", "cap-open link-btn");
  open.type = "button";
  open.addEventListener("click", (event) => {
    event.stopPropagation();
    openCapture(id);
  });
  time.append(open);
  const cells = {
    time,
    route: el("td", "c-route"),
    model: el("td", "c-model"),
    key: el("td", "c-key"),
    status: el("td", "c-status num"),
    stream: el("td", "c-stream"),
    ttft: el("td", "c-ttft num"),
    duration: el("td", "c-duration num"),
    tokens: el("td", "c-tokens num"),
  };
  // a phone's card names the cells that do not say what they are
  const labels = { key: "Key", stream: "Answer", ttft: "TTFT", duration: "Duration", tokens: "Tokens" };
  for (const [name, label] of Object.entries(labels)) cells[name].dataset.label = label;
  tr.append(...Object.values(cells));
  // a click anywhere on the row opens it, as its button does (which the keyboard reaches)
  tr.addEventListener("click", (event) => {
    if (!(event.target instanceof Element) || !event.target.closest("button, a, input, select, textarea")) openCapture(id);
  });
  return { id, tr, open, cells, sig: "" };
}

function updateCapRow(row, c) {
  const sig = JSON.stringify(c);
  if (sig === row.sig) return;
  row.sig = sig;
  const clock = fmtClock(c.time);
  setText(row.open, clock);
  row.open.setAttribute("aria-label",
    `Open request ${clock}, ${c.route || c.path || "?"}, ${c.model || "no model"}, status ${c.status}`);
  setAttr(row.cells.time, "title", isNum(c.time) ? new Date(c.time * 1000).toLocaleString() : "");
  setText(row.cells.route, c.route || c.path || "—");
  setAttr(row.cells.route, "title", c.path && c.path !== c.route ? `${c.method || ""} ${c.path}` : "");
  const model = [document.createTextNode(c.model || "—")];
  if (c.replay_of) {
    const badge = el("span", "badge replay-badge", "replay");
    badge.title = `replay of ${c.replay_of}`;
    model.push(document.createTextNode(" "), badge);
  }
  row.cells.model.replaceChildren(...model);
  setText(row.cells.key, c.key || "—");
  const ok = isNum(c.status) && c.status < 400;
  row.cells.status.className = `c-status num ${ok ? "ok" : "bad"}`;
  setText(row.cells.status, isNum(c.status) ? c.status : "—");
  setText(row.cells.stream, c.stream ? "stream" : "whole");
  setText(row.cells.ttft, fmtMs(c.time_to_first_token_s));
  setText(row.cells.duration, fmtDuration(c.duration_s));
  const p = isNum(c.prompt_tokens) ? fmtNumber(c.prompt_tokens, 0) : "—";
  const n = isNum(c.completion_tokens) ? fmtNumber(c.completion_tokens, 0) : "—";
  setText(row.cells.tokens, `${p} / ${n}`);
  const extra = [];
  if (isNum(c.cached_tokens) && c.cached_tokens) extra.push(`${c.cached_tokens} cached`);
  if (isNum(c.reasoning_tokens) && c.reasoning_tokens) extra.push(`${c.reasoning_tokens} reasoning`);
  if (isNum(c.tokens_per_s)) extra.push(fmtRate(c.tokens_per_s));
  setAttr(row.cells.tokens, "title", extra.join(", "));
  row.tr.classList.toggle("cut", !!(c.truncated || c.redacted));
}

/** One button of the list in the Tab order (the opened row's, else the first); the arrows move along. */
function rovingTabs() {
  const opened = openedId() ? capRows.get(openedId()) : null;
  const first = capturesBody.querySelector("button.cap-open");
  const target = opened ? opened.open : first;
  for (const row of capRows.values()) {
    row.open.tabIndex = row.open === target ? 0 : -1;
    setAttr(row.open, "aria-current", row === opened ? "true" : "");
    row.tr.classList.toggle("selected", row === opened);
  }
}

capturesBody.addEventListener("keydown", (event) => {
  if (!(event.target instanceof HTMLButtonElement) || !event.target.classList.contains("cap-open")) return;
  const buttons = [...capturesBody.querySelectorAll("button.cap-open")];
  const i = buttons.indexOf(event.target);
  let next = -1;
  if (event.key === "ArrowDown") next = Math.min(buttons.length - 1, i + 1);
  else if (event.key === "ArrowUp") next = Math.max(0, i - 1);
  else if (event.key === "Home") next = 0;
  else if (event.key === "End") next = buttons.length - 1;
  if (next < 0 || i < 0) return;
  event.preventDefault();
  for (const b of buttons) b.tabIndex = -1;
  buttons[next].tabIndex = 0;
  buttons[next].focus();
});

function fillDatalist(id, values) {
  const list = $(id);
  const sorted = [...values].filter(Boolean).sort();
  const sig = JSON.stringify(sorted);
  if (list.dataset.sig === sig) return;
  list.dataset.sig = sig;
  list.replaceChildren(...sorted.map((v) => {
    const o = el("option");
    o.value = v;
    return o;
  }));
}

function renderCaptures() {
  const body = caps.body;
  const rows = (body && Array.isArray(body.data) ? body.data : [])
    .filter((c) => c && typeof c === "object" && typeof c.id === "string");
  const off = !!body && body.enabled === false;
  capOff.hidden = !off;
  const loaded = !!body;
  // off, with nothing kept from before: the note alone
  const bare = !loaded || (off && !rows.length && !filtered());
  capFilters.hidden = caps.refused || (off && bare);
  capturesWrap.hidden = bare;

  for (const c of rows) {
    if (c.model) caps.seen.model.add(String(c.model));
    if (c.key) caps.seen.key.add(String(c.key));
    if (c.route) caps.seen.route.add(String(c.route));
  }
  fillDatalist("cap-model-list", new Set([...caps.seen.model, ...models.map((m) => m.id)]));
  fillDatalist("cap-key-list", caps.seen.key);
  fillDatalist("cap-route-list", caps.seen.route);

  placeRows(capturesBody, capRows, rows.map((c) => [c.id, c]), createCapRow, updateCapRow, (row) => row.tr, (row) => {
    if (document.activeElement === row.open) capturesWrap.focus();
  });
  rovingTabs();

  let empty = "";
  if (loaded && !rows.length && !bare) {
    empty = filtered() ? "No captured requests match these filters." : "No requests captured yet.";
  }
  setText(capturesEmpty, empty);
  capturesEmpty.hidden = !empty;

  let store = "";
  if (loaded && isNum(body.count)) {
    store = `${fmtNumber(body.count, 0)} kept`;
    if (isNum(body.bytes) && isNum(body.max_bytes)) store += ` · ${fmtBytes(body.bytes)} of ${fmtBytes(body.max_bytes)}`;
    if (body.redact_content) store += " · text not kept";
  }
  setText(capStore, store);
  setText(capturesNote, rows.length >= CAP_LIMIT
    ? `The newest ${CAP_LIMIT} shown; the filters find older ones.` : "");
  capturesNote.hidden = !capturesNote.textContent;
}

capFilters.addEventListener("submit", (event) => {
  event.preventDefault();
  if (caps.running) loadCaptures();
});

capStatus.addEventListener("change", () => {
  if (caps.running) loadCaptures();
});

for (const input of [capModel, capKey, capRoute]) {
  let timer = 0;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      if (caps.running) loadCaptures();
    }, 400);
  });
}

bindList({
  changed: rovingTabs,
  focus(id) {
    const row = id && capRows.get(id);
    if (row) row.open.focus();
    else capturesWrap.focus();
  },
  reload() {
    if (caps.running) loadCaptures();
  },
});

card({
  snapshot(snap) {
    // /captures is an admin's alone: another key is told so here, without asking (and a 403)
    if (snap.admin === true) startCaptures();
    else if (snap.admin === false && !caps.refused) {
      caps.refused = true;
      caps.body = null;
      renderCaptures();
      showCapError("Captured requests are not available to this key: they are an admin key's to see.");
    }
  },
  models(list) {
    models = list;
    setModels(list);
  },
  newRequests: capturesChanged,
  stop: stopCaptures,
});
