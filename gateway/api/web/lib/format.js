/* Numbers, sizes, times and names as the page writes them. */

export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

export function fmtBytes(n) {
  if (!isNum(n) || n < 0) return "—";
  if (n < 1024) return `${n} B`;
  if (n < 1024 ** 2) return `${(n / 1024).toFixed(0)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(n < 10 * 1024 ** 2 ? 1 : 0)} MiB`;
  return `${(n / 1024 ** 3).toFixed(n < 100 * 1024 ** 3 ? 1 : 0)} GiB`;
}

export function fmtNumber(v, digits) {
  if (!isNum(v)) return "–";
  if (digits === 0) return Math.round(v).toLocaleString("en-US");
  const d = digits === undefined ? (Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) : digits;
  return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
}

export function fmtDuration(s) {
  if (!isNum(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - m * 60)} s`;
}

/** A time left, rounded to what a reader needs: "8 s", "2 min 5 s", "1 h 12 min". */
export function fmtEta(s) {
  if (!isNum(s) || s < 0) return "";
  const t = Math.max(1, Math.round(s));
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min ${t % 60} s`;
  return `${Math.floor(t / 3600)} h ${Math.floor((t % 3600) / 60)} min`;
}

export function pad2(n) {
  return String(n).padStart(2, "0");
}

export function fmtClock(epoch) {
  if (!isNum(epoch)) return "—";
  const d = new Date(epoch * 1000);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

export function basename(path) {
  if (typeof path !== "string" || !path) return "";
  const parts = path.split(/[\\/]/).filter(Boolean);
  return parts.length ? parts[parts.length - 1] : path;
}

export function hostOf(url) {
  try {
    return new URL(url).host;
  } catch (_) {
    return String(url || "");
  }
}

export function niceMax(v) {
  if (!(v > 0)) return 1;
  const exp = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * exp >= v) return m * exp;
  return 10 * exp;
}
