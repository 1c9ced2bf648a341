/* The page's API key (kept in the tab's session storage) and its requests: JSON, and the bodies
 * it reads as they come (server-sent events, NDJSON, lines). A 401 is an AuthError. */

const KEY_STORAGE = "gguf-gateway-key";

export function getKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE) || "";
  } catch (_) {
    return "";
  }
}

export function setKey(key) {
  try {
    sessionStorage.setItem(KEY_STORAGE, key);
  } catch (_) {
    /* storage unavailable: the key lives only as long as this call chain */
  }
}

export function clearKey() {
  try {
    sessionStorage.removeItem(KEY_STORAGE);
  } catch (_) {
    /* nothing to clear */
  }
}

export function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "HttpError";
    this.status = status;
  }
}

export class AuthError extends HttpError {
  constructor(message) {
    super(401, message);
    this.name = "AuthError";
  }
}

/** The message of an OpenAI-shaped error body, or a fallback built from the status line. */
export async function errorMessage(resp) {
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
export async function checked(resp) {
  if (resp.status === 401) throw new AuthError(await errorMessage(resp));
  if (!resp.ok) throw new HttpError(resp.status, await errorMessage(resp));
  return resp;
}

export async function apiJSON(path, options) {
  const opts = Object.assign({ cache: "no-store" }, options || {});
  opts.headers = authHeaders(Object.assign({ Accept: "application/json" }, opts.headers || {}));
  return (await checked(await fetch(path, opts))).json();
}

/**
 * Reads a text/event-stream body. onEvent({event, data}) is called at the blank line that ends
 * each event; returning true stops reading. onComment(text) gets ":" comment lines.
 */
export async function readSSE(resp, onEvent, onComment) {
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
export async function readNDJSON(resp, onLine) {
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
