/* The cards' machinery: each card of the page registers what it does when the page starts, when
 * a live snapshot comes, when the list of models changes and when the page stops; the page calls
 * each card's through here, so that no card imports another. A card that finds its key refused
 * calls needKey, which the page (app.js) answers by going back to its key form.
 *
 * Each card's frame (the section, its heading and the head's tools) is written once, in
 * index.html's <template id="card-head">: frame() puts it on every <section data-card>. */

import { $ } from "./dom.js";

const cards = [];
let onKeyNeeded = () => {};

/** Registers a card's hooks: start(body of GET /models), snapshot(snap), models(list), stop(). */
export function card(hooks) {
  cards.push(hooks);
}

/** Calls each card's `hook` that has one, in the order the cards registered. */
export function each(hook, ...args) {
  for (const c of cards) if (c[hook]) c[hook](...args);
}

/** The page's answer to a refused key (app.js sets it). */
export function whenKeyNeeded(fn) {
  onKeyNeeded = fn;
}

/** Back to the key form: a card's request was refused (401). */
export function needKey(refused) {
  onKeyNeeded(refused);
}

/** Gives each <section data-card="Title"> the shared head (template#card-head): its heading,
 * labelling the section, and the card's own tools ([data-card-tools]) beside it. */
export function frame() {
  const template = $("card-head");
  for (const section of document.querySelectorAll("section[data-card]")) {
    const head = template.content.firstElementChild.cloneNode(true);
    const h2 = head.querySelector("h2");
    h2.id = section.dataset.heading || `${section.id}-heading`;
    h2.textContent = section.dataset.card;
    const tools = section.querySelector(":scope > [data-card-tools]");
    if (tools) head.append(tools);
    section.classList.add("card");
    section.setAttribute("aria-labelledby", h2.id);
    section.prepend(head);
  }
}

frame(); // before any card module runs: each finds its nodes where the page will show them
