/* The Requests card. GET /captures (server.capture): the requests the gateway kept as received
 * and their answers as sent. The list is fetched when the page starts, when a filter changes, on
 * Refresh and a little after the live snapshots show new requests; one capture opened is GET
 * /captures/{id}, copied as curl or replayed on another model beside the original. Everything in
 * them is the client's or the model's text: set as textContent, never markup (capture-views.js). */

import { HttpError, apiJSON } from "../lib/api.js";
import { $, el, placeRows, setAttr, setText } from "../lib/dom.js";
import { fmtBytes, fmtClock, fmtDuration, fmtNumber, isNum } from "../lib/format.js";
import { card } from "../lib/panels.js";
import {
  CAP_MAX_TEXT, answerView, capped, fmtAt, fmtMs, fmtRate, headerText, notReplayable, rawBlock, requestView, statItems,
} from "./capture-views.js";

const CAP_LIMIT = 100; // rows asked for; the server keeps the newest first
const CAP_RELOAD_MS = 1500; // after new requests show in the live data, the list follows this much later
const CAP_EVENT_ROWS = 200; // a stream's writes shown at once; "Show more" adds as many again

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
const capDetail = $("cap-detail");
const capTitle = $("cap-title");
const capMeta = $("cap-meta");
const capFlags = $("cap-flags");
const capCopy = $("cap-copy");
const capClose = $("cap-close");
const capCurlBox = $("cap-curl-box");
const capCurl = $("cap-curl");
const capCopyStatus = $("cap-copy-status");
const capLoading = $("cap-loading");
const capDetailError = $("cap-detail-error");
const capBody = $("cap-body");
const capRequest = $("cap-request");
const capAnswer = $("cap-answer");
const capTiming = $("cap-timing");
const capStream = $("cap-stream");
const capStreamSub = $("cap-stream-sub");
const capTimeline = $("cap-timeline").tBodies[0];
const capMore = $("cap-more");
const capRaw = $("cap-raw");
const capRawBody = $("cap-raw-body");
const capReplayForm = $("cap-replay-form");
const capReplayModel = $("cap-replay-model");
const capReplay = $("cap-replay");
const capReplayStatus = $("cap-replay-status");
const capCompare = $("cap-compare");
const capRows = new Map(); // capture id -> row record
let models = []; // the Models card's list: the filter's suggestions and the replay's choices

const caps = {
  running: false, ctrl: null, seq: 0, timer: 0, body: null, refused: false,
  seen: { model: new Set(), key: new Set(), route: new Set() }, // for the filters' suggestions
  open: null, openId: null, openCtrl: null, openSeq: 0, // the capture opened
  replayCtrl: null, shown: 0, // a replay running; the stream's writes drawn
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
  const opened = caps.openId ? capRows.get(caps.openId) : null;
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

// ---- one capture ----

function closeCapture(focusList) {
  caps.openSeq++;
  if (caps.openCtrl) caps.openCtrl.abort();
  caps.openCtrl = null;
  abortReplay();
  const id = caps.openId;
  caps.open = null;
  caps.openId = null;
  capDetail.hidden = true;
  capRequest.replaceChildren();
  capAnswer.replaceChildren();
  capTiming.replaceChildren();
  capTimeline.replaceChildren();
  capRawBody.replaceChildren();
  capCompare.replaceChildren();
  capCompare.hidden = true;
  capCurl.value = "";
  rovingTabs();
  if (focusList) {
    const row = id && capRows.get(id);
    if (row) row.open.focus();
    else capturesWrap.focus();
  }
}

function abortReplay() {
  if (caps.replayCtrl) caps.replayCtrl.abort();
  caps.replayCtrl = null;
  replayBusy(false);
}

async function openCapture(id) {
  if (caps.openId === id && caps.open) {
    capDetail.focus();
    return;
  }
  const seq = ++caps.openSeq;
  if (caps.openCtrl) caps.openCtrl.abort();
  abortReplay();
  const ctrl = new AbortController();
  caps.openCtrl = ctrl;
  caps.openId = id;
  caps.open = null;
  rovingTabs();
  capDetail.hidden = false;
  capBody.hidden = true;
  capStream.hidden = true;
  capRaw.hidden = true;
  capReplayForm.parentElement.hidden = true;
  capCompare.replaceChildren();
  capCompare.hidden = true;
  capCurlBox.hidden = true;
  setText(capCopyStatus, "");
  capCopy.disabled = true;
  setText(capTitle, `Request ${id}`);
  setText(capMeta, "");
  capFlags.replaceChildren();
  capLoading.hidden = false;
  capDetailError.hidden = true;
  capDetail.setAttribute("aria-busy", "true");
  capDetail.focus();
  try {
    const detail = await apiJSON(`/captures/${encodeURIComponent(id)}`, { signal: ctrl.signal });
    if (seq !== caps.openSeq) return;
    caps.open = detail && typeof detail === "object" ? detail : {};
    renderDetail(caps.open);
  } catch (err) {
    if (ctrl.signal.aborted || seq !== caps.openSeq) return;
    setText(capDetailError, `Could not open this capture: ${err && err.message ? err.message : err}`);
    capDetailError.hidden = false;
  } finally {
    if (seq === caps.openSeq) {
      caps.openCtrl = null;
      capLoading.hidden = true;
      capDetail.removeAttribute("aria-busy");
    }
  }
}

function renderDetail(d) {
  setText(capTitle, `${d.method || "POST"} ${d.route || d.path || ""}`);
  const meta = [];
  if (isNum(d.time)) meta.push(new Date(d.time * 1000).toLocaleString());
  meta.push(`model ${d.model || "—"}`, `key ${d.key || "—"}`);
  meta.push(`capture ${d.id}`);
  if (d.request_id) meta.push(`request ${d.request_id}`);
  if (d.trace_id) meta.push(`trace ${d.trace_id}`);
  setText(capMeta, meta.join(" · "));
  const flags = [];
  const ok = isNum(d.status) && d.status < 400;
  flags.push(el("span", `badge ${ok ? "state-ready" : "state-failed"}`, `status ${d.status}`));
  flags.push(el("span", "badge", d.stream ? "streamed" : "whole answer"));
  if (d.path && d.path !== d.route) flags.push(el("span", "badge", d.path));
  if (d.truncated) flags.push(el("span", "badge state-loading", "cut at the capture's bound"));
  if (d.redacted) flags.push(el("span", "badge state-loading", "text not kept"));
  // its text spelled a key in pieces: the stream's writes were not kept, only the answer with the key cut
  if (d.withheld) flags.push(el("span", "badge state-loading", "stream withheld: it spelled a key"));
  if (d.replay_of) {
    const back = el("button", "small-btn", `Replay of ${d.replay_of}`);
    back.type = "button";
    back.setAttribute("aria-label", `Open the original capture ${d.replay_of}`);
    back.addEventListener("click", () => openCapture(d.replay_of));
    flags.push(back);
  }
  const spaced = [];
  flags.forEach((f, i) => {
    if (i) spaced.push(document.createTextNode(" "));
    spaced.push(f);
  });
  capFlags.replaceChildren(...spaced);

  capBody.hidden = false;
  capRequest.replaceChildren(...requestView(d.request || {}));
  capAnswer.replaceChildren(answerView(d.answer, d.response));
  capTiming.replaceChildren(...statItems(d, false));

  const events = d.response && Array.isArray(d.response.events) ? d.response.events : null;
  capStream.hidden = !events;
  caps.shown = 0;
  capTimeline.replaceChildren();
  if (events) showEvents(events);

  capRaw.hidden = false;
  capRaw.open = false;
  capRawBody.replaceChildren();

  capCopy.disabled = typeof d.curl !== "string" || !d.curl;
  capCurl.value = typeof d.curl === "string" ? d.curl : "";

  capReplayForm.parentElement.hidden = false;
  fillReplayModels();
  const why = notReplayable(d);
  capReplay.disabled = !!why;
  setText(capReplayStatus, why);
  capReplayStatus.classList.remove("error");
}


/** The stream's writes from caps.shown on, CAP_EVENT_ROWS more of them. */
function showEvents(events) {
  const start = caps.shown;
  const end = Math.min(events.length, start + CAP_EVENT_ROWS);
  const rows = [];
  let prev = start > 0 && events[start - 1] && isNum(events[start - 1].t) ? events[start - 1].t : null;
  for (let i = start; i < end; i++) {
    const e = events[i] && typeof events[i] === "object" ? events[i] : {};
    const tr = el("tr");
    const at = el("td", "tl-at num", fmtAt(e.t));
    if (isNum(e.t) && prev !== null) at.title = `+${fmtNumber((e.t - prev) * 1000, 1)} ms after the write before`;
    if (isNum(e.t)) prev = e.t;
    const data = typeof e.data === "string" ? e.data.replace(/(\r?\n)+$/, "") : "";
    const cell = el("td", "tl-data");
    cell.append(el("pre", "", capped(data, CAP_MAX_TEXT)));
    tr.append(at, cell);
    rows.push(tr);
  }
  capTimeline.append(...rows);
  caps.shown = end;
  const d = caps.open || {};
  const last = events.length && isNum(events[events.length - 1].t) ? events[events.length - 1].t : null;
  const parts = [`${fmtNumber(events.length, 0)} write${events.length === 1 ? "" : "s"}`];
  if (last !== null) parts.push(`the last at ${fmtAt(last)}`);
  if (isNum(d.response_bytes)) parts.push(fmtBytes(d.response_bytes));
  if (d.response && d.response.truncated) parts.push("cut at the capture's bound");
  if (end < events.length) parts.push(`${fmtNumber(end, 0)} shown`);
  setText(capStreamSub, `(${parts.join(" · ")})`);
  const rest = events.length - end;
  capMore.hidden = rest <= 0;
  if (rest > 0) setText(capMore, `Show ${fmtNumber(Math.min(rest, CAP_EVENT_ROWS), 0)} more of ${fmtNumber(rest, 0)}`);
}

capMore.addEventListener("click", () => {
  const events = caps.open && caps.open.response && Array.isArray(caps.open.response.events)
    ? caps.open.response.events : [];
  const first = capTimeline.rows.length;
  showEvents(events);
  if (capMore.hidden) {
    const row = capTimeline.rows[first];
    const wrap = capTimeline.closest(".table-wrap");
    if (wrap) wrap.focus();
    if (row) row.scrollIntoView({ block: "nearest" });
  }
});


// the raw bodies only when asked for: they may be long
capRaw.addEventListener("toggle", () => {
  if (!capRaw.open || capRawBody.childElementCount || !caps.open) return;
  const d = caps.open;
  const req = d.request || {};
  const resp = d.response || {};
  const parts = [];
  parts.push(rawBlock("Request headers", headerText(req.headers)));
  const reqText = req.body !== null && req.body !== undefined ? JSON.stringify(req.body, null, 2) : req.body_text || "";
  parts.push(rawBlock("Request body", reqText || "(none)",
    req.truncated ? `Cut at the capture's bound (it had ${fmtBytes(req.bytes)}).` : ""));
  parts.push(rawBlock("Response headers", headerText(resp.headers)));
  if (Array.isArray(resp.events)) {
    parts.push(rawBlock("Response stream", resp.events.map((e) => (e && typeof e.data === "string" ? e.data : "")).join(""),
      resp.truncated ? `Cut at the capture's bound (it had ${fmtBytes(resp.bytes)}).` : ""));
  } else {
    const text = resp.body !== null && resp.body !== undefined ? JSON.stringify(resp.body, null, 2) : resp.body_text || "";
    parts.push(rawBlock("Response body", text || "(none)",
      resp.truncated ? `Cut at the capture's bound (it had ${fmtBytes(resp.bytes)}).` : ""));
  }
  capRawBody.replaceChildren(...parts);
});

// ---- copy as curl ----

function setCopyStatus(text, isError) {
  capCopyStatus.classList.toggle("error", !!isError);
  setText(capCopyStatus, text || "");
}

async function copyCurl() {
  const text = capCurl.value;
  if (!text) return;
  capCurlBox.hidden = false;
  let copied = false;
  if (navigator.clipboard && typeof navigator.clipboard.writeText === "function") {
    try {
      await navigator.clipboard.writeText(text);
      copied = true;
    } catch (_) {
      /* refused (no permission, not a secure context): select it for the user instead */
    }
  }
  if (copied) {
    setCopyStatus("Copied the curl command to the clipboard.");
  } else {
    capCurl.focus();
    capCurl.select();
    setCopyStatus("This browser did not let the page copy: the command is selected below; press Ctrl+C (⌘C) to copy it.");
  }
}

capCopy.addEventListener("click", () => {
  copyCurl().catch((err) => setCopyStatus(`Could not copy: ${err && err.message ? err.message : err}`, true));
});

capClose.addEventListener("click", () => closeCapture(true));

capDetail.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !(event.target instanceof HTMLSelectElement)) {
    event.preventDefault();
    closeCapture(true);
  }
});

// ---- replay ----

/** The models a replay can go to (this gateway's and those it reaches upstream), the capture's own first chosen. */
function fillReplayModels() {
  const d = caps.open;
  if (!d) return;
  const ids = models.filter((m) => m.state !== "downloading").map((m) => m.id);
  const own = typeof d.model === "string" && d.model ? d.model : "";
  if (own && !ids.includes(own)) ids.unshift(own);
  const sig = JSON.stringify([d.id, ids]);
  if (capReplayModel.dataset.sig === sig) return;
  const current = capReplayModel.dataset.sig && JSON.parse(capReplayModel.dataset.sig)[0] === d.id
    ? capReplayModel.value : "";
  capReplayModel.dataset.sig = sig;
  capReplayModel.replaceChildren(...ids.map((id) => {
    const o = el("option", "", id === own ? `${id} (as captured)` : id);
    o.value = id;
    return o;
  }));
  capReplayModel.value = current && ids.includes(current) ? current : own || ids[0] || "";
}

/** While a replay runs, its button stays where the focus is, says so and does nothing. */
function replayBusy(on) {
  capReplay.disabled = !on && !!(caps.open && notReplayable(caps.open));
  setAttr(capReplay, "aria-disabled", on ? "true" : "");
  setText(capReplay, on ? "Replaying…" : "Replay");
  capReplay.classList.toggle("busy", on);
  capCompare.setAttribute("aria-busy", on ? "true" : "false");
}

async function replayCapture() {
  const d = caps.open;
  if (!d || caps.replayCtrl) return;
  const model = capReplayModel.value;
  if (!model) {
    setText(capReplayStatus, "Pick a model first.");
    capReplayModel.focus();
    return;
  }
  const seq = caps.openSeq;
  const ctrl = new AbortController();
  caps.replayCtrl = ctrl;
  replayBusy(true);
  capReplayStatus.classList.remove("error");
  setText(capReplayStatus, `Replaying on ${model}: the whole request runs again…`);
  let again = null;
  let failure = "";
  const t0 = performance.now();
  try {
    again = await apiJSON(`/captures/${encodeURIComponent(d.id)}/replay`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model }),
      signal: ctrl.signal,
    });
  } catch (err) {
    if (ctrl.signal.aborted) return;
    failure = err && err.message ? err.message : String(err);
  } finally {
    if (caps.replayCtrl === ctrl) {
      caps.replayCtrl = null;
      replayBusy(false);
    }
  }
  if (seq !== caps.openSeq || caps.open !== d) return; // another capture was opened meanwhile
  const took = fmtDuration((performance.now() - t0) / 1000);
  if (failure) {
    capReplayStatus.classList.add("error");
    setText(capReplayStatus, `The replay on ${model} failed after ${took}.`);
    renderCompare(d, null, model, failure);
  } else {
    setText(capReplayStatus, `Replayed on ${model} in ${took}: capture ${again && again.id ? again.id : "?"}.`);
    renderCompare(d, again && typeof again === "object" ? again : {}, model, "");
    if (caps.running) loadCaptures(); // the replay is in the list too
  }
}

function sideView(kind, d, model, failure) {
  const side = el("section", `cap-side side-${kind}`);
  const headId = `cap-side-${kind}`;
  side.setAttribute("aria-labelledby", headId);
  const head = el("div", "cap-side-head");
  const h = el("h5", "cap-side-title", kind === "original" ? "Original" : "Replay");
  h.id = headId;
  head.append(h);
  const on = el("span", "cap-side-on muted", "on ");
  on.append(el("span", "cap-side-model", d && d.model ? d.model : model));
  head.append(on);
  if (d && d.id) {
    const id = el("code", "cap-side-id", d.id);
    id.title = kind === "original" ? "the original capture" : `the replay's capture (replay of ${d.replay_of || "?"})`;
    head.append(id);
  }
  side.append(head);
  if (failure) {
    const err = el("p", "cap-answer-error", `Replay failed: ${failure}`);
    err.setAttribute("role", "alert");
    side.append(err);
    return side;
  }
  // the numbers first, so that the two sides' line up whatever the answers' lengths
  const stats = el("dl", "cap-stats brief");
  stats.setAttribute("aria-label", `${kind === "original" ? "Original" : "Replay"}: timings and tokens`);
  stats.append(...statItems(d, true));
  side.append(stats, answerView(d.answer, d.response, { alert: kind === "replay" }));
  if (kind === "replay" && d.id) {
    const open = el("button", "small-btn", "Open this replay");
    open.type = "button";
    open.setAttribute("aria-label", `Open the replay's capture ${d.id}`);
    open.addEventListener("click", () => openCapture(d.id));
    side.append(open);
  }
  return side;
}

function sameAnswer(a, b) {
  const pick = (x) => (x && x.answer ? JSON.stringify([x.answer.thinking || "", x.answer.content || "",
    (Array.isArray(x.answer.calls) ? x.answer.calls : []).map((c) => [c && c.name, c && c.arguments])]) : "");
  return pick(a) === pick(b);
}

function renderCompare(original, again, model, failure) {
  const grid = el("div", "cap-compare-grid");
  grid.append(sideView("original", original, original.model, ""), sideView("replay", again, model, failure));
  const parts = [grid];
  if (again && !failure) {
    parts.unshift(el("p", "cap-same small", sameAnswer(original, again)
      ? "The replay's answer is the same as the original's." : "The replay's answer differs from the original's."));
  }
  capCompare.replaceChildren(...parts);
  capCompare.hidden = false;
}

capReplayForm.addEventListener("submit", (event) => {
  event.preventDefault();
  replayCapture().catch((err) => {
    replayBusy(false);
    setText(capReplayStatus, `Something went wrong: ${err && err.message ? err.message : err}`);
  });
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
    fillReplayModels();
  },
  newRequests: capturesChanged,
  stop: stopCaptures,
});
