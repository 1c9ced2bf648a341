/* The Playground card: a chat with one of the gateway's chat models, streamed (POST
 * /v1/chat/completions), with its thinking, tool calls and figures as they come; a system prompt,
 * sampling settings and OpenAI tool definitions. The conversation lives in this tab only. */

import { AuthError, HttpError, authHeaders, checked, readSSE } from "../lib/api.js";
import { $, el, setDisabled, setText, syncSelect } from "../lib/dom.js";
import { fmtDuration, isNum } from "../lib/format.js";
import { card, needKey } from "../lib/panels.js";

const pgModel = $("pg-model");
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

/** The models a chat can go to: not the embedding or rerank ones, nor those still downloading. */
function chatModels(models) {
  return models.filter((m) => m.kind !== "embeddings" && m.kind !== "rerank" && m.state !== "downloading");
}

card({
  models(list) {
    const chat = chatModels(list);
    const ids = chat.map((m) => m.id);
    syncSelect(pgModel, ids, ids.length ? [] : [["", "No chat models", true]], () => {
      const ready = chat.find((m) => m.state === "ready");
      return ready ? ready.id : ids[0] || "";
    });
    pgModel.disabled = !ids.length;
  },
  stop: abortChat,
});
