/* A tool call and its result as a step of the thread: a <details> that opens and closes,
 * with the tool's name, its arguments, its result and how long it ran; while the call waits
 * for the user (approval on), Allow and Deny buttons. Pure DOM from one ``tool`` message. */

import { button } from "./dom.js";

/* The steps the user opened (message ids): a redraw of the thread keeps them open. State
 * private to this view, like the draft of an edit. */
const opened = new Set();

function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (err) {
    return text;
  }
}

export function toolSummary(m) {
  const t = m.tool || {};
  const name = t.name || "a tool";
  if (m.status === "streaming") return t.approval === "pending" ? `${name} wants to run` : `Running ${name}…`;
  if (t.approval === "denied") return `${name} was not allowed`;
  if (m.status === "interrupted") return `${name} was stopped`;
  const time = t.duration_ms == null ? "" : ` in ${t.duration_ms < 1000 ? `${Math.round(t.duration_ms)} ms` : `${(t.duration_ms / 1000).toFixed(1)} s`}`;
  return `${t.is_error ? "Failed" : "Ran"} ${name}${time}`;
}

function section(label, text, className) {
  const wrap = document.createElement("div");
  wrap.className = `tool-section ${className}`;
  const heading = document.createElement("div");
  heading.className = "tool-label";
  heading.textContent = label;
  const pre = document.createElement("pre");
  pre.textContent = text;
  wrap.append(heading, pre);
  return wrap;
}

/** The step's body: the details block, and the approval buttons while the call waits. */
export function toolStepNode(m, index, ctx) {
  const t = m.tool || {};
  const wrap = document.createElement("div");
  wrap.className = "tool-step-wrap";
  const details = document.createElement("details");
  details.className = `tool-step${t.is_error ? " tool-error" : ""}`;
  details.dataset.focusKey = `${index}:tool`;
  details.open = (t.approval === "pending" && m.status === "streaming") || opened.has(m.id);
  details.addEventListener("toggle", () => (details.open ? opened.add(m.id) : opened.delete(m.id)));
  const summary = document.createElement("summary");
  summary.textContent = toolSummary(m);
  details.append(summary, section("Arguments", prettyArguments(t.arguments || ""), "tool-arguments"));
  if (m.status !== "streaming") details.appendChild(section("Result", m.content || "(empty)", "tool-result"));
  wrap.appendChild(details);
  if (t.approval === "pending" && m.status === "streaming") {
    const row = document.createElement("div");
    row.className = "tool-approval";
    row.setAttribute("role", "group");
    row.setAttribute("aria-label", `Allow the call to ${t.name}?`);
    const decide = (approved) => () => ctx.actions.approve(m.id, approved);
    const allow = button(`Allow ${t.name}`, "", "btn btn-primary", decide(true), { text: "Allow", key: `${index}:allow` });
    const deny = button(`Deny ${t.name}`, "", "btn", decide(false), { text: "Deny", key: `${index}:deny` });
    row.append(allow, deny);
    wrap.appendChild(row);
  }
  return wrap;
}
