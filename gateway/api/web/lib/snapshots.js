/* The live stream (GET /dashboard/live): a snapshot of the models, the charts' series, the
 * recent requests and the pulls every second, handed to each card (panels.each "snapshot");
 * when it breaks, the page says so and asks again. */

import { AuthError, authHeaders, checked, errorMessage, readSSE } from "./api.js";
import { each, needKey } from "./panels.js";
import { connState, setConn } from "./status.js";

const LIVE_RETRY_MS = 2500;

const live = { ctrl: null, timer: 0 };

export function stopLive() {
  clearTimeout(live.timer);
  live.timer = 0;
  if (live.ctrl) {
    const ctrl = live.ctrl;
    live.ctrl = null;
    ctrl.abort();
  }
}

export function startLive() {
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
  if (connState() !== "live") setConn("live", "Live");
  each("snapshot", snap);
}
