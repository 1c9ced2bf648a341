/* gguf-gateway's page: the dashboard and playground, its entry module.
 *
 * Plain ES modules loaded by the browser, no build step, no dependencies. Runs under a strict CSP
 * (no inline script or style, no eval), so every node is built with createElement / textContent;
 * data from the server (model names, errors, chat text) is never parsed as HTML.
 *
 * This module holds the key form and the start: GET /models with the key the tab has, then each
 * card (cards/*.js, registered through lib/panels.js) draws and starts, and the live stream
 * (lib/snapshots.js) feeds them. A card imports lib/ and never another card. */

import { AuthError, apiJSON, clearKey, getKey, setKey } from "./lib/api.js";
import { $, setText } from "./lib/dom.js";
import { each, whenKeyNeeded } from "./lib/panels.js";
import { startLive, stopLive } from "./lib/snapshots.js";
import { setAction, setConn } from "./lib/status.js";
// the cards, in the page's order: each registers itself when imported
import "./cards/models.js";
import "./cards/queues.js";
import "./cards/downloads.js";
import "./cards/mcp.js";
import "./cards/live.js";
import "./cards/usage.js";
import "./cards/requests.js";
import "./cards/captures.js";
import "./cards/playground.js";

const BOOT_RETRY_MS = 5000;

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
  each("stop");
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
    each("start", body); // each card draws what the answer holds, and starts what it fetches itself
    setConn("connecting", "Connected, starting live updates…");
    startLive();
    // captured requests: once the first snapshot says this key is an admin's (cards/captures.js)
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

whenKeyNeeded(needKey);

window.addEventListener("pagehide", () => {
  stopLive();
  each("stop");
});

boot();
