/* The Queues card: each model with requests running or waiting, from each live snapshot
 * (snap.queues, as GET /admin/queues has them): its slots and how many run, how many wait, whether
 * it is closed (being swapped out: nothing new starts until it is unloaded), and who waits, by key
 * and priority, with how many and the longest wait. To a user key the gateway sends its own key's
 * rows and every other key's folded into one ("other keys"). Every name is the server's: text,
 * never markup. */

import { $, el } from "../lib/dom.js";
import { fmtDuration, isNum } from "../lib/format.js";
import { card } from "../lib/panels.js";

const wrap = $("queues-wrap");
const table = $("queues");
const empty = $("queues-empty");
let sig = "";

const count = (v) => (isNum(v) ? v : 0);

/** One model's rows, a tbody of them: the first row holds the model's cells (spanning its rows),
 * and each row one key and priority's waiting requests. */
function modelRows(q) {
  const body = el("tbody", "q-group");
  body.dataset.model = String(q.model);
  const waits = Array.isArray(q.queue) ? q.queue.filter((w) => w && typeof w === "object") : [];
  const span = String(Math.max(1, waits.length));
  const name = el("th", "q-model", q.model);
  name.scope = "rowgroup";
  const slots = el("td", "q-slots num", `${count(q.running)}/${count(q.slots)}`);
  slots.title = `${count(q.running)} running of ${count(q.slots)} slots`;
  const waiting = el("td", "q-waiting num", count(q.waiting));
  const state = el("td", "q-state");
  const badge = el("span", q.closed ? "badge state-loading" : "badge state-ready", q.closed ? "closed" : "open");
  if (q.closed) badge.title = "being swapped out: what waits goes on once another model is loaded";
  state.append(badge);
  for (const cell of [name, slots, waiting, state]) cell.rowSpan = Number(span);
  const lines = waits.length ? waits : [null];
  lines.forEach((w, i) => {
    const tr = el("tr");
    if (i === 0) tr.append(name, slots, waiting, state);
    if (w) {
      tr.dataset.key = String(w.key);
      tr.dataset.priority = String(w.priority);
      tr.append(el("td", "q-key", w.key), el("td", "q-priority", w.priority),
        el("td", "q-count num", count(w.waiting)), el("td", "q-longest num", fmtDuration(w.longest_wait_s)));
    } else {
      const none = el("td", "q-none muted", "nobody waits");
      none.colSpan = 4;
      tr.append(none);
    }
    body.append(tr);
  });
  return body;
}

function render(list) {
  const queues = list.filter((q) => q && typeof q === "object");
  const next = JSON.stringify(queues);
  if (next === sig) return;
  sig = next;
  for (const old of [...table.tBodies]) old.remove();
  table.append(...queues.map(modelRows));
  wrap.hidden = queues.length === 0;
  empty.hidden = queues.length > 0;
}

card({
  snapshot(snap) {
    render(Array.isArray(snap.queues) ? snap.queues : []);
  },
});
