/* The page's DOM helpers: every node is built with createElement / textContent (the CSP allows
 * no inline markup), and a cell is written only when its text changed. */

const SVG_NS = "http://www.w3.org/2000/svg";

export const $ = (id) => document.getElementById(id);

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

export function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

/** Sets textContent only when it changed, so unchanged cells are not touched each second. */
export function setText(node, text) {
  const value = text === undefined || text === null ? "" : String(text);
  if (node.textContent !== value) node.textContent = value;
}

export function setAttr(node, name, value) {
  if (value === undefined || value === null || value === "") {
    if (node.hasAttribute(name)) node.removeAttribute(name);
  } else if (node.getAttribute(name) !== String(value)) {
    node.setAttribute(name, String(value));
  }
}

/** Disables a button; if it had focus, hands focus to the row's other button when that one is usable. */
export function setDisabled(button, disabled, fallback) {
  if (button.disabled === disabled) return;
  const hadFocus = document.activeElement === button;
  button.disabled = disabled;
  if (disabled && hadFocus && fallback && !fallback.disabled) fallback.focus();
}

/** Keyed rows kept in `container` in the order of `items` ([key, item] pairs): each made once
 * by `create(key)`, redrawn by `update(row, item)`, moved only where out of place (a focused
 * button keeps its focus), removed when its key is gone (`removing(row)` first). */
export function placeRows(container, rows, items, create, update, node, removing) {
  const seen = new Set();
  let prev = null;
  for (const [key, item] of items) {
    seen.add(key);
    let row = rows.get(key);
    if (!row) {
      row = create(key);
      rows.set(key, row);
    }
    update(row, item);
    const el = node(row);
    const expected = prev ? prev.nextSibling : container.firstChild;
    if (expected !== el) container.insertBefore(el, expected);
    prev = el;
  }
  for (const [key, row] of rows) {
    if (!seen.has(key)) {
      if (removing) removing(row);
      node(row).remove();
      rows.delete(key);
    }
  }
  return seen;
}

/** Replaces a select's options when the set of ids changed, keeping the current choice. */
export function syncSelect(select, ids, fixed, pickDefault) {
  const sig = JSON.stringify(ids);
  if (select.dataset.sig === sig) return;
  select.dataset.sig = sig;
  const current = select.value;
  const options = fixed.map(([value, label, disabled]) => {
    const o = el("option", "", label);
    o.value = value;
    if (disabled) o.disabled = true;
    return o;
  });
  for (const id of ids) {
    const o = el("option", "", id);
    o.value = id;
    options.push(o);
  }
  select.replaceChildren(...options);
  if (current && ids.includes(current)) select.value = current;
  else if (pickDefault) select.value = pickDefault();
  else select.value = fixed.length ? fixed[0][0] : "";
}
