/* What the Requests card draws of a captured request, as plain DOM: its turns in the shape its wire
 * gives them, its tools and settings, the answer read back, its times and counts, and the raw
 * blocks. Everything in them is the client's or the model's text: set as textContent. */

import { el } from "../lib/dom.js";
import { fmtBytes, fmtDuration, fmtNumber, isNum } from "../lib/format.js";

export const CAP_MAX_MESSAGES = 300; // a request's messages drawn; the raw body has them all
export const CAP_MAX_TEXT = 20000; // characters of one message, answer part or write drawn
export const CAP_MAX_RAW = 400000; // characters of a raw body drawn

export const fmtMs = (s) => (isNum(s) ? `${fmtNumber(s * 1000, 0)} ms` : "—");

export function fmtRate(v) {
  return isNum(v) ? `${fmtNumber(v, v >= 100 ? 0 : 1)} tok/s` : "—";
}

/** A text cut to `max` characters, said so at its end. */
export function capped(text, max) {
  const s = String(text);
  return s.length > max ? `${s.slice(0, max)}\n… ${fmtNumber(s.length - max, 0)} more characters (see Raw)` : s;
}

/** Why a capture cannot be sent again (as the server would say, before asking it), or "". */
export function notReplayable(d) {
  if (d.redacted) return "Kept without its text (server.capture.redact_content): it cannot be sent again.";
  const req = d.request || {};
  if (req.truncated) return "Its request was cut at server.capture.max_body_bytes: it cannot be sent again.";
  if (!req.body || typeof req.body !== "object" || Array.isArray(req.body)) {
    return "Its request has no JSON body to send again.";
  }
  return "";
}

/** The text of a message's content as the wires give it: a string, or parts (text, images, calls, results). */
export function contentText(content) {
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

export function jsonText(v) {
  if (typeof v === "string") return v;
  try {
    return JSON.stringify(v);
  } catch (_) {
    return String(v);
  }
}

/** Arguments as the model gave them, indented where they are JSON. */
export function prettyArgs(args) {
  const text = typeof args === "string" ? args : jsonText(args);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) {
    return text;
  }
}

export function callBox(name, args, id) {
  const box = el("div", "tool-call");
  const head = el("div", "tool-head");
  head.append(el("span", "tool-label muted", "Tool call "), el("code", "tool-name", name || "?"));
  if (id) head.append(el("span", "tool-id muted small", ` ${id}`));
  box.append(head, el("pre", "tool-args", capped(prettyArgs(args === undefined || args === null ? "" : args), CAP_MAX_TEXT)));
  return box;
}

/** The calls an assistant turn of a request carries: OpenAI's and Ollama's tool_calls. */
export function turnCalls(m) {
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
  return calls.filter((c) => c && typeof c === "object").map((c) => {
    const fn = c.function && typeof c.function === "object" ? c.function : c;
    return callBox(fn.name, fn.arguments, c.id);
  });
}

export function messageView(role, text, extra) {
  const msg = el("div", `cap-msg role-${String(role || "message").replace(/[^a-z_-]/gi, "")}`);
  msg.append(el("div", "cap-role", role || "message"));
  if (text) msg.append(el("div", "cap-text", capped(text, CAP_MAX_TEXT)));
  for (const node of extra || []) msg.append(node);
  if (!text && !(extra && extra.length)) msg.append(el("div", "cap-text muted", "(empty)"));
  return msg;
}

/** The turns a request's body holds, in the shape its wire gives them. */
export function requestTurns(body) {
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

export function requestView(req) {
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
export function answerView(answer, response, opts) {
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

export function statItem(label, value, title, sub) {
  const div = el("div", "cap-stat");
  const dd = el("dd", "", value);
  if (sub) dd.append(el("span", "cap-stat-sub", sub));
  if (title) dd.title = title;
  div.append(el("dt", "", label), dd);
  return div;
}

/** A capture's times and counts, as dt/dd pairs; brief: the four a comparison reads. */
export function statItems(d, brief) {
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

export function fmtAt(t) {
  return isNum(t) ? `${fmtNumber(t * 1000, t < 10 ? 1 : 0)} ms` : "—";
}

export function rawBlock(title, text, note) {
  const box = el("div", "cap-raw-part");
  box.append(el("h5", "cap-raw-title", title));
  if (note) box.append(el("p", "muted small", note));
  const pre = el("pre", "cap-pre", capped(text, CAP_MAX_RAW));
  pre.tabIndex = 0;
  pre.setAttribute("aria-label", title);
  box.append(pre);
  return box;
}

export function headerText(headers) {
  return headers && typeof headers === "object"
    ? Object.entries(headers).map(([k, v]) => `${k}: ${v}`).join("\n") : "";
}
