/* The Usage card. GET /usage: tokens per key, model, wire and UTC day or hour; an admin's key
 * sees every key's, another key its own. Fetched when the panel opens, when its choices change and
 * every 30 s, not on the live snapshots. Every name in it (keys, models) is the server's: text,
 * never markup. A stacked bar chart of the tokens per period (inline SVG), a table per key and
 * model, and each budget's standing. */

import { HttpError, apiJSON } from "../lib/api.js";
import { $, el, placeRows, setAttr, setText, svgEl } from "../lib/dom.js";
import { fmtClock, fmtEta, fmtNumber, isNum, niceMax, pad2 } from "../lib/format.js";
import { card } from "../lib/panels.js";

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

card({ start: startUsage, stop: stopUsage });
