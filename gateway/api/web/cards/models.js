/* The Models card: each model the key may use, its file, state, device, memory and slots, with
 * Load and Unload; a filter by name, alias or source. Drawn from GET /models at the start and
 * from each live snapshot; the other cards' model pickers follow it (panels.each "models"). */

import { AuthError, apiJSON } from "../lib/api.js";
import { $, el, placeRows, setAttr, setDisabled, setText } from "../lib/dom.js";
import { basename, fmtBytes, hostOf, isNum } from "../lib/format.js";
import { card, each, needKey } from "../lib/panels.js";
import { setAction } from "../lib/status.js";

const MAX_ALIASES_SHOWN = 3; // beside a model's name; all of them in its tooltip

const modelsTable = $("models");
const modelsBody = modelsTable.tBodies[0];
const modelsEmpty = $("models-empty");
const modelFilter = $("model-filter");
const modelRows = new Map(); // id -> row record
const pending = new Map(); // id -> "load" | "unload" while a request is out
let models = [];

function createModelRow(id) {
  const tr = el("tr");
  tr.dataset.model = id;
  const name = el("th", "m-name");
  name.scope = "row";
  const nameId = el("span", "name-id", id);
  const aliases = el("span", "aliases small muted");
  name.append(nameId, aliases);
  const cells = {
    name,
    aliases,
    source: el("td", "m-source"),
    file: el("td", "m-file"),
    size: el("td", "m-size num"),
    quant: el("td", "m-quant"),
    arch: el("td", "m-arch"),
    state: el("td", "m-state"),
    device: el("td", "m-device"),
    memory: el("td", "m-memory num"),
    slots: el("td", "m-slots num"),
    queue: el("td", "m-queue num"),
    actions: el("td", "m-actions"),
  };
  const load = el("button", "load small-btn", "Load");
  load.type = "button";
  load.setAttribute("aria-label", `Load ${id}`);
  const unload = el("button", "unload small-btn", "Unload");
  unload.type = "button";
  unload.setAttribute("aria-label", `Unload ${id}`);
  load.addEventListener("click", () => modelAction(id, "load"));
  unload.addEventListener("click", () => modelAction(id, "unload"));
  cells.actions.append(load, unload);
  // each cell names its column, for the narrow layout where the rows are cards
  const labels = { source: "Source", file: "File", size: "Size", quant: "Quant", arch: "Arch", state: "State",
    device: "Device", memory: "Memory", slots: "Slots", queue: "Queue" };
  for (const [key, label] of Object.entries(labels)) cells[key].dataset.label = label;
  tr.append(name, cells.source, cells.file, cells.size, cells.quant, cells.arch, cells.state,
    cells.device, cells.memory, cells.slots, cells.queue, cells.actions);
  return { id, tr, cells, load, unload, stateSig: "", fileSig: "", archSig: "", model: null };
}

const KNOWN_STATES = new Set(["unloaded", "loading", "ready", "failed"]);

/** Whether a model's state shows a progress bar (its share done in m.progress). */
const hasProgress = (m) => (m.state === "loading" || m.state === "downloading") && isNum(m.progress);

function stateLabel(m) {
  if (hasProgress(m)) return `${m.state} ${Math.round(m.progress * 100)}%`;
  return String(m.state || "unknown");
}

function updateStateCell(row, m) {
  const label = stateLabel(m);
  const error = m.error ? String(m.error) : "";
  const retry = m.state === "failed" && isNum(m.retry_after) ? `retry in ${m.retry_after} s` : "";
  const progress = hasProgress(m) ? m.progress : null;
  const sig = JSON.stringify([label, m.state, error, retry, progress]);
  if (sig === row.stateSig) return;
  row.stateSig = sig;
  const cell = row.cells.state;
  const badge = el("span", `badge state-${String(m.state || "unknown").replace(/[^a-z-]/gi, "")}`, label);
  const parts = [badge];
  if (progress !== null) {
    const bar = el("progress", "load-progress bar");
    bar.max = 1;
    bar.value = Math.min(1, Math.max(0, progress));
    bar.setAttribute("aria-hidden", "true");
    bar.tabIndex = -1;
    parts.push(bar);
  }
  if (error) {
    parts.push(document.createTextNode(" "));
    const e = el("span", "m-error", error);
    e.title = error;
    parts.push(e);
  }
  if (retry) {
    parts.push(document.createTextNode(" "));
    parts.push(el("span", "m-retry small muted", retry));
  }
  cell.replaceChildren(...parts);
}

function updateFileCell(row, m) {
  let text = "—";
  let title = "";
  let sub = "";
  if (m.path) {
    text = basename(m.path);
    title = String(m.path);
  } else if (m.upstream && typeof m.upstream === "object") {
    text = String(m.upstream.model || m.id);
    title = String(m.upstream.url || "");
    sub = hostOf(m.upstream.url);
    if (m.upstream.state) sub += ` · ${m.upstream.state}`;
    if (m.upstream.error) title += `\n${m.upstream.error}`;
  } else if (Array.isArray(m.replicas) && m.replicas.length) {
    text = `${m.replicas.length} replica${m.replicas.length === 1 ? "" : "s"}`;
    title = m.replicas.map((r) => {
      const id = r && (r.id || r.name || r.url) ? String(r.id || r.name || r.url) : "?";
      const up = r && r.up === true ? "up" : r && r.up === false ? "down" : "";
      return up ? `${id} (${up})` : id;
    }).join("\n");
  }
  const sig = JSON.stringify([text, title, sub]);
  if (sig === row.fileSig) return;
  row.fileSig = sig;
  const main = el("span", "file-name", text);
  const parts = [main];
  if (sub) {
    parts.push(document.createTextNode(" "));
    parts.push(el("span", "sub small muted", sub));
  }
  row.cells.file.replaceChildren(...parts);
  setAttr(row.cells.file, "title", title);
}

function updateArchCell(row, m) {
  const arch = m.architecture ? String(m.architecture) : "—";
  const ctx = isNum(m.n_ctx) ? m.n_ctx : isNum(m.context_length) ? m.context_length : null;
  const sub = ctx !== null ? `ctx ${ctx.toLocaleString("en-US")}` : "";
  const sig = JSON.stringify([arch, sub]);
  if (sig === row.archSig) return;
  row.archSig = sig;
  const parts = [document.createTextNode(arch)];
  if (sub) {
    parts.push(document.createTextNode(" "));
    parts.push(el("span", "sub small muted", sub));
  }
  row.cells.arch.replaceChildren(...parts);
  const title = [];
  if (isNum(m.n_ctx)) title.push(`context in use: ${m.n_ctx}`);
  if (isNum(m.context_length)) title.push(`trained context: ${m.context_length}`);
  setAttr(row.cells.arch, "title", title.join("\n"));
}

function updateButtons(row) {
  const m = row.model || {};
  const busy = pending.has(row.id);
  const unknown = !KNOWN_STATES.has(m.state); // downloading, or a state newer than this page
  const loadOff = busy || unknown || m.state === "ready" || m.state === "loading";
  const unloadOff = busy || unknown || m.state === "unloaded";
  // Enable first, so that focus can move to a button that is usable.
  if (!loadOff) setDisabled(row.load, false);
  if (!unloadOff) setDisabled(row.unload, false);
  setDisabled(row.load, loadOff, row.unload);
  setDisabled(row.unload, unloadOff, row.load);
  row.tr.classList.toggle("busy", busy);
}

function updateModelRow(row, m) {
  row.model = m;
  const aliases = Array.isArray(m.aliases) ? m.aliases.filter((a) => a && a !== m.id).map(String) : [];
  // a pulled model answers to many spellings of its name: the first few, the rest on hover (the filter finds all)
  const more = aliases.length - MAX_ALIASES_SHOWN;
  setText(row.cells.aliases, more > 0
    ? `${aliases.slice(0, MAX_ALIASES_SHOWN).join(", ")} +${more} more` : aliases.join(", "));
  setAttr(row.cells.aliases, "title", more > 0 ? aliases.join("\n") : "");
  row.cells.aliases.hidden = !aliases.length;
  setText(row.cells.source, m.source || "—");
  updateFileCell(row, m);
  setText(row.cells.size, fmtBytes(m.file_size));
  setText(row.cells.quant, m.quantization || "—");
  updateArchCell(row, m);
  updateStateCell(row, m);
  setText(row.cells.device, m.device || "—");
  // once loaded: what llama.cpp allocated; before: the gateway's estimate of it
  const alloc = m.memory_allocated && isNum(m.memory_allocated.total) ? m.memory_allocated.total : null;
  const est = m.memory_estimate && isNum(m.memory_estimate.total) ? m.memory_estimate.total : null;
  setText(row.cells.memory, alloc !== null ? fmtBytes(alloc) : est !== null ? `est. ${fmtBytes(est)}` : "—");
  // by pool (ram, cuda0, ...), where a model's memory lies on more than system memory
  const byDevice = (d) => {
    const parts = d && typeof d === "object" ? Object.entries(d).filter(([, n]) => isNum(n)) : [];
    return parts.length > 1 ? ` (${parts.map(([k, n]) => `${k} ${fmtBytes(n)}`).join(", ")})` : "";
  };
  setAttr(row.cells.memory, "title", [
    alloc !== null ? `llama.cpp allocated ${fmtBytes(alloc)}${byDevice(m.memory_allocated.devices)}` : "",
    est !== null ? `estimated ${fmtBytes(est)}${byDevice(m.memory_estimate.devices)}` : "",
    isNum(m.memory_bytes) ? `resident ${fmtBytes(m.memory_bytes)}` : "",
  ].filter(Boolean).join("; "));
  const inFlight = isNum(m.in_flight) ? m.in_flight : 0;
  if (m.slots && isNum(m.slots.busy) && isNum(m.slots.total)) {
    setText(row.cells.slots, `${m.slots.busy}/${m.slots.total}`);
  } else {
    setText(row.cells.slots, inFlight ? `${inFlight} active` : "—");
  }
  setAttr(row.cells.slots, "title", `${inFlight} in flight`);
  setText(row.cells.queue, isNum(m.queued) ? String(m.queued) : "0");
  setAttr(row.tr, "data-state", m.state || "");
  updateButtons(row);
}

function renderModels(list) {
  const seen = new Set();
  const fresh = [];
  for (const m of Array.isArray(list) ? list : []) {
    if (!m || typeof m !== "object" || typeof m.id !== "string" || seen.has(m.id)) continue;
    seen.add(m.id);
    fresh.push(m);
  }
  placeRows(modelsBody, modelRows, fresh.map((m) => [m.id, m]), createModelRow, updateModelRow, (row) => row.tr);
  models = fresh;
  applyFilter();
  each("models", models); // the cards' model pickers
}

function mergeModel(m) {
  if (!m || typeof m.id !== "string") return;
  const list = models.slice();
  const i = list.findIndex((x) => x.id === m.id);
  if (i >= 0) list[i] = m;
  else list.push(m);
  renderModels(list);
}

function applyFilter() {
  const q = modelFilter.value.trim().toLowerCase();
  let shown = 0;
  for (const m of models) {
    const row = modelRows.get(m.id);
    if (!row) continue;
    const hay = [m.id, ...(Array.isArray(m.aliases) ? m.aliases : []), m.source || ""]
      .map((s) => String(s).toLowerCase());
    const visible = !q || hay.some((s) => s.includes(q));
    if (row.tr.hidden === visible) row.tr.hidden = !visible;
    if (visible) shown++;
  }
  let msg = "";
  if (!models.length) msg = "No models are configured.";
  else if (!shown) msg = `No models match “${modelFilter.value.trim()}”.`;
  setText(modelsEmpty, msg);
  modelsEmpty.hidden = !msg;
}

modelFilter.addEventListener("input", applyFilter);

async function modelAction(id, action) {
  if (pending.has(id)) return;
  const row = modelRows.get(id);
  const hadFocus = row && (document.activeElement === row.load || document.activeElement === row.unload);
  pending.set(id, action);
  if (row) updateButtons(row);
  setAction(action === "load" ? `Loading ${id}…` : `Unloading ${id}…`);
  try {
    const m = await apiJSON(`/models/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: id }),
    });
    pending.delete(id);
    if (m && typeof m === "object" && m.id) mergeModel(m);
    const state = m && m.state ? stateLabel(m) : "done";
    setAction(m && m.state === "failed" && m.error ? `${id}: failed: ${m.error}` : `${id}: ${state}`,
      m && m.state === "failed");
  } catch (err) {
    pending.delete(id);
    if (err instanceof AuthError) {
      needKey(false);
      return;
    }
    setAction(`Could not ${action} ${id}: ${err.message}`, true);
  }
  const after = modelRows.get(id);
  if (after) {
    updateButtons(after);
    // Keyboard users lose focus while both buttons are disabled: put it back in the row.
    if (hadFocus && (document.activeElement === document.body || document.activeElement === null)) {
      const target = [action === "load" ? after.unload : after.load, after.load, after.unload]
        .find((b) => !b.disabled);
      if (target) target.focus();
    }
  }
}

card({
  start(body) {
    // /models lists the models being pulled too ("state": "downloading"): the Downloads list
    // shows those, and the table, as the live snapshots draw it, only the models there are
    const rows = body && Array.isArray(body.data) ? body.data : [];
    renderModels(rows.filter((m) => !(m && m.state === "downloading")));
  },
  snapshot(snap) {
    if (Array.isArray(snap.models)) renderModels(snap.models);
  },
});
