// Small DOM helpers. Every text from the API goes in as a text node (never as HTML), so a stored
// statement such as "<img onerror=...>" is shown, not run.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An HTML element: el("td", {class: "x"}, "text", otherNode). */
export const el = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);

/** An SVG element, same shape as `el`. */
export const svg = (tag, attrs, ...children) => build(document.createElementNS(SVG_NS, tag), attrs, children);

export const byId = (id) => document.getElementById(id);

export function replace(node, ...children) {
  node.replaceChildren();
  return build(node, {}, children);
}

/** "2024-05-01 10:00:00Z" from an ISO 8601 instant; "" for none. Times are shown in UTC throughout. */
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toISOString().slice(0, 19).replace("T", " ") + "Z";
}

/** The ISO 8601 instant of a datetime-local input, read as UTC; undefined when empty. */
export function utcInput(input) {
  const value = input.value.trim();
  if (!value) return undefined;
  const d = new Date(value.length === 16 ? `${value}:00Z` : `${value}Z`);
  if (Number.isNaN(d.getTime())) throw new Error(`not a date and time: ${value}`);
  return d.toISOString();
}

/** Sets a datetime-local input (UTC) to the instant `ms`. */
export function setUtcInput(input, ms) {
  input.value = new Date(ms).toISOString().slice(0, 19);
}

/** Shows an error (or clears it with null) in a role=alert element. */
export function showError(node, error) {
  node.textContent = error ? error.message || String(error) : "";
  node.hidden = !error;
}

/** The confirm step before a forget: a modal dialog; resolves true only on the "Forget" button. */
export function confirmForget(text) {
  const dialog = byId("confirm");
  byId("confirm-text").textContent = text;
  return new Promise((resolve) => {
    const done = (answer) => {
      yes.removeEventListener("click", onYes);
      dialog.removeEventListener("close", onClose);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    const yes = byId("confirm-yes");
    const onYes = () => done(true);
    const onClose = () => done(false);
    yes.addEventListener("click", onYes);
    dialog.addEventListener("close", onClose);
    dialog.showModal();
  });
}
