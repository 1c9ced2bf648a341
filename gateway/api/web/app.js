/* gguf-gateway dashboard and playground.
 *
 * Plain script, no build step, no dependencies. Runs under a strict CSP (no inline script or
 * style, no eval), so every node is built with createElement / textContent; data from the
 * server (model names, errors, chat text) is never parsed as HTML.
 */
"use strict";

(() => {
  const KEY_STORAGE = "gguf-gateway-key";
  const LIVE_RETRY_MS = 2500;
  const BOOT_RETRY_MS = 5000;
  const MAX_ALIASES_SHOWN = 3; // beside a model's name; all of them in its tooltip
  const WINDOW_S = 600; // the charts show the last ten minutes
  const SVG_NS = "http://www.w3.org/2000/svg";
  const CHART_W = 240;
  const CHART_H = 60;

  const $ = (id) => document.getElementById(id);

  // ---- small helpers ------------------------------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  /** Sets textContent only when it changed, so unchanged cells are not touched each second. */
  function setText(node, text) {
    const value = text === undefined || text === null ? "" : String(text);
    if (node.textContent !== value) node.textContent = value;
  }

  function setAttr(node, name, value) {
    if (value === undefined || value === null || value === "") {
      if (node.hasAttribute(name)) node.removeAttribute(name);
    } else if (node.getAttribute(name) !== String(value)) {
      node.setAttribute(name, String(value));
    }
  }

  const isNum = (v) => typeof v === "number" && Number.isFinite(v);

  function fmtBytes(n) {
    if (!isNum(n) || n < 0) return "—";
    if (n < 1024) return `${n} B`;
    if (n < 1024 ** 2) return `${(n / 1024).toFixed(0)} KiB`;
    if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(n < 10 * 1024 ** 2 ? 1 : 0)} MiB`;
    return `${(n / 1024 ** 3).toFixed(n < 100 * 1024 ** 3 ? 1 : 0)} GiB`;
  }

  function fmtNumber(v, digits) {
    if (!isNum(v)) return "–";
    if (digits === 0) return Math.round(v).toLocaleString("en-US");
    const d = digits === undefined ? (Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) : digits;
    return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  }

  function fmtDuration(s) {
    if (!isNum(s)) return "—";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
    const m = Math.floor(s / 60);
    return `${m} min ${Math.round(s - m * 60)} s`;
  }

  /** A time left, rounded to what a reader needs: "8 s", "2 min 5 s", "1 h 12 min". */
  function fmtEta(s) {
    if (!isNum(s) || s < 0) return "";
    const t = Math.max(1, Math.round(s));
    if (t < 60) return `${t} s`;
    if (t < 3600) return `${Math.floor(t / 60)} min ${t % 60} s`;
    return `${Math.floor(t / 3600)} h ${Math.floor((t % 3600) / 60)} min`;
  }

  function pad2(n) {
    return String(n).padStart(2, "0");
  }

  function fmtClock(epoch) {
    if (!isNum(epoch)) return "—";
    const d = new Date(epoch * 1000);
    return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
  }

  function basename(path) {
    if (typeof path !== "string" || !path) return "";
    const parts = path.split(/[\\/]/).filter(Boolean);
    return parts.length ? parts[parts.length - 1] : path;
  }

  function hostOf(url) {
    try {
      return new URL(url).host;
    } catch (_) {
      return String(url || "");
    }
  }

  // ---- API key + fetch ----------------------------------------------------------------------

  function getKey() {
    try {
      return sessionStorage.getItem(KEY_STORAGE) || "";
    } catch (_) {
      return "";
    }
  }

  function setKey(key) {
    try {
      sessionStorage.setItem(KEY_STORAGE, key);
    } catch (_) {
      /* storage unavailable: the key lives only as long as this call chain */
    }
  }

  function clearKey() {
    try {
      sessionStorage.removeItem(KEY_STORAGE);
    } catch (_) {
      /* nothing to clear */
    }
  }

  function authHeaders(extra) {
    const headers = Object.assign({}, extra || {});
    const key = getKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.name = "HttpError";
      this.status = status;
    }
  }

  class AuthError extends HttpError {
    constructor(message) {
      super(401, message);
      this.name = "AuthError";
    }
  }

  /** The message of an OpenAI-shaped error body, or a fallback built from the status line. */
  async function errorMessage(resp) {
    let text = "";
    try {
      text = await resp.text();
    } catch (_) {
      /* body unreadable */
    }
    if (text) {
      try {
        const body = JSON.parse(text);
        const err = body && body.error;
        if (err && typeof err === "object" && err.message) return String(err.message);
        if (typeof err === "string" && err) return err;
        if (body && typeof body.message === "string" && body.message) return body.message;
      } catch (_) {
        /* not JSON: fall through */
      }
      const trimmed = text.trim();
      if (trimmed && trimmed.length < 300 && !trimmed.startsWith("<")) return trimmed;
    }
    return `HTTP ${resp.status}${resp.statusText ? " " + resp.statusText : ""}`;
  }

  /** The response when it succeeded; else throws AuthError (401) or HttpError, with the server's message. */
  async function checked(resp) {
    if (resp.status === 401) throw new AuthError(await errorMessage(resp));
    if (!resp.ok) throw new HttpError(resp.status, await errorMessage(resp));
    return resp;
  }

  async function apiJSON(path, options) {
    const opts = Object.assign({ cache: "no-store" }, options || {});
    opts.headers = authHeaders(Object.assign({ Accept: "application/json" }, opts.headers || {}));
    return (await checked(await fetch(path, opts))).json();
  }

  /**
   * Reads a text/event-stream body. onEvent({event, data}) is called at the blank line that ends
   * each event; returning true stops reading. onComment(text) gets ":" comment lines.
   */
  async function readSSE(resp, onEvent, onComment) {
    let eventName = "";
    let data = [];

    const dispatch = () => {
      const stop = data.length > 0 && onEvent({ event: eventName || "message", data: data.join("\n") }) === true;
      eventName = "";
      data = [];
      return stop;
    };

    const stopped = await readLines(resp, (text) => {
      if (text === "") return dispatch();
      if (text.startsWith(":")) {
        if (onComment) onComment(text.slice(1).trim());
        return false;
      }
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") eventName = value;
      else if (field === "data") data.push(value);
      return false;
    });
    if (!stopped) dispatch();
  }

  /**
   * Reads a newline-delimited JSON body (application/x-ndjson): onLine(object) for each line that
   * parses as JSON; returning true stops reading. Lines that do not parse are skipped.
   */
  async function readNDJSON(resp, onLine) {
    await readLines(resp, (text) => {
      const trimmed = text.trim();
      if (!trimmed) return false;
      let obj;
      try {
        obj = JSON.parse(trimmed);
      } catch (_) {
        return false; // a damaged line: wait for the next one
      }
      return onLine(obj) === true;
    });
  }

  /**
   * Reads a body a line at a time ("\r\n", "\r" or "\n" ends one): onLine(text) for each, the
   * last unended one included; returning true stops reading. Resolves to whether it was stopped.
   * Stopped early, or a handler threw: the body is closed rather than the connection left open.
   */
  async function readLines(resp, onLine) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let stop = false;
    let ended = false;

    const drain = (final) => {
      while (!stop) {
        const match = /\r\n|\r|\n/.exec(buffer);
        if (!match) break;
        // A lone "\r" at the very end may be the first half of "\r\n": wait for more.
        if (!final && match[0] === "\r" && match.index === buffer.length - 1) break;
        const text = buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
        stop = onLine(text) === true;
      }
    };

    try {
      while (!stop) {
        const { value, done } = await reader.read();
        if (done) {
          ended = true;
          buffer += decoder.decode();
          drain(true);
          if (!stop && buffer) stop = onLine(buffer) === true;
          break;
        }
        buffer += decoder.decode(value, { stream: true });
        drain(false);
      }
    } finally {
      if (!ended) reader.cancel().catch(() => {});
    }
    return stop;
  }

  // ---- status area --------------------------------------------------------------------------

  const connStatus = $("conn-status");
  const actionStatus = $("action-status");
  let actionTimer = 0;

  function setConn(state, text) {
    connStatus.dataset.state = state;
    setText(connStatus, text);
  }

  function setAction(text, isError) {
    clearTimeout(actionTimer);
    actionStatus.classList.toggle("error", !!isError);
    setText(actionStatus, text || "");
    if (text && !isError) actionTimer = setTimeout(() => setText(actionStatus, ""), 8000);
  }

  // ---- key form / app visibility ------------------------------------------------------------

  const keyForm = $("key-form");
  const keyInput = $("key-input");
  const keySubmit = $("key-submit");
  const keyError = $("key-error");
  const appRoot = $("app");
  const nav = $("nav");
  let bootTimer = 0;
  let booting = false;

  function showKeyError(text) {
    setText(keyError, text || "");
    keyError.hidden = !text;
  }

  /** Back to the key form: stops everything that talks to the server. refused: a key was sent and refused. */
  function needKey(refused) {
    const hadKey = !!getKey();
    stopLive();
    stopUsage();
    stopCaptures();
    abortChat();
    abortPulls();
    clearTimeout(bootTimer);
    clearKey();
    appRoot.hidden = true;
    nav.hidden = true;
    keyForm.hidden = false;
    showKeyError(refused || hadKey ? "That key was refused. Check it and try again." : "");
    setConn("locked", "API key needed");
    setAction("");
    keyInput.value = "";
    keyInput.focus();
  }

  function showApp() {
    const fromForm = !keyForm.hidden;
    keyForm.hidden = true;
    showKeyError("");
    keyInput.value = "";
    appRoot.hidden = false;
    nav.hidden = false;
    if (fromForm) $("main").focus({ preventScroll: true });
  }

  async function boot() {
    if (booting) return;
    booting = true;
    clearTimeout(bootTimer);
    const hadKey = !!getKey();
    if (appRoot.hidden) setConn("connecting", "Connecting…");
    try {
      const body = await apiJSON("/models");
      showApp();
      // /models lists the models being pulled too ("state": "downloading"): the Downloads list
      // shows those, and the table, as the live snapshots draw it, only the models there are
      const rows = body && Array.isArray(body.data) ? body.data : [];
      renderModels(rows.filter((m) => !(m && m.state === "downloading")));
      if (body && Array.isArray(body.pulls)) renderPulls(body.pulls);
      setConn("connecting", "Connected, starting live updates…");
      startLive();
      startUsage();
      // captured requests: once the first snapshot says this key is an admin's (onSnapshot)
    } catch (err) {
      if (err instanceof AuthError) {
        needKey(hadKey);
      } else {
        setConn("offline", `Could not reach the gateway (${err.message}). Retrying…`);
        bootTimer = setTimeout(boot, BOOT_RETRY_MS);
      }
    } finally {
      booting = false;
    }
  }

  keyForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = keyInput.value.trim();
    if (!key) {
      showKeyError("Enter an API key.");
      keyInput.focus();
      return;
    }
    setKey(key);
    keySubmit.disabled = true;
    try {
      await boot();
    } finally {
      keySubmit.disabled = false;
    }
  });

  // ---- models table -------------------------------------------------------------------------

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
      const bar = el("progress", "load-progress");
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

  /** Disables a button; if it had focus, hands focus to the row's other button when that one is usable. */
  function setDisabled(button, disabled, fallback) {
    if (button.disabled === disabled) return;
    const hadFocus = document.activeElement === button;
    button.disabled = disabled;
    if (disabled && hadFocus && fallback && !fallback.disabled) fallback.focus();
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

  /** Keyed rows kept in `container` in the order of `items` ([key, item] pairs): each made once
   * by `create(key)`, redrawn by `update(row, item)`, moved only where out of place (a focused
   * button keeps its focus), removed when its key is gone (`removing(row)` first). */
  function placeRows(container, rows, items, create, update, node, removing) {
    const seen = new Set();
    let prev = null;
    for (const [key, item] of items) {
      seen.add(key);
      let row = rows.get(key);
      if (!row) {
        row = create(key);
        rows.set(key, row);
      }
      update(row, item);
      const el = node(row);
      const expected = prev ? prev.nextSibling : container.firstChild;
      if (expected !== el) container.insertBefore(el, expected);
      prev = el;
    }
    for (const [key, row] of rows) {
      if (!seen.has(key)) {
        if (removing) removing(row);
        node(row).remove();
        rows.delete(key);
      }
    }
    return seen;
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
    updateModelSelects();
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

  // ---- model pickers ------------------------------------------------------------------------

  const liveModel = $("live-model");
  const pgModel = $("pg-model");

  /** Replaces a select's options when the set of ids changed, keeping the current choice. */
  function syncSelect(select, ids, fixed, pickDefault) {
    const sig = JSON.stringify(ids);
    if (select.dataset.sig === sig) return;
    select.dataset.sig = sig;
    const current = select.value;
    const options = fixed.map(([value, label, disabled]) => {
      const o = el("option", "", label);
      o.value = value;
      if (disabled) o.disabled = true;
      return o;
    });
    for (const id of ids) {
      const o = el("option", "", id);
      o.value = id;
      options.push(o);
    }
    select.replaceChildren(...options);
    if (current && ids.includes(current)) select.value = current;
    else if (pickDefault) select.value = pickDefault();
    else select.value = fixed.length ? fixed[0][0] : "";
  }

  function chatModels() {
    return models.filter((m) => m.kind !== "embeddings" && m.kind !== "rerank" && m.state !== "downloading");
  }

  function updateModelSelects() {
    syncSelect(liveModel, models.map((m) => m.id), [["", "All models"]]);
    const chat = chatModels();
    const ids = chat.map((m) => m.id);
    syncSelect(pgModel, ids, ids.length ? [] : [["", "No chat models", true]], () => {
      const ready = chat.find((m) => m.state === "ready");
      return ready ? ready.id : ids[0] || "";
    });
    pgModel.disabled = !ids.length;
    fillReplayModels();
  }

  // ---- downloads ----------------------------------------------------------------------------

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
    const bar = el("progress", "file-progress");
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

  // ---- live stream --------------------------------------------------------------------------

  const live = { ctrl: null, timer: 0, snapshot: null };

  function stopLive() {
    clearTimeout(live.timer);
    live.timer = 0;
    if (live.ctrl) {
      const ctrl = live.ctrl;
      live.ctrl = null;
      ctrl.abort();
    }
  }

  function startLive() {
    stopLive();
    const ctrl = new AbortController();
    live.ctrl = ctrl;
    runLive(ctrl).catch(() => {
      /* runLive handles its own failures; this only keeps a stray rejection quiet */
    });
  }

  async function runLive(ctrl) {
    let unauthorised = false;
    let reason = "the stream ended";
    try {
      const resp = await checked(await fetch("/dashboard/live", {
        headers: authHeaders({ Accept: "text/event-stream" }),
        cache: "no-store",
        signal: ctrl.signal,
      }));
      if (!resp.body) {
        reason = await errorMessage(resp);
      } else {
        await readSSE(resp, (ev) => {
          if (live.ctrl !== ctrl) return true;
          if (ev.event !== "snapshot") return false;
          let snap;
          try {
            snap = JSON.parse(ev.data);
          } catch (_) {
            return false; // a damaged event: wait for the next one
          }
          onSnapshot(snap);
          return false;
        });
      }
    } catch (err) {
      if (ctrl.signal.aborted) return;
      if (err instanceof AuthError) unauthorised = true;
      else reason = err && err.message ? err.message : String(err);
    }
    if (ctrl.signal.aborted || live.ctrl !== ctrl) return;
    live.ctrl = null;
    if (unauthorised) {
      needKey(false);
      return;
    }
    setConn("paused", `Connection lost (${reason}): live updates paused, retrying…`);
    live.timer = setTimeout(startLive, LIVE_RETRY_MS);
  }

  function onSnapshot(snap) {
    if (!snap || typeof snap !== "object") return;
    live.snapshot = snap;
    if (connStatus.dataset.state !== "live") setConn("live", "Live");
    if (Array.isArray(snap.models)) renderModels(snap.models);
    renderCharts();
    renderRecent(Array.isArray(snap.recent) ? snap.recent : []);
    if (Array.isArray(snap.pulls)) renderPulls(snap.pulls);
    // /captures is an admin's alone: another key is told so here, without asking (and a 403)
    if (snap.admin === true) startCaptures();
    else if (snap.admin === false && !caps.refused) {
      caps.refused = true;
      caps.body = null;
      renderCaptures();
      showCapError("Captured requests are not available to this key: they are an admin key's to see.");
    }
  }

  // ---- charts -------------------------------------------------------------------------------

  const METRICS = {
    requests: {
      name: "Requests per second",
      value: (a, iv) => a.requests / iv,
      fmt: (v) => fmtNumber(v),
    },
    tokens: {
      name: "Tokens per second",
      value: (a, iv) => a.tokens / iv,
      fmt: (v) => fmtNumber(v, Math.abs(v) >= 100 ? 0 : 1),
    },
    ttft: {
      name: "Time to first token in milliseconds",
      value: (a) => (a.ttft_count > 0 ? (a.ttft_sum / a.ttft_count) * 1000 : null),
      fmt: (v) => fmtNumber(v, 0),
    },
    errors: {
      name: "Errors per interval",
      value: (a) => a.errors,
      fmt: (v) => fmtNumber(v, 0),
    },
  };

  const charts = [];
  for (const fig of document.querySelectorAll("#live .chart")) {
    const metric = fig.dataset.metric;
    if (!METRICS[metric]) continue;
    const svg = svgEl("svg", {
      viewBox: `0 0 ${CHART_W} ${CHART_H}`,
      preserveAspectRatio: "none",
      role: "img",
      class: "chart-svg",
      focusable: "false",
    });
    const foot = el("div", "chart-foot small muted");
    const left = el("span", "", "10 min ago");
    const peak = el("span", "chart-peak", "");
    const right = el("span", "", "now");
    foot.append(left, peak, right);
    fig.append(svg, foot);
    charts.push({ metric, fig, svg, value: fig.querySelector(".chart-value"), peak });
    svg.setAttribute("aria-label", `${METRICS[metric].name}, last 10 minutes, no data yet`);
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const exp = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * exp >= v) return m * exp;
    return 10 * exp;
  }

  function aggregate(point, model) {
    const sum = { requests: 0, errors: 0, tokens: 0, ttft_sum: 0, ttft_count: 0 };
    const byModel = point && point.models && typeof point.models === "object" ? point.models : {};
    for (const [id, s] of Object.entries(byModel)) {
      if (model && id !== model) continue;
      if (!s || typeof s !== "object") continue;
      for (const k of Object.keys(sum)) if (isNum(s[k])) sum[k] += s[k];
    }
    return sum;
  }

  function renderCharts() {
    const snap = live.snapshot;
    if (!snap) return;
    const series = snap.series && typeof snap.series === "object" ? snap.series : {};
    const iv = isNum(series.interval_s) && series.interval_s > 0 ? series.interval_s : 5;
    const points = (Array.isArray(series.points) ? series.points : []).filter((p) => p && isNum(p.t));
    const model = liveModel.value;
    const lastT = points.length ? points[points.length - 1].t : null;
    const now = isNum(snap.time) ? snap.time : Date.now() / 1000;
    const end = Math.max(now, lastT !== null ? lastT + iv : 0);
    const start = end - WINDOW_S;
    const aggs = points.map((p) => ({ t: p.t, a: aggregate(p, model) }));

    for (const chart of charts) {
      const spec = METRICS[chart.metric];
      const values = aggs.map(({ t, a }) => ({ t, v: spec.value(a, iv) }));
      let max = 0;
      let latest = null;
      for (const { v } of values) if (isNum(v) && v > max) max = v;
      for (let i = values.length - 1; i >= 0; i--) {
        if (isNum(values[i].v)) {
          latest = values[i].v;
          break;
        }
      }
      if (latest === null && chart.metric !== "ttft") latest = 0;
      const top = niceMax(max);
      const barW = Math.max((iv / WINDOW_S) * CHART_W, 1);
      const gap = barW > 2.5 ? 0.6 : 0;
      const nodes = [svgEl("line", { x1: 0, x2: CHART_W, y1: CHART_H - 0.5, y2: CHART_H - 0.5, class: "axis" })];
      for (const { t, v } of values) {
        if (!isNum(v) || v <= 0 || t + iv < start) continue;
        const x = ((t - start) / WINDOW_S) * CHART_W;
        const h = Math.max((v / top) * (CHART_H - 2), 1.5);
        nodes.push(svgEl("rect", {
          x: Math.max(0, x).toFixed(2),
          y: (CHART_H - h).toFixed(2),
          width: Math.max(barW - gap, 0.8).toFixed(2),
          height: h.toFixed(2),
          class: "bar",
        }));
      }
      chart.svg.replaceChildren(...nodes);
      const latestText = latest === null ? "–" : spec.fmt(latest);
      setText(chart.value, latestText);
      setText(chart.peak, max > 0 ? `peak ${spec.fmt(max)}` : "");
      const scope = model ? ` for ${model}` : "";
      const name = chart.metric === "errors" ? `Errors per ${iv} s interval` : spec.name;
      setAttr(chart.svg, "aria-label",
        `${name}${scope}, last 10 minutes, latest ${latest === null ? "no data" : latestText}` +
        (max > 0 ? `, peak ${spec.fmt(max)}` : ""));
      chart.fig.classList.toggle("has-errors", chart.metric === "errors" && latest > 0);
    }
  }

  liveModel.addEventListener("change", renderCharts);

  // ---- usage --------------------------------------------------------------------------------

  // GET /usage: tokens per key, model, wire and UTC day or hour; an admin's key sees every key's,
  // another key its own. Fetched when the panel opens, when its choices change and every 30 s,
  // not on the live snapshots. Every name in it (keys, models) is the server's: text, never markup.

  const USAGE_REFRESH_MS = 30000;
  const USAGE_COLOURS = 8; // series drawn in a colour of their own; more are summed as "others"
  const USAGE_H = 200;
  const USAGE_PAD = { left: 46, right: 22, top: 12, bottom: 24 };
  const USAGE_RANGES = {
    "24h": { group: "hour", count: 24, step: 3600, text: "last 24 hours" },
    "7d": { group: "day", count: 7, step: 86400, text: "last 7 days" },
    "30d": { group: "day", count: 30, step: 86400, text: "last 30 days" },
  };
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

  const usageRange = $("usage-range");
  const usageBy = $("usage-by");
  const usageWarning = $("usage-warning");
  const usageError = $("usage-error");
  const usageChart = $("usage-chart");
  const usagePlot = $("usage-plot");
  const usageLegend = $("usage-legend");
  const usageEmpty = $("usage-empty");
  const usageTableWrap = $("usage-table-wrap");
  const usageBody = $("usage-table").tBodies[0];
  const usageFoot = $("usage-table").tFoot;
  const usageBudgetsWrap = $("usage-budgets-wrap");
  const usageBudgets = $("usage-budgets").tBodies[0];
  const usageNote = $("usage-note");
  const usageRows = new Map(); // [key, model] -> table row
  const budgetRows = new Map(); // key -> budgets row
  const usageSvg = svgEl("svg", { role: "img", class: "usage-svg", focusable: "false" });
  usagePlot.append(usageSvg);

  // body: the last answer; view: the range it answers for; width: what the chart was drawn at
  const usage = { running: false, ctrl: null, timer: 0, seq: 0, body: null, view: null, width: 0, updated: null };

  /** "1.2k", "3.4M": the chart's tick, where a full number would not fit. */
  function fmtCompact(v) {
    if (!isNum(v)) return "–";
    const units = [[1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [n, unit] of units) {
      if (Math.abs(v) >= n) {
        const x = v / n;
        return `${x.toLocaleString("en-US", { maximumFractionDigits: x < 10 ? 2 : x < 100 ? 1 : 0 })}${unit}`;
      }
    }
    return fmtNumber(v, 0);
  }

  /** The name a row goes by in the server's answer: "2026-11-28" or "2026-11-28T06:00Z" (UTC). */
  function periodOf(t, group) {
    const d = new Date(t * 1000);
    const day = `${d.getUTCFullYear()}-${pad2(d.getUTCMonth() + 1)}-${pad2(d.getUTCDate())}`;
    return group === "day" ? day : `${day}T${pad2(d.getUTCHours())}:00Z`;
  }

  /** A period as a reader reads it: its date (UTC days), or its UTC hour. */
  function periodText(period, group) {
    return group === "day" ? period : period.replace("T", " ").replace(/Z$/, " UTC");
  }

  /** A period's axis label: "Nov 28" for a day (UTC), its local start time for an hour. */
  function periodLabel(period, group) {
    const t = Date.parse(period);
    if (!Number.isFinite(t)) return period;
    const d = new Date(t);
    if (group === "day") return `${MONTHS[d.getUTCMonth()]} ${d.getUTCDate()}`;
    return `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  }

  /** The hours or days the chosen range covers, ending with the current one (UTC). */
  function usageWindow(range, now) {
    const until = (Math.floor(now / range.step) + 1) * range.step;
    return { since: until - range.count * range.step, until };
  }

  const amount = (v) => (isNum(v) && v > 0 ? v : 0);

  /** The answer's rows that hold what the panel reads, their numbers made safe to add. */
  function usageData(body) {
    const rows = body && Array.isArray(body.data) ? body.data : [];
    const out = [];
    for (const r of rows) {
      if (!r || typeof r !== "object" || typeof r.period !== "string") continue;
      const prompt = amount(r.prompt_tokens);
      const completion = amount(r.completion_tokens);
      out.push({
        period: r.period,
        key: r.key === undefined || r.key === null ? "" : String(r.key),
        model: r.model === undefined || r.model === null ? "" : String(r.model),
        requests: amount(r.requests),
        prompt,
        completion,
        total: isNum(r.total_tokens) ? amount(r.total_tokens) : prompt + completion,
      });
    }
    return out;
  }

  function stopUsage() {
    usage.running = false;
    usage.seq++;
    clearTimeout(usage.timer);
    usage.timer = 0;
    if (usage.ctrl) usage.ctrl.abort();
    usage.ctrl = null;
    // what one key was shown is not left for the next to see
    usage.body = null;
    usage.view = null;
    usage.updated = null;
    showUsageError("");
    renderUsage();
  }

  function startUsage() {
    if (usage.running) return;
    usage.running = true;
    loadUsage();
  }

  function showUsageError(text) {
    setText(usageError, text || "");
    usageError.hidden = !text;
  }

  async function loadUsage() {
    const seq = ++usage.seq;
    clearTimeout(usage.timer);
    usage.timer = 0;
    if (usage.ctrl) usage.ctrl.abort();
    const ctrl = new AbortController();
    usage.ctrl = ctrl;
    const range = USAGE_RANGES[usageRange.value] || USAGE_RANGES["7d"];
    const win = usageWindow(range, Date.now() / 1000);
    const query = new URLSearchParams({ group: range.group, since: String(win.since), until: String(win.until) });
    usageChart.setAttribute("aria-busy", "true");
    let refused = false;
    try {
      const body = await apiJSON(`/usage?${query}`, { signal: ctrl.signal });
      if (seq !== usage.seq) return;
      usage.body = body && typeof body === "object" ? body : {};
      usage.view = { range, win };
      usage.updated = Date.now() / 1000;
      showUsageError("");
      renderUsage();
    } catch (err) {
      if (ctrl.signal.aborted || seq !== usage.seq) return;
      if (err instanceof HttpError && (err.status === 401 || err.status === 403)) {
        // this key may not read usage: the panel says so, the rest of the page goes on, and it
        // is asked again when a choice changes, not every 30 s
        refused = true;
        usage.body = null;
        usage.view = null;
        renderUsage();
        showUsageError(`Usage is not available to this key: ${err.message}`);
      } else {
        const message = (err && err.message ? err.message : String(err)).replace(/\.$/, "");
        showUsageError(`Could not load usage: ${message}.${usage.body ? " Showing the figures from before." : ""}`);
      }
    } finally {
      if (seq === usage.seq) {
        usage.ctrl = null;
        usageChart.removeAttribute("aria-busy");
        if (usage.running && !refused) usage.timer = setTimeout(loadUsage, USAGE_REFRESH_MS);
      }
    }
  }

  /** The series the chart stacks, biggest first, each with its colour class; past
   * USAGE_COLOURS the smallest are summed as one "others". of: a name's series. */
  function usageSeries(rows, by) {
    const totals = new Map();
    for (const r of rows) totals.set(r[by], (totals.get(r[by]) || 0) + r.total);
    const sorted = [...totals].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const own = sorted.length > USAGE_COLOURS ? sorted.slice(0, USAGE_COLOURS - 1) : sorted;
    const series = own.map(([name, total], i) => ({ name, label: name || "—", cls: `s-${i}`, total }));
    const of = new Map(own.map(([name], i) => [name, series[i]]));
    const rest = sorted.slice(own.length);
    if (rest.length) {
      const others = { name: null, label: `${rest.length} others`, cls: "s-other", total: 0 };
      for (const [name, total] of rest) {
        others.total += total;
        of.set(name, others);
      }
      series.push(others);
    }
    return { series, of };
  }

  function renderUsage() {
    const body = usage.body;
    const view = usage.view;
    const rows = usageData(body);
    const by = usageBy.value === "model" ? "model" : "key";

    const recording = body && body.recording === false;
    const reason = body && typeof body.reason === "string" && body.reason ? body.reason : "the usage database cannot be written";
    setText(usageWarning, recording
      ? `Usage is not being saved: ${reason}. It is kept in memory until the gateway restarts.` : "");
    usageWarning.hidden = !recording;

    const loaded = !!(body && view);
    const empty = loaded && !rows.length;
    usageEmpty.hidden = !empty;
    usageChart.hidden = !loaded || empty;
    usageTableWrap.hidden = !loaded || empty;
    if (!loaded) {
      usageSvg.replaceChildren();
      usageLegend.replaceChildren();
      usageLegend.hidden = true;
      placeRows(usageBody, usageRows, [], createUsageRow, updateUsageRow, (row) => row.tr);
      renderBudgets({});
      setText(usageNote, usage.running ? "Loading usage…" : "");
      return;
    }
    const { series, of } = usageSeries(rows, by);
    drawUsageChart(rows, series, of, by, view);
    renderLegend(series);
    renderUsageTable(rows);
    renderBudgets(body.limits);
    const per = view.range.group === "day" ? "day (UTC)" : "hour";
    setText(usageNote, `Tokens (prompt + completion) per ${per}, ${view.range.text}. ` +
      `Updated ${fmtClock(usage.updated)}; refreshed every ${USAGE_REFRESH_MS / 1000} s.`);
  }

  function drawUsageChart(rows, series, of, by, view) {
    const group = view.range.group;
    // every period of the range, the empty ones too, and any the server named outside it
    const periods = [];
    for (let t = view.win.since; t < view.win.until; t += view.range.step) periods.push(periodOf(t, group));
    const known = new Set(periods);
    for (const r of rows) {
      if (!known.has(r.period)) {
        known.add(r.period);
        periods.push(r.period);
      }
    }
    periods.sort();
    // period -> series -> tokens
    const cells = new Map(periods.map((p) => [p, new Map()]));
    for (const r of rows) {
      const s = of.get(r[by]);
      const cell = cells.get(r.period);
      cell.set(s, (cell.get(s) || 0) + r.total);
    }
    let max = 0;
    for (const cell of cells.values()) {
      let sum = 0;
      for (const v of cell.values()) sum += v;
      if (sum > max) max = sum;
    }
    const top = niceMax(max);

    const W = Math.max(280, Math.round(usagePlot.clientWidth || 640));
    usage.width = W;
    const H = USAGE_H;
    const pad = USAGE_PAD;
    const plotW = W - pad.left - pad.right;
    const plotH = H - pad.top - pad.bottom;
    const slot = plotW / periods.length;
    const barW = Math.max(slot * (slot > 8 ? 0.72 : 0.9), 1);
    const y = (v) => pad.top + plotH - (v / top) * plotH;
    const nodes = [];

    // the ticks: 0, the middle and the top
    for (const [v, cls] of [[0, "axis"], [top / 2, "grid"], [top, "grid"]]) {
      const yy = Math.round(y(v)) + 0.5;
      nodes.push(svgEl("line", { x1: pad.left, x2: W - pad.right, y1: yy, y2: yy, class: cls }));
    }
    const maxTick = svgEl("text", { x: pad.left - 6, y: y(top) + 4, class: "tick tick-max", "text-anchor": "end",
      "data-value": top });
    maxTick.textContent = fmtCompact(top);
    const midTick = svgEl("text", { x: pad.left - 6, y: y(top / 2) + 4, class: "tick", "text-anchor": "end" });
    midTick.textContent = fmtCompact(top / 2);
    const zeroTick = svgEl("text", { x: pad.left - 6, y: y(0) + 4, class: "tick", "text-anchor": "end" });
    zeroTick.textContent = "0";
    nodes.push(maxTick, midTick, zeroTick);

    // the bars: one stack a period, the biggest series at the bottom
    periods.forEach((period, i) => {
      const cell = cells.get(period);
      const x = pad.left + i * slot + (slot - barW) / 2;
      let base = 0;
      for (const s of series) {
        const v = cell.get(s) || 0;
        if (v <= 0) continue;
        const y0 = y(base);
        const y1 = y(base + v);
        base += v;
        const rect = svgEl("rect", {
          x: x.toFixed(2),
          y: y1.toFixed(2),
          width: barW.toFixed(2),
          height: Math.max(y0 - y1, 1).toFixed(2),
          class: `seg ${s.cls}`,
          "data-series": s.name === null ? "" : s.name,
          "data-period": period,
          "data-tokens": v,
        });
        const title = svgEl("title");
        title.textContent = `${s.label}\n${periodText(period, group)}\n${fmtNumber(v, 0)} tokens`;
        rect.append(title);
        nodes.push(rect);
      }
    });

    // the periods' labels, as many as fit, the newest always
    const every = Math.max(1, Math.ceil((group === "day" ? 48 : 42) / slot));
    periods.forEach((period, i) => {
      if ((periods.length - 1 - i) % every !== 0) return;
      const label = svgEl("text", { x: (pad.left + (i + 0.5) * slot).toFixed(2), y: H - 6, class: "tick period",
        "text-anchor": "middle" });
      label.textContent = periodLabel(period, group);
      nodes.push(label);
    });

    usageSvg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    usageSvg.setAttribute("width", String(W));
    usageSvg.setAttribute("height", String(H));
    usageSvg.replaceChildren(...nodes);
    const summary = series.slice(0, 5).map((s) => `${s.label} ${fmtNumber(s.total, 0)}`).join(", ");
    usageSvg.setAttribute("aria-label", `Total tokens per ${group} by ${by}, ${view.range.text}` +
      (summary ? `: ${summary}${series.length > 5 ? ", …" : ""}` : ""));
  }

  function renderLegend(series) {
    const items = series.map((s) => {
      const li = el("li", "legend-item");
      li.dataset.series = s.name === null ? "" : s.name;
      const swatch = el("span", `swatch ${s.cls}`);
      swatch.setAttribute("aria-hidden", "true");
      li.append(swatch, el("span", "legend-name", s.label), el("span", "legend-total muted small",
        `${fmtNumber(s.total, 0)} tokens`));
      return li;
    });
    usageLegend.replaceChildren(...items);
    usageLegend.hidden = !items.length;
  }

  function createUsageRow() {
    const tr = el("tr");
    const cells = {
      key: el("th", "u-key"),
      model: el("td", "u-model"),
      requests: el("td", "u-requests num"),
      prompt: el("td", "u-prompt num"),
      completion: el("td", "u-completion num"),
      total: el("td", "u-total num"),
    };
    cells.key.scope = "row";
    tr.append(cells.key, cells.model, cells.requests, cells.prompt, cells.completion, cells.total);
    return { tr, cells };
  }

  function updateUsageRow(row, sum) {
    setAttr(row.tr, "data-key", sum.key);
    setAttr(row.tr, "data-model", sum.model);
    setText(row.cells.key, sum.key || "—");
    setText(row.cells.model, sum.model || "—");
    setText(row.cells.requests, fmtNumber(sum.requests, 0));
    setText(row.cells.prompt, fmtNumber(sum.prompt, 0));
    setText(row.cells.completion, fmtNumber(sum.completion, 0));
    setText(row.cells.total, fmtNumber(sum.total, 0));
  }

  /** One row per key and model over the whole range, the biggest spender first. */
  function renderUsageTable(rows) {
    const sums = new Map();
    const all = { requests: 0, prompt: 0, completion: 0, total: 0 };
    for (const r of rows) {
      const id = JSON.stringify([r.key, r.model]);
      let sum = sums.get(id);
      if (!sum) sums.set(id, (sum = { key: r.key, model: r.model, requests: 0, prompt: 0, completion: 0, total: 0 }));
      for (const k of Object.keys(all)) {
        sum[k] += r[k];
        all[k] += r[k];
      }
    }
    const order = [...sums].sort(([, a], [, b]) => b.total - a.total
      || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0) || (a.model < b.model ? -1 : a.model > b.model ? 1 : 0));
    placeRows(usageBody, usageRows, order, createUsageRow, updateUsageRow, (row) => row.tr);
    for (const k of Object.keys(all)) setText(usageFoot.querySelector(`.u-${k}`), fmtNumber(all[k], 0));
  }

  function createBudgetRow() {
    const tr = el("tr");
    const key = el("th", "b-key");
    key.scope = "row";
    const spent = el("td", "b-spent");
    const spentText = el("span", "b-spent-text");
    const meter = el("meter", "b-meter");
    meter.min = 0;
    spent.append(spentText, meter);
    const budget = el("td", "b-budget num");
    const remaining = el("td", "b-remaining num");
    const resets = el("td", "b-resets");
    const time = el("time");
    resets.append(time);
    tr.append(key, spent, budget, remaining, resets);
    return { tr, key, spentText, meter, budget, remaining, time };
  }

  function updateBudgetRow(row, [name, st]) {
    const spent = amount(st.spent);
    const budget = st.budget;
    setAttr(row.tr, "data-key", name);
    setText(row.key, name || "—");
    setText(row.spentText, `${fmtNumber(spent, 0)} (${Math.min(999, Math.floor((100 * spent) / budget))}%)`);
    row.meter.max = budget;
    row.meter.low = budget * 0.75;
    row.meter.high = budget * 0.9;
    row.meter.optimum = 0;
    row.meter.value = Math.min(spent, budget);
    row.meter.setAttribute("aria-label", `${name}: ${fmtNumber(spent, 0)} of ${fmtNumber(budget, 0)} tokens spent`);
    const period = typeof st.budget_period === "string" && st.budget_period ? ` per ${st.budget_period}` : "";
    setText(row.budget, `${fmtNumber(budget, 0)}${period}`);
    setText(row.remaining, isNum(st.remaining) ? fmtNumber(st.remaining, 0) : "—");
    const when = typeof st.resets === "string" ? Date.parse(st.resets) : NaN;
    setAttr(row.time, "datetime", typeof st.resets === "string" ? st.resets : "");
    if (Number.isFinite(when)) {
      const d = new Date(when);
      const left = fmtEta((when - Date.now()) / 1000);
      setText(row.time, `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ` +
        `${pad2(d.getHours())}:${pad2(d.getMinutes())}${left ? ` (in ${left})` : ""}`);
      setAttr(row.time, "title", d.toString());
    } else {
      setText(row.time, "—");
      setAttr(row.time, "title", "");
    }
  }

  /** Each key with a budget: what it spent of it, and when that starts again. */
  function renderBudgets(limits) {
    const entries = limits && typeof limits === "object" && !Array.isArray(limits) ? Object.entries(limits) : [];
    const items = entries
      .filter(([, st]) => st && typeof st === "object" && isNum(st.budget) && st.budget > 0)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([name, st]) => [name, [name, st]]);
    const seen = placeRows(usageBudgets, budgetRows, items, createBudgetRow, updateBudgetRow, (row) => row.tr);
    usageBudgetsWrap.hidden = !seen.size;
  }

  usageRange.addEventListener("change", () => {
    if (usage.running) loadUsage();
  });

  usageBy.addEventListener("change", () => {
    renderUsage(); // the answer in hand, drawn the other way at once
    if (usage.running) loadUsage();
  });

  if (typeof ResizeObserver === "function") {
    let frame = 0;
    new ResizeObserver(() => {
      cancelAnimationFrame(frame);
      frame = requestAnimationFrame(() => {
        const w = Math.max(280, Math.round(usagePlot.clientWidth || 0));
        if (usage.body && usage.view && usagePlot.clientWidth && w !== usage.width) renderUsage();
      });
    }).observe(usagePlot);
  }

  // ---- recent requests ----------------------------------------------------------------------

  const recentBody = $("recent").tBodies[0];
  const recentEmpty = $("recent-empty");
  let recentSig = "";

  function renderRecent(list) {
    const events = list.filter((e) => e && typeof e === "object");
    const sig = JSON.stringify(events.map((e) => [e.request_id, e.time, e.status, e.completion_tokens]));
    if (sig === recentSig) return;
    if (recentSig) capturesChanged(); // new requests: the captured ones' list follows
    recentSig = sig;
    const rows = events.map((e) => {
      const tr = el("tr");
      if (e.request_id) tr.dataset.requestId = String(e.request_id);
      const time = el("td", "r-time num", fmtClock(e.time));
      if (isNum(e.time)) time.title = new Date(e.time * 1000).toLocaleString();
      const model = el("td", "r-model", e.model || "—");
      const endpoint = el("td", "r-endpoint", e.endpoint || "—");
      const principal = el("td", "r-principal", e.principal || "—");
      const p = isNum(e.prompt_tokens) ? e.prompt_tokens : null;
      const c = isNum(e.completion_tokens) ? e.completion_tokens : null;
      let counts = `${p === null ? "—" : p} / ${c === null ? "—" : c}`;
      // speculative decoding: the share of the proposed tokens the model kept
      if (isNum(e.drafted_tokens) && e.drafted_tokens > 0 && isNum(e.accepted_tokens)) {
        counts += ` · ${Math.round((100 * e.accepted_tokens) / e.drafted_tokens)}% of ${e.drafted_tokens} drafts kept`;
      }
      const tokens = el("td", "r-tokens num", counts);
      const extra = [];
      if (isNum(e.cached_tokens) && e.cached_tokens) extra.push(`${e.cached_tokens} cached`);
      if (isNum(e.reasoning_tokens) && e.reasoning_tokens) extra.push(`${e.reasoning_tokens} reasoning`);
      if (extra.length) tokens.title = extra.join(", ");
      const ttft = el("td", "r-ttft num",
        isNum(e.time_to_first_token_s) ? `${Math.round(e.time_to_first_token_s * 1000)} ms` : "—");
      const duration = el("td", "r-duration num", fmtDuration(e.duration_s));
      let finishText = e.finish_reason ? String(e.finish_reason) : "—";
      if (e.client_disconnected) finishText += " (client left)";
      const finish = el("td", "r-finish", finishText);
      const ok = isNum(e.status) ? e.status < 400 : true;
      const status = el("td", `r-status num ${ok ? "ok" : "bad"}`, e.status === undefined || e.status === null ? "—" : e.status);
      if (e.request_id) tr.title = `request ${e.request_id}`;
      tr.append(time, model, endpoint, principal, tokens, ttft, duration, finish, status);
      return tr;
    });
    recentBody.replaceChildren(...rows);
    recentEmpty.hidden = rows.length > 0;
  }

  // ---- captured requests --------------------------------------------------------------------

  // GET /captures (server.capture): the requests the gateway kept as received and their answers
  // as sent. The list is fetched when the page starts, when a filter changes, on Refresh and a
  // little after the live snapshots show new requests; one capture opened is GET /captures/{id}.
  // Everything in them is the client's or the model's text: set as textContent, never markup.

  const CAP_LIMIT = 100; // rows asked for; the server keeps the newest first
  const CAP_RELOAD_MS = 1500; // after new requests show in the live data, the list follows this much later
  const CAP_EVENT_ROWS = 200; // a stream's writes shown at once; "Show more" adds as many again
  const CAP_MAX_MESSAGES = 300; // a request's messages drawn; the raw body has them all
  const CAP_MAX_TEXT = 20000; // characters of one message, answer part or write drawn
  const CAP_MAX_RAW = 400000; // characters of a raw body drawn

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

  const caps = {
    running: false, ctrl: null, seq: 0, timer: 0, body: null, refused: false,
    seen: { model: new Set(), key: new Set(), route: new Set() }, // for the filters' suggestions
    open: null, openId: null, openCtrl: null, openSeq: 0, // the capture opened
    replayCtrl: null, shown: 0, // a replay running; the stream's writes drawn
  };

  const fmtMs = (s) => (isNum(s) ? `${fmtNumber(s * 1000, 0)} ms` : "—");

  function fmtRate(v) {
    return isNum(v) ? `${fmtNumber(v, v >= 100 ? 0 : 1)} tok/s` : "—";
  }

  /** A text cut to `max` characters, said so at its end. */
  function capped(text, max) {
    const s = String(text);
    return s.length > max ? `${s.slice(0, max)}\n… ${fmtNumber(s.length - max, 0)} more characters (see Raw)` : s;
  }

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

  /** Why a capture cannot be sent again (as the server would say, before asking it), or "". */
  function notReplayable(d) {
    if (d.redacted) return "Kept without its text (server.capture.redact_content): it cannot be sent again.";
    const req = d.request || {};
    if (req.truncated) return "Its request was cut at server.capture.max_body_bytes: it cannot be sent again.";
    if (!req.body || typeof req.body !== "object" || Array.isArray(req.body)) {
      return "Its request has no JSON body to send again.";
    }
    return "";
  }

  /** The text of a message's content as the wires give it: a string, or parts (text, images, calls, results). */
  function contentText(content) {
    if (content === undefined || content === null) return "";
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map(partText).filter((t) => t !== "").join("\n");
    return partText(content);
  }

  function partText(p) {
    if (p === undefined || p === null) return "";
    if (typeof p === "string") return p;
    if (typeof p !== "object") return String(p);
    const type = typeof p.type === "string" ? p.type : "";
    if (typeof p.text === "string" && (!type || /text$/.test(type))) return p.text;
    if (/image/.test(type)) return "[image]";
    if (/audio/.test(type)) return "[audio]";
    if (/file|document/.test(type)) return "[file]";
    if (type === "tool_use" || type === "server_tool_use") return `[call ${p.name || "?"} ${jsonText(p.input)}]`;
    if (type === "tool_result") return `[result${p.tool_use_id ? ` of ${p.tool_use_id}` : ""}] ${contentText(p.content)}`;
    if (type === "thinking") return `[thinking] ${p.thinking || ""}`;
    if (type === "redacted_thinking") return "[thinking, redacted]";
    if (typeof p.text === "string") return p.text;
    return jsonText(p);
  }

  function jsonText(v) {
    if (typeof v === "string") return v;
    try {
      return JSON.stringify(v);
    } catch (_) {
      return String(v);
    }
  }

  /** Arguments as the model gave them, indented where they are JSON. */
  function prettyArgs(args) {
    const text = typeof args === "string" ? args : jsonText(args);
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (_) {
      return text;
    }
  }

  function callBox(name, args, id) {
    const box = el("div", "tool-call");
    const head = el("div", "tool-head");
    head.append(el("span", "tool-label muted", "Tool call "), el("code", "tool-name", name || "?"));
    if (id) head.append(el("span", "tool-id muted small", ` ${id}`));
    box.append(head, el("pre", "tool-args", capped(prettyArgs(args === undefined || args === null ? "" : args), CAP_MAX_TEXT)));
    return box;
  }

  /** The calls an assistant turn of a request carries: OpenAI's and Ollama's tool_calls. */
  function turnCalls(m) {
    const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
    return calls.filter((c) => c && typeof c === "object").map((c) => {
      const fn = c.function && typeof c.function === "object" ? c.function : c;
      return callBox(fn.name, fn.arguments, c.id);
    });
  }

  function messageView(role, text, extra) {
    const msg = el("div", `cap-msg role-${String(role || "message").replace(/[^a-z_-]/gi, "")}`);
    msg.append(el("div", "cap-role", role || "message"));
    if (text) msg.append(el("div", "cap-text", capped(text, CAP_MAX_TEXT)));
    for (const node of extra || []) msg.append(node);
    if (!text && !(extra && extra.length)) msg.append(el("div", "cap-text muted", "(empty)"));
    return msg;
  }

  /** The turns a request's body holds, in the shape its wire gives them. */
  function requestTurns(body) {
    const turns = [];
    const system = body.system !== undefined ? body.system : body.instructions;
    if (system !== undefined && system !== null && system !== "") {
      turns.push(messageView(body.system !== undefined ? "system" : "instructions", contentText(system)));
    }
    const list = Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) ? body.input : null;
    if (list) {
      for (const m of list.slice(0, CAP_MAX_MESSAGES)) {
        if (m === null || typeof m !== "object") {
          turns.push(messageView("input", contentText(m)));
          continue;
        }
        const type = typeof m.type === "string" ? m.type : "";
        if (type === "function_call" || type === "custom_tool_call") {
          turns.push(messageView("call", "", [callBox(m.name, m.arguments !== undefined ? m.arguments : m.input, m.call_id)]));
        } else if (type === "function_call_output" || type === "custom_tool_call_output") {
          turns.push(messageView("tool", `${m.call_id ? `[${m.call_id}] ` : ""}${contentText(m.output)}`));
        } else if (type === "reasoning") {
          turns.push(messageView("reasoning", contentText(m.summary || m.content)));
        } else if (m.role !== undefined || m.content !== undefined) {
          let text = contentText(m.content);
          if (m.tool_call_id) text = `[${m.tool_call_id}] ${text}`;
          const extra = turnCalls(m);
          const thinking = typeof m.reasoning_content === "string" ? m.reasoning_content
            : typeof m.thinking === "string" ? m.thinking : "";
          if (thinking) extra.unshift(el("div", "cap-text cap-thinking-text muted", capped(thinking, CAP_MAX_TEXT)));
          if (Array.isArray(m.images) && m.images.length) extra.push(el("div", "muted small", `${m.images.length} image(s)`));
          turns.push(messageView(String(m.role || type || "message"), text, extra));
        } else {
          turns.push(messageView(type || "item", jsonText(m)));
        }
      }
      if (list.length > CAP_MAX_MESSAGES) {
        turns.push(el("p", "muted small", `… ${list.length - CAP_MAX_MESSAGES} more (see Raw)`));
      }
    } else if (typeof body.input === "string") {
      turns.push(messageView("input", body.input));
    }
    if (body.prompt !== undefined && body.prompt !== null) {
      turns.push(messageView("prompt", Array.isArray(body.prompt) ? body.prompt.map(contentText).join("\n") : contentText(body.prompt)));
    }
    if (typeof body.suffix === "string" && body.suffix) turns.push(messageView("suffix", body.suffix));
    return turns;
  }

  const SHOWN_FIELDS = new Set(["messages", "input", "prompt", "system", "instructions", "tools", "suffix", "model"]);

  function requestView(req) {
    const out = [];
    const body = req.body;
    if (body && typeof body === "object" && !Array.isArray(body)) {
      const turns = requestTurns(body);
      const box = el("div", "cap-msgs");
      box.setAttribute("role", "list");
      box.setAttribute("aria-label", "Messages");
      for (const t of turns) t.setAttribute("role", "listitem");
      if (turns.length) box.append(...turns);
      else box.append(el("p", "muted", "No messages, input or prompt in this request."));
      out.push(box);
      const tools = Array.isArray(body.tools) ? body.tools.filter((t) => t && typeof t === "object") : [];
      if (tools.length) {
        const line = el("div", "cap-tools");
        line.append(el("span", "cap-label", `Tools (${tools.length})`));
        for (const t of tools) {
          const fn = t.function && typeof t.function === "object" ? t.function : t;
          const name = typeof fn.name === "string" && fn.name ? fn.name : typeof t.type === "string" ? t.type : "?";
          const chip = el("code", "cap-chip", name);
          if (typeof fn.description === "string" && fn.description) chip.title = fn.description;
          line.append(document.createTextNode(" "), chip);
        }
        out.push(line);
      }
      const params = Object.entries(body).filter(([k]) => !SHOWN_FIELDS.has(k));
      if (params.length) {
        const p = el("p", "cap-params small");
        p.append(el("span", "cap-label", "Parameters "));
        params.forEach(([k, v], i) => {
          if (i) p.append(document.createTextNode(" · "));
          const text = jsonText(v);
          p.append(el("span", "muted", `${k} `), el("code", "", text.length > 200 ? `${text.slice(0, 200)}…` : text));
        });
        out.push(p);
      }
    } else if (typeof req.body_text === "string") {
      out.push(el("p", "muted small", req.truncated
        ? `The body was cut at the capture's bound: ${fmtBytes(req.body_text.length)} kept of ${fmtBytes(req.bytes)}.`
        : "The body is not JSON; it is shown as it came."));
      out.push(el("pre", "cap-pre", capped(req.body_text, CAP_MAX_TEXT)));
    } else {
      out.push(el("p", "muted", "No body."));
    }
    return out;
  }

  /** An answer read back (thinking, content, calls, error), as the client received it. */
  function answerView(answer, response, opts) {
    const box = el("div", "cap-answer");
    const a = answer && typeof answer === "object" ? answer : null;
    if (!a) {
      box.append(el("p", "muted", "No answer could be read back."));
      return box;
    }
    if (a.error) {
      const err = el("p", "cap-answer-error", String(a.error));
      if (opts && opts.alert) err.setAttribute("role", "alert");
      box.append(err);
    }
    if (typeof a.thinking === "string" && a.thinking) {
      const details = el("details", "thinking");
      details.open = true;
      details.append(el("summary", "", "Thinking"), el("div", "thinking-text", capped(a.thinking, CAP_MAX_TEXT)));
      box.append(details);
    }
    if (typeof a.content === "string" && a.content) box.append(el("div", "cap-content", capped(a.content, CAP_MAX_TEXT)));
    const calls = Array.isArray(a.calls) ? a.calls.filter((c) => c && typeof c === "object") : [];
    if (calls.length) {
      const list = el("div", "tool-calls");
      for (const c of calls) list.append(callBox(c.name, c.arguments, c.id));
      box.append(list);
    }
    if (!a.error && !a.thinking && !a.content && !calls.length) {
      const status = response && isNum(response.status) ? response.status : null;
      box.append(el("p", "muted", status !== null && status >= 400 ? `No answer: status ${status}.` : "No text or calls."));
    }
    const foot = [];
    if (a.finish_reason) foot.push(`finish: ${a.finish_reason}`);
    if (isNum(a.choices) && a.choices > 1) foot.push(`${a.choices} choices (the first shown)`);
    if (foot.length) box.append(el("p", "cap-finish muted small", foot.join(" · ")));
    return box;
  }

  function statItem(label, value, title, sub) {
    const div = el("div", "cap-stat");
    const dd = el("dd", "", value);
    if (sub) dd.append(el("span", "cap-stat-sub", sub));
    if (title) dd.title = title;
    div.append(el("dt", "", label), dd);
    return div;
  }

  /** A capture's times and counts, as dt/dd pairs; brief: the four a comparison reads. */
  function statItems(d, brief) {
    const prompt = isNum(d.prompt_tokens) ? fmtNumber(d.prompt_tokens, 0) : "—";
    const completion = isNum(d.completion_tokens) ? fmtNumber(d.completion_tokens, 0) : "—";
    if (brief) {
      return [
        statItem("TTFT", fmtMs(d.time_to_first_token_s)),
        statItem("Duration", fmtDuration(d.duration_s)),
        statItem("Tokens/s", fmtRate(d.tokens_per_s)),
        statItem("Completion tokens", completion),
      ];
    }
    const cached = isNum(d.cached_tokens) && d.cached_tokens ? `${fmtNumber(d.cached_tokens, 0)} cached` : "";
    const reasoning = isNum(d.reasoning_tokens) && d.reasoning_tokens
      ? `${fmtNumber(d.reasoning_tokens, 0)} reasoning` : "";
    return [
      statItem("Queue", fmtMs(d.queue_s), "waiting for the model and a slot"),
      statItem("Load", fmtMs(d.load_s), "the model's load this request waited for"),
      statItem("TTFT", fmtMs(d.time_to_first_token_s), "time to the first token"),
      statItem("Duration", fmtDuration(d.duration_s)),
      statItem("Tokens/s", fmtRate(d.tokens_per_s), "after the first token"),
      statItem("Prompt tokens", prompt, "", cached),
      statItem("Completion tokens", completion, "", reasoning),
      statItem("Finish", d.finish_reason ? String(d.finish_reason) : "—"),
      statItem("Received", fmtBytes(d.request_bytes), "the request's body"),
      statItem("Sent", fmtBytes(d.response_bytes), "the answer's body"),
    ];
  }

  function fmtAt(t) {
    return isNum(t) ? `${fmtNumber(t * 1000, t < 10 ? 1 : 0)} ms` : "—";
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

  function rawBlock(title, text, note) {
    const box = el("div", "cap-raw-part");
    box.append(el("h5", "cap-raw-title", title));
    if (note) box.append(el("p", "muted small", note));
    const pre = el("pre", "cap-pre", capped(text, CAP_MAX_RAW));
    pre.tabIndex = 0;
    pre.setAttribute("aria-label", title);
    box.append(pre);
    return box;
  }

  function headerText(headers) {
    return headers && typeof headers === "object"
      ? Object.entries(headers).map(([k, v]) => `${k}: ${v}`).join("\n") : "";
  }

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

  // ---- playground ---------------------------------------------------------------------------

  const pgForm = $("pg-form");
  const pgSystem = $("pg-system");
  const pgTemperature = $("pg-temperature");
  const pgTopP = $("pg-top-p");
  const pgMaxTokens = $("pg-max-tokens");
  const pgTools = $("pg-tools");
  const pgInput = $("pg-input");
  const pgSend = $("pg-send");
  const pgStop = $("pg-stop");
  const pgClear = $("pg-clear");
  const pgStatus = $("pg-status");
  const transcript = $("pg-transcript");
  const transcriptEmpty = transcript.querySelector(".transcript-empty");

  const chat = { conversation: [], ctrl: null, streaming: false, generation: 0 };

  function setPgStatus(text) {
    setText(pgStatus, text || "");
  }

  function setStreaming(on) {
    chat.streaming = on;
    // A disabled button drops focus: hand it to the control that now does something.
    if (on) {
      setDisabled(pgStop, false);
      setDisabled(pgSend, true, pgStop);
    } else {
      setDisabled(pgSend, false);
      setDisabled(pgStop, true, pgInput);
    }
    transcript.setAttribute("aria-busy", on ? "true" : "false");
  }

  function abortChat() {
    if (chat.ctrl) chat.ctrl.abort();
  }

  function nearBottom() {
    return transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 48;
  }

  function keepScrolled(wasNear) {
    if (wasNear) transcript.scrollTop = transcript.scrollHeight;
  }

  function appendTurn(node) {
    transcriptEmpty.hidden = true;
    transcript.append(node);
    transcript.scrollTop = transcript.scrollHeight;
  }

  function userView(text) {
    const msg = el("article", "msg user");
    msg.append(el("h3", "msg-role", "You"), el("div", "content", text));
    return msg;
  }

  /** The DOM of one assistant turn, filled in as the stream arrives. */
  function assistantView(model) {
    const msg = el("article", "msg assistant");
    const role = el("h3", "msg-role", "Assistant");
    role.append(el("span", "msg-model muted", model));
    const content = el("div", "content");
    const contentText = document.createTextNode("");
    content.append(contentText);
    const stats = el("p", "stats muted", "waiting…");
    msg.append(role, content, stats);
    let thinkingText = null;
    let toolBox = null;
    const toolViews = [];

    return {
      msg,
      addThinking(text) {
        const near = nearBottom();
        if (!thinkingText) {
          const details = el("details", "thinking");
          details.append(el("summary", "", "Thinking"));
          const body = el("div", "thinking-text");
          thinkingText = document.createTextNode("");
          body.append(thinkingText);
          details.append(body);
          msg.insertBefore(details, content);
        }
        thinkingText.appendData(text);
        keepScrolled(near);
      },
      addContent(text) {
        const near = nearBottom();
        contentText.appendData(text);
        keepScrolled(near);
      },
      showCalls(calls) {
        const near = nearBottom();
        if (!toolBox) {
          toolBox = el("div", "tool-calls");
          msg.insertBefore(toolBox, stats);
        }
        calls.forEach((call, i) => {
          if (!call) return;
          let v = toolViews[i];
          if (!v) {
            const box = el("div", "tool-call");
            const head = el("div", "tool-head");
            head.append(el("span", "tool-label muted", "Tool call "), el("code", "tool-name", ""));
            const args = el("pre", "tool-args", "");
            box.append(head, args);
            toolBox.append(box);
            v = toolViews[i] = { name: head.querySelector(".tool-name"), args };
          }
          setText(v.name, call.function.name || "…");
          setText(v.args, call.function.arguments);
        });
        keepScrolled(near);
      },
      prettyCalls(calls) {
        calls.forEach((call, i) => {
          const v = toolViews[i];
          if (!v || !call) return;
          try {
            setText(v.args, JSON.stringify(JSON.parse(call.function.arguments), null, 2));
          } catch (_) {
            /* leave the arguments as they came */
          }
        });
      },
      setStats(text) {
        setText(stats, text);
        stats.hidden = !text;
      },
      stopped() {
        msg.classList.add("stopped");
        setText(stats, "stopped");
        stats.hidden = false;
      },
      error(text) {
        const err = el("p", "error", text);
        err.setAttribute("role", "alert");
        msg.insertBefore(err, stats);
        msg.classList.add("failed");
      },
      text() {
        return contentText.data;
      },
    };
  }

  function numberField(input, label, integer) {
    const raw = input.value.trim();
    if (raw === "") {
      if (input.validity && input.validity.badInput) return { error: `${label} must be a number.` };
      return { value: undefined };
    }
    const n = Number(raw);
    if (!Number.isFinite(n)) return { error: `${label} must be a number.` };
    if (integer && (!Number.isInteger(n) || n < 1)) return { error: `${label} must be a whole number of 1 or more.` };
    return { value: n };
  }

  function parseTools() {
    const raw = pgTools.value.trim();
    pgTools.removeAttribute("aria-invalid");
    if (!raw) return { value: undefined };
    let tools;
    try {
      tools = JSON.parse(raw);
    } catch (err) {
      pgTools.setAttribute("aria-invalid", "true");
      return { error: `Tools are not valid JSON: ${err.message}` };
    }
    if (!Array.isArray(tools)) {
      pgTools.setAttribute("aria-invalid", "true");
      return { error: "Tools must be a JSON array of tool definitions." };
    }
    return { value: tools.length ? tools : undefined };
  }

  async function sendChat() {
    if (chat.streaming) return;
    const model = pgModel.value;
    if (!model) {
      setPgStatus("Pick a model first.");
      pgModel.focus();
      return;
    }
    const text = pgInput.value;
    if (!text.trim()) {
      setPgStatus("Type a message first.");
      pgInput.focus();
      return;
    }
    const fields = [
      ["temperature", numberField(pgTemperature, "Temperature", false), pgTemperature],
      ["top_p", numberField(pgTopP, "Top p", false), pgTopP],
      ["max_tokens", numberField(pgMaxTokens, "Max tokens", true), pgMaxTokens],
      ["tools", parseTools(), pgTools],
    ];
    for (const [, result, input] of fields) {
      if (result.error) {
        setPgStatus(result.error);
        input.focus();
        return;
      }
    }
    setPgStatus("");

    const body = { model, messages: [], stream: true, stream_options: { include_usage: true } };
    for (const [name, result] of fields) if (result.value !== undefined) body[name] = result.value;

    const userTurn = { role: "user", content: text };
    chat.conversation.push(userTurn);
    const system = pgSystem.value;
    body.messages = (system.trim() ? [{ role: "system", content: system }] : []).concat(chat.conversation);

    pgInput.value = "";
    appendTurn(userView(text));
    const view = assistantView(model);
    appendTurn(view.msg);

    const generation = chat.generation;
    const ctrl = new AbortController();
    chat.ctrl = ctrl;
    setStreaming(true);

    const t0 = performance.now();
    let tFirst = null;
    let usage = null;
    let finish = null;
    let failure = null;
    let unauthorised = false;
    const calls = [];

    const first = () => {
      if (tFirst === null) {
        tFirst = performance.now();
        view.setStats("generating…");
      }
    };

    const onChunk = (obj) => {
      if (!obj || typeof obj !== "object") return false;
      if (obj.error) {
        failure = obj.error.message || (typeof obj.error === "string" ? obj.error : "The model reported an error.");
        return true;
      }
      if (obj.usage && typeof obj.usage === "object") usage = obj.usage;
      const choice = Array.isArray(obj.choices) ? obj.choices[0] : null;
      if (!choice) return false;
      const delta = choice.delta || choice.message || {};
      const thinking = delta.reasoning_content !== undefined && delta.reasoning_content !== null
        ? delta.reasoning_content : delta.reasoning;
      if (typeof thinking === "string" && thinking) {
        first();
        view.addThinking(thinking);
      }
      if (typeof delta.content === "string" && delta.content) {
        first();
        view.addContent(delta.content);
      }
      if (Array.isArray(delta.tool_calls) && delta.tool_calls.length) {
        first();
        delta.tool_calls.forEach((tc, i) => {
          if (!tc || typeof tc !== "object") return;
          const idx = isNum(tc.index) ? tc.index : i;
          const slot = calls[idx] || (calls[idx] = { id: "", type: "function", function: { name: "", arguments: "" } });
          if (tc.id) slot.id = String(tc.id);
          if (tc.type) slot.type = String(tc.type);
          const fn = tc.function || {};
          if (typeof fn.name === "string") slot.function.name += fn.name;
          if (typeof fn.arguments === "string") slot.function.arguments += fn.arguments;
          else if (fn.arguments && typeof fn.arguments === "object") slot.function.arguments += JSON.stringify(fn.arguments);
        });
        view.showCalls(calls);
      }
      if (choice.finish_reason) finish = String(choice.finish_reason);
      return false;
    };

    try {
      const resp = await checked(await fetch("/v1/chat/completions", {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify(body),
        cache: "no-store",
        signal: ctrl.signal,
      }));
      if (!(resp.headers.get("Content-Type") || "").includes("text/event-stream")) {
        onChunk(await resp.json()); // a server that answered without streaming
      } else {
        await readSSE(resp, (ev) => {
          const data = ev.data.trim();
          if (data === "[DONE]") return true;
          let obj;
          try {
            obj = JSON.parse(data);
          } catch (_) {
            return false;
          }
          return onChunk(obj);
        }, (comment) => {
          if (tFirst === null && /^loading\b/i.test(comment)) view.setStats(comment);
        });
      }
    } catch (err) {
      if (err instanceof HttpError) {
        failure = err.message; // the server's own words
        unauthorised = err instanceof AuthError;
      } else if (!ctrl.signal.aborted) {
        failure = err && err.message ? `Request failed: ${err.message}` : "Request failed.";
      }
    }
    const tEnd = performance.now();
    if (chat.ctrl === ctrl) chat.ctrl = null;
    const current = generation === chat.generation; // false once the conversation was cleared
    const answer = view.text();
    const made = calls.filter(Boolean);
    const madeCalls = made.map((c, i) => ({
      id: c.id || `call_${i}`,
      type: c.type, // "function" from the start, replaced only by what the server said
      function: { name: c.function.name, arguments: c.function.arguments },
    }));
    if (madeCalls.length) view.prettyCalls(made);

    if (ctrl.signal.aborted && !failure) {
      view.stopped();
      if (current) chat.conversation.push(assistantTurn(answer, madeCalls));
    } else if (failure) {
      view.error(failure);
      view.setStats("");
      // The failed turn is not part of the conversation any more, so the next message retries cleanly.
      if (current) {
        const i = chat.conversation.lastIndexOf(userTurn);
        if (i >= 0) chat.conversation.splice(i, 1);
      }
    } else {
      const parts = [];
      const pt = usage && isNum(usage.prompt_tokens) ? usage.prompt_tokens : null;
      const ct = usage && isNum(usage.completion_tokens) ? usage.completion_tokens : null;
      if (pt !== null || ct !== null) parts.push(`${pt === null ? "?" : pt} prompt + ${ct === null ? "?" : ct} completion tokens`);
      if (ct !== null && tFirst !== null && tEnd - tFirst > 0) parts.push(`${(ct / ((tEnd - tFirst) / 1000)).toFixed(1)} tok/s`);
      if (tFirst !== null) parts.push(`TTFT ${Math.round(tFirst - t0)} ms`);
      else parts.push(`no output after ${fmtDuration((tEnd - t0) / 1000)}`);
      if (finish && finish !== "stop") parts.push(`finish: ${finish}`);
      view.setStats(parts.join(" · "));
      if (current) chat.conversation.push(assistantTurn(answer, madeCalls));
    }
    if (chat.ctrl === null) setStreaming(false);
    if (unauthorised) needKey(false);
  }

  function assistantTurn(text, calls) {
    const turn = { role: "assistant", content: text };
    if (calls.length) {
      turn.tool_calls = calls;
      if (!text) turn.content = null;
    }
    return turn;
  }

  pgForm.addEventListener("submit", (event) => {
    event.preventDefault();
    sendChat().catch((err) => {
      setStreaming(false);
      setPgStatus(`Something went wrong: ${err && err.message ? err.message : err}`);
    });
  });

  pgForm.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && event.target instanceof HTMLTextAreaElement) {
      event.preventDefault();
      if (!chat.streaming) pgForm.requestSubmit(pgSend);
    }
  });

  pgStop.addEventListener("click", () => abortChat());

  pgClear.addEventListener("click", () => {
    chat.generation++;
    abortChat();
    chat.conversation = [];
    for (const node of Array.from(transcript.children)) if (node !== transcriptEmpty) node.remove();
    transcriptEmpty.hidden = false;
    setPgStatus("");
    pgInput.focus();
  });

  pgTools.addEventListener("input", () => pgTools.removeAttribute("aria-invalid"));

  // ---- start --------------------------------------------------------------------------------

  window.addEventListener("pagehide", () => {
    stopLive();
    stopUsage();
    stopCaptures();
    abortChat();
    abortPulls();
  });

  boot();
})();
