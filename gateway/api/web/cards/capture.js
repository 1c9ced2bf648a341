/* The capture opened in the Requests card (GET /captures/{id}): its request as its wire gives it,
 * the answer read back, its times and counts, the stream's writes as they were sent, the raw
 * bodies on demand, a curl command, and a replay on another model beside the original
 * (POST /captures/{id}/replay). The list (captures.js) binds what it does when one opens or
 * closes; this module imports no card. */

import { apiJSON } from "../lib/api.js";
import { $, el, setAttr, setText } from "../lib/dom.js";
import { fmtBytes, fmtDuration, fmtNumber, isNum } from "../lib/format.js";
import {
  CAP_MAX_TEXT, answerView, capped, fmtAt, headerText, notReplayable, rawBlock, requestView, statItems,
} from "./capture-views.js";

const CAP_EVENT_ROWS = 200; // a stream's writes shown at once; "Show more" adds as many again

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

const opened = {
  open: null, openId: null, openCtrl: null, openSeq: 0, // the capture opened
  replayCtrl: null, shown: 0, // a replay running; the stream's writes drawn
};
let models = []; // the Models card's list: the replay's choices
// what the list does when a capture opens or closes (captures.js binds it)
const list = { changed() {}, focus() {}, reload() {} };

export const openedId = () => opened.openId;

export function bindList(hooks) {
  Object.assign(list, hooks);
}

export function setModels(all) {
  models = all;
  fillReplayModels();
}

export function closeCapture(focusList) {
  opened.openSeq++;
  if (opened.openCtrl) opened.openCtrl.abort();
  opened.openCtrl = null;
  abortReplay();
  const id = opened.openId;
  opened.open = null;
  opened.openId = null;
  capDetail.hidden = true;
  capRequest.replaceChildren();
  capAnswer.replaceChildren();
  capTiming.replaceChildren();
  capTimeline.replaceChildren();
  capRawBody.replaceChildren();
  capCompare.replaceChildren();
  capCompare.hidden = true;
  capCurl.value = "";
  list.changed();
  if (focusList) {
    list.focus(id);
  }
}

function abortReplay() {
  if (opened.replayCtrl) opened.replayCtrl.abort();
  opened.replayCtrl = null;
  replayBusy(false);
}

export async function openCapture(id) {
  if (opened.openId === id && opened.open) {
    capDetail.focus();
    return;
  }
  const seq = ++opened.openSeq;
  if (opened.openCtrl) opened.openCtrl.abort();
  abortReplay();
  const ctrl = new AbortController();
  opened.openCtrl = ctrl;
  opened.openId = id;
  opened.open = null;
  list.changed();
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
    if (seq !== opened.openSeq) return;
    opened.open = detail && typeof detail === "object" ? detail : {};
    renderDetail(opened.open);
  } catch (err) {
    if (ctrl.signal.aborted || seq !== opened.openSeq) return;
    setText(capDetailError, `Could not open this capture: ${err && err.message ? err.message : err}`);
    capDetailError.hidden = false;
  } finally {
    if (seq === opened.openSeq) {
      opened.openCtrl = null;
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
  opened.shown = 0;
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

/** The stream's writes from opened.shown on, CAP_EVENT_ROWS more of them. */
function showEvents(events) {
  const start = opened.shown;
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
  opened.shown = end;
  const d = opened.open || {};
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
  const events = opened.open && opened.open.response && Array.isArray(opened.open.response.events)
    ? opened.open.response.events : [];
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
  if (!capRaw.open || capRawBody.childElementCount || !opened.open) return;
  const d = opened.open;
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
  const d = opened.open;
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
  capReplay.disabled = !on && !!(opened.open && notReplayable(opened.open));
  setAttr(capReplay, "aria-disabled", on ? "true" : "");
  setText(capReplay, on ? "Replaying…" : "Replay");
  capReplay.classList.toggle("busy", on);
  capCompare.setAttribute("aria-busy", on ? "true" : "false");
}

async function replayCapture() {
  const d = opened.open;
  if (!d || opened.replayCtrl) return;
  const model = capReplayModel.value;
  if (!model) {
    setText(capReplayStatus, "Pick a model first.");
    capReplayModel.focus();
    return;
  }
  const seq = opened.openSeq;
  const ctrl = new AbortController();
  opened.replayCtrl = ctrl;
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
    if (opened.replayCtrl === ctrl) {
      opened.replayCtrl = null;
      replayBusy(false);
    }
  }
  if (seq !== opened.openSeq || opened.open !== d) return; // another capture was opened meanwhile
  const took = fmtDuration((performance.now() - t0) / 1000);
  if (failure) {
    capReplayStatus.classList.add("error");
    setText(capReplayStatus, `The replay on ${model} failed after ${took}.`);
    renderCompare(d, null, model, failure);
  } else {
    setText(capReplayStatus, `Replayed on ${model} in ${took}: capture ${again && again.id ? again.id : "?"}.`);
    renderCompare(d, again && typeof again === "object" ? again : {}, model, "");
    list.reload(); // the replay is in the list too
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
