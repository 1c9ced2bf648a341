/* The Live card: requests, tokens per second, time to first token and errors over the last ten
 * minutes, as bars in inline SVG, for all models or the one picked; drawn from each live snapshot. */

import { $, el, setAttr, setText, svgEl, syncSelect } from "../lib/dom.js";
import { fmtNumber, isNum, niceMax } from "../lib/format.js";
import { card } from "../lib/panels.js";

const WINDOW_S = 600; // the charts show the last ten minutes
const CHART_W = 240;
const CHART_H = 60;

const liveModel = $("live-model");
let last = null; // the latest snapshot, drawn again when the model picked changes

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
  const snap = last;
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

card({
  snapshot(snap) {
    last = snap;
    renderCharts();
  },
  models(list) {
    syncSelect(liveModel, list.map((m) => m.id), [["", "All models"]]);
  },
});
