// A tiny element builder: text always goes through textContent, never innerHTML (API text is untrusted).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAll(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAll(el, attrs);
  append(el, children);
  return el;
}

function setAll(el, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// The id of a control that had keyboard focus when its block was re-rendered (e.g. "Next page", whose block
// shows "Loading…" first): focus returns to it once it exists again, unless the user has moved on meanwhile.
let pendingFocus = null;

/** Replace a container's content, keeping keyboard focus on the control with the same id. */
export function replace(container, ...children) {
  const active = document.activeElement;
  if (active && active !== container && active.id && container.contains(active)) pendingFocus = active.id;
  container.replaceChildren();
  append(container, children);
  if (!pendingFocus) return;
  const target = document.getElementById(pendingFocus);
  const focusLost = !document.activeElement || document.activeElement === document.body;
  if (target && container.contains(target)) {
    if (focusLost) target.focus();
    pendingFocus = null;
  } else if (!focusLost) {
    pendingFocus = null;
  }
}
