/* The header's status line: the connection's state, and the last action's outcome. */

import { $, setText } from "./dom.js";

const connStatus = $("conn-status");
const actionStatus = $("action-status");
let actionTimer = 0;

export function setConn(state, text) {
  connStatus.dataset.state = state;
  setText(connStatus, text);
}

export function setAction(text, isError) {
  clearTimeout(actionTimer);
  actionStatus.classList.toggle("error", !!isError);
  setText(actionStatus, text || "");
  if (text && !isError) actionTimer = setTimeout(() => setText(actionStatus, ""), 8000);
}

export const connState = () => connStatus.dataset.state;
