/* The Downloads card: pull a model by name (POST /models/pull, its NDJSON progress on the status
 * line), and every pull the gateway runs, from this tab or elsewhere, with a bar per file and
 * Cancel (POST /models/pull/cancel); the list is drawn from GET /models and the live snapshots. */

import { AuthError, HttpError, apiJSON, authHeaders, checked, readNDJSON } from "../lib/api.js";
import { $, el, placeRows, setAttr, setDisabled, setText } from "../lib/dom.js";
import { basename, fmtBytes, fmtEta, isNum } from "../lib/format.js";
import { card, needKey } from "../lib/panels.js";
import { setAction } from "../lib/status.js";

const pullForm = $("pull-form");
const pullName = $("pull-name");
const pullInsecure = $("pull-insecure");
const pullStatus = $("pull-status");
const pullsList = $("pulls");
const pullsEmpty = $("pulls-empty");
const pullRows = new Map(); // asked -> row record
const pullStreams = new Set(); // AbortControllers of this tab's POST /models/pull streams
const cancelling = new Set(); // asked names whose cancel request is out
const ACTIVE_PULL = new Set(["planning", "downloading"]);
let pullSeq = 0; // the latest pull this tab started: the one its status line follows

function setPullStatus(text, isError) {
  pullStatus.classList.toggle("error", !!isError);
  setText(pullStatus, text || "");
}

function abortPulls() {
  for (const ctrl of pullStreams) ctrl.abort();
  pullStreams.clear();
}

/** "1.0 MiB of 5.0 MiB (20%)", or what of it is known. */
function fmtDone(completed, total) {
  if (isNum(total) && total > 0) {
    const done = isNum(completed) ? Math.min(completed, total) : 0;
    return `${fmtBytes(done)} of ${fmtBytes(total)} (${Math.floor((100 * done) / total)}%)`;
  }
  return isNum(completed) && completed > 0 ? fmtBytes(completed) : "";
}

function createPullRow(asked) {
  const li = el("li", "pull");
  li.dataset.pull = asked;
  const head = el("div", "pull-head");
  const title = el("div", "pull-title");
  const name = el("span", "pull-name");
  const askedAs = el("span", "pull-asked small muted");
  title.append(name, askedAs);
  const badge = el("span", "badge");
  const meta = el("span", "pull-meta small muted");
  const cancel = el("button", "pull-cancel small-btn", "Cancel");
  cancel.type = "button";
  cancel.setAttribute("aria-label", `Cancel pull of ${asked}`);
  cancel.addEventListener("click", () => cancelPull(asked));
  head.append(title, badge, meta, cancel);
  const files = el("ul", "pull-files");
  const error = el("p", "pull-error");
  error.hidden = true;
  li.append(head, files, error);
  return { asked, li, name, askedAs, badge, meta, cancel, files, error, fileRows: new Map(), sig: "" };
}

function createFileRow() {
  const li = el("li", "pull-file");
  const name = el("span", "pull-file-name");
  const bar = el("progress", "file-progress bar");
  const bytes = el("span", "pull-file-bytes small muted");
  li.append(name, bar, bytes);
  return { li, name, bar, bytes };
}

function updateFileRow(f, file, state) {
  const full = typeof file.name === "string" && file.name ? file.name : String(file.digest || "file");
  setText(f.name, basename(full) || full);
  setAttr(f.name, "title", file.digest && file.digest !== full ? `${full}\n${file.digest}` : full);
  const total = isNum(file.total) && file.total > 0 ? file.total : null;
  const done = isNum(file.completed) ? Math.max(0, file.completed) : 0;
  if (total === null) {
    // size unknown: an indeterminate bar while it runs, an empty one after
    if (ACTIVE_PULL.has(state)) f.bar.removeAttribute("value");
    else f.bar.value = 0;
  } else {
    if (f.bar.max !== total) f.bar.max = total;
    const value = state === "done" ? total : Math.min(done, total);
    if (f.bar.value !== value || !f.bar.hasAttribute("value")) f.bar.value = value;
  }
  f.bar.setAttribute("aria-label", `${basename(full) || full}: ${fmtDone(done, total) || "size unknown"}`);
  setText(f.bytes, fmtDone(state === "done" && total !== null ? total : done, total) || "—");
}

function updatePullRow(row, p) {
  const state = typeof p.state === "string" && p.state ? p.state : "unknown";
  const active = ACTIVE_PULL.has(state);
  const name = typeof p.name === "string" && p.name ? p.name : row.asked;
  setText(row.name, name);
  setText(row.askedAs, name !== row.asked ? `asked as ${row.asked}` : "");
  row.askedAs.hidden = name === row.asked;
  const stateClass = `badge state-${state.replace(/[^a-z-]/gi, "")}`;
  if (row.badge.className !== stateClass) row.badge.className = stateClass;
  setText(row.badge, state);
  setAttr(row.li, "data-state", state);

  // what it is doing, how far, how fast, how long still
  const meta = [];
  if (p.source) meta.push(String(p.source));
  if (active && p.step && p.step !== state) meta.push(String(p.step));
  const done = fmtDone(p.completed, p.total);
  if (done && state !== "done") meta.push(done);
  else if (state === "done" && isNum(p.total) && p.total > 0) meta.push(fmtBytes(p.total));
  if (active && isNum(p.bytes_per_second) && p.bytes_per_second > 0) meta.push(`${fmtBytes(p.bytes_per_second)}/s`);
  if (active && isNum(p.eta_seconds)) meta.push(`${fmtEta(p.eta_seconds)} left`);
  setText(row.meta, meta.join(" · "));

  // disabled first, so that a focused Cancel hands its focus on before it is hidden
  setDisabled(row.cancel, !active || cancelling.has(row.asked), pullName);
  row.cancel.hidden = !active;

  // one bar per file, in the order the pull fetches them
  const files = (Array.isArray(p.files) ? p.files : []).filter((f) => f && typeof f === "object");
  const seen = new Set();
  let prev = null;
  files.forEach((file, i) => {
    let key = String(file.digest || file.name || i);
    if (seen.has(key)) key += `#${i}`;
    seen.add(key);
    let f = row.fileRows.get(key);
    if (!f) {
      f = createFileRow();
      row.fileRows.set(key, f);
    }
    updateFileRow(f, file, state);
    const expected = prev ? prev.nextSibling : row.files.firstChild;
    if (expected !== f.li) row.files.insertBefore(f.li, expected);
    prev = f.li;
  });
  for (const [key, f] of row.fileRows) {
    if (!seen.has(key)) {
      f.li.remove();
      row.fileRows.delete(key);
    }
  }
  row.files.hidden = !files.length;

  const err = p.error && typeof p.error === "object" ? p.error : null;
  const message = err && err.message ? String(err.message) : typeof p.error === "string" ? p.error : "";
  setText(row.error, message);
  row.error.hidden = !message;
  row.error.classList.toggle("cancelled", state === "cancelled");
}

/** Draws the pulls of a snapshot (or of GET /models): running ones first, then the finished, newest first. */
function renderPulls(list) {
  const rows = (Array.isArray(list) ? list : []).filter((p) => p && typeof p === "object");
  const running = rows.filter((p) => ACTIVE_PULL.has(p.state));
  const finished = rows.filter((p) => !ACTIVE_PULL.has(p.state)).reverse();
  const items = new Map();
  for (const p of [...running, ...finished]) {
    const asked = typeof p.asked === "string" && p.asked ? p.asked : typeof p.name === "string" ? p.name : "";
    if (asked && !items.has(asked)) items.set(asked, p);
  }
  const seen = placeRows(pullsList, pullRows, items, createPullRow, updatePullRow, (row) => row.li, (row) => {
    if (document.activeElement === row.cancel) pullName.focus();
  });
  pullsList.hidden = !seen.size;
  pullsEmpty.hidden = seen.size > 0;
}

/** The status line for one progress line of a pull this tab started. */
function pullProgressText(name, line) {
  const parts = [String(line.status || "pulling")];
  const done = fmtDone(line.completed, line.total);
  if (done) parts.push(done);
  if (isNum(line.bytes_per_second) && line.bytes_per_second > 0) parts.push(`${fmtBytes(line.bytes_per_second)}/s`);
  if (isNum(line.eta_seconds)) parts.push(`${fmtEta(line.eta_seconds)} left`);
  return `Pulling ${line.model ? String(line.model) : name}: ${parts.join(" · ")}`;
}

async function startPull() {
  const name = pullName.value.trim();
  pullName.removeAttribute("aria-invalid");
  if (!name) {
    pullName.setAttribute("aria-invalid", "true");
    setPullStatus("Enter the name of a model to pull.", true);
    pullName.focus();
    return;
  }
  const insecure = pullInsecure.checked;
  const seq = ++pullSeq;
  const latest = () => seq === pullSeq;
  const ctrl = new AbortController();
  pullStreams.add(ctrl);
  setPullStatus(`Pulling ${name}…`);
  let outcome = null; // { model } on success, { error } else
  try {
    const resp = await checked(await fetch("/models/pull", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json", Accept: "application/x-ndjson" }),
      body: JSON.stringify({ model: name, insecure }),
      cache: "no-store",
      signal: ctrl.signal,
    }));
    if (!resp.body) {
      outcome = { error: "the gateway sent no progress" };
    } else {
      await readNDJSON(resp, (line) => {
        if (!line || typeof line !== "object") return false;
        if (line.error !== undefined && line.error !== null) {
          const err = line.error;
          outcome = { error: typeof err === "object" && err.message ? String(err.message) : String(err) };
          return true;
        }
        if (line.status === "success") {
          outcome = { model: line.model ? String(line.model) : name };
          return true;
        }
        if (latest()) setPullStatus(pullProgressText(name, line));
        return false;
      });
    }
  } catch (err) {
    if (err instanceof AuthError) {
      pullStreams.delete(ctrl);
      needKey(false);
      return;
    }
    if (ctrl.signal.aborted) {
      pullStreams.delete(ctrl);
      return;
    }
    outcome = { error: err instanceof HttpError ? err.message : `request failed: ${err && err.message ? err.message : err}` };
  }
  pullStreams.delete(ctrl);
  if (ctrl.signal.aborted) return;
  if (!outcome) {
    outcome = { error: "the connection ended before the pull did; it may still be running (see Downloads)" };
  }
  if (outcome.model) {
    if (pullName.value.trim() === name) pullName.value = "";
    if (latest()) setPullStatus(`Pulled ${outcome.model}: it is in the models table.`);
  } else if (/\bcancell?ed\s*$/i.test(outcome.error)) {
    if (latest()) setPullStatus(`Pull of ${name} cancelled.`);
  } else {
    if (latest()) setPullStatus(`Could not pull ${name}: ${outcome.error}`, true);
  }
}

async function cancelPull(asked) {
  if (cancelling.has(asked)) return;
  cancelling.add(asked);
  const row = pullRows.get(asked);
  if (row) setDisabled(row.cancel, true, pullName);
  try {
    await apiJSON("/models/pull/cancel", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: asked }),
    });
    setAction(`Cancel sent for the pull of ${asked}.`);
  } catch (err) {
    if (err instanceof AuthError) {
      cancelling.delete(asked);
      needKey(false);
      return;
    }
    setPullStatus(`Could not cancel ${asked}: ${err.message}`, true);
  }
  cancelling.delete(asked);
  const after = pullRows.get(asked);
  if (after) setDisabled(after.cancel, !ACTIVE_PULL.has(after.li.dataset.state), pullName);
}

pullForm.addEventListener("submit", (event) => {
  event.preventDefault();
  startPull().catch((err) => {
    setPullStatus(`Something went wrong: ${err && err.message ? err.message : err}`, true);
  });
});

pullName.addEventListener("input", () => pullName.removeAttribute("aria-invalid"));

card({
  start(body) {
    if (body && Array.isArray(body.pulls)) renderPulls(body.pulls);
  },
  snapshot(snap) {
    if (Array.isArray(snap.pulls)) renderPulls(snap.pulls);
  },
  stop: abortPulls,
});
