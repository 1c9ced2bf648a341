/* The Recent requests card: the last requests the gateway answered (the key's own, or every
 * key's for an admin), from each live snapshot: model, endpoint, caller, tokens, times, status. */

import { $, el } from "../lib/dom.js";
import { fmtClock, fmtDuration, isNum } from "../lib/format.js";
import { card, each } from "../lib/panels.js";

const recentBody = $("recent").tBodies[0];
const recentEmpty = $("recent-empty");
let recentSig = "";

function renderRecent(list) {
  const events = list.filter((e) => e && typeof e === "object");
  const sig = JSON.stringify(events.map((e) => [e.request_id, e.time, e.status, e.completion_tokens]));
  if (sig === recentSig) return;
  if (recentSig) each("newRequests"); // new requests: the captured ones' list follows
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

card({
  snapshot(snap) {
    renderRecent(Array.isArray(snap.recent) ? snap.recent : []);
  },
});
