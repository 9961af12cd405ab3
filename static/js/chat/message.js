/* One message of the thread as DOM: its text (Markdown for answers), reasoning, state and buttons.
 * A pure function of the message and a context; the thread view decides when to call it. */

import { ICONS, button, copyText } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { ratingNode } from "./workspace/rating.js";
import { toolStepNode } from "./tool_step.js";
import { regenerateWith } from "./models.js";

export function reasoningSummary(m) {
  if (m.reasoning_seconds == null) return m.status === "streaming" ? "Thinking…" : "Thoughts";
  const n = Math.max(1, Math.round(m.reasoning_seconds));
  return `Thought for ${n} second${n === 1 ? "" : "s"}`;
}

/** The collapsed "Thought for N seconds" block (the reasoning contract in docs/interfaces.md);
 * open and live while reasoning streams. */
function reasoningNode(m) {
  const details = document.createElement("details");
  details.className = "reasoning";
  details.open = m.status === "streaming" && !m.content;
  const summary = document.createElement("summary");
  summary.textContent = reasoningSummary(m);
  const body = document.createElement("div");
  body.className = "reasoning-body";
  body.textContent = m.reasoning;
  details.append(summary, body);
  return details;
}

/** A state that a screen reader can find: "generating" or "stopped". */
function stateNode(m) {
  if (m.role === "tool" && m.status === "streaming" && m.tool && m.tool.approval === "pending") {
    const span = document.createElement("span");
    span.className = "msg-state state-waiting";
    span.setAttribute("role", "status");
    span.textContent = "Waiting for your approval";
    return span;
  }
  const label = m.status === "streaming" ? "Generating" : m.status === "interrupted" ? "Stopped" : "";
  if (!label) return null;
  const span = document.createElement("span");
  span.className = `msg-state state-${m.status}`;
  span.setAttribute("role", "status");
  span.setAttribute("aria-label", m.status === "streaming" ? "Answer generating" : "Answer stopped");
  span.textContent = m.status === "streaming" ? "Generating…" : label;
  return span;
}

export function metaText(m) {
  const parts = [];
  if (m.role === "assistant" && m.model) parts.push(m.model); // which model wrote it
  if (m.status === "complete" && m.finish_reason === "length") parts.push("Reached the token limit");
  if (m.status !== "streaming" && m.completion_tokens) parts.push(`${m.completion_tokens} tokens`);
  if (m.status !== "streaming" && m.tokens_per_s) parts.push(`${m.tokens_per_s.toFixed(1)} tok/s`);
  return parts.join(" · ");
}

function switcher(m, index, ctx) {
  const wrap = document.createElement("div");
  wrap.className = "switcher";
  wrap.setAttribute("role", "group");
  wrap.setAttribute("aria-label", `Branch ${m.sibling_index + 1} of ${m.siblings.length}`);
  const i = m.sibling_index;
  const total = m.siblings.length;
  const go = (to) => to >= 0 && to < total && !ctx.busy && ctx.actions.switchTo(m.siblings[to]);
  const prev = button("Previous branch", ICONS.prev, "switch-btn", () => go(i - 1), { key: `${index}:prev` });
  prev.disabled = i === 0 || ctx.busy;
  const label = document.createElement("span");
  label.className = "switch-label";
  label.setAttribute("aria-hidden", "true");
  label.textContent = `${i + 1}/${total}`;
  const next = button("Next branch", ICONS.next, "switch-btn", () => go(i + 1), { key: `${index}:next` });
  next.disabled = i === total - 1 || ctx.busy;
  // Left and right arrows move between branches while a branch button has focus.
  wrap.addEventListener("keydown", (e) => {
    if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
      e.preventDefault();
      go(e.key === "ArrowLeft" ? i - 1 : i + 1);
    }
  });
  wrap.append(prev, label, next);
  return wrap;
}

function userText(m, body) {
  const content = document.createElement("div");
  content.className = "msg-content msg-text";
  content.textContent = m.content;
  body.appendChild(content);
  if (m.content.length > 700 || m.content.split("\n").length > 12) {
    content.classList.add("clamped");
    const more = document.createElement("button");
    more.type = "button";
    more.className = "show-more";
    more.textContent = "Show more";
    more.setAttribute("aria-expanded", "false");
    more.addEventListener("click", () => {
      const open = content.classList.toggle("clamped") === false;
      more.textContent = open ? "Show less" : "Show more";
      more.setAttribute("aria-expanded", String(open));
    });
    body.appendChild(more);
  }
}

function editor(m, index, ctx, body) {
  const area = document.createElement("textarea");
  area.className = "edit-area";
  area.value = ctx.editing.draft;
  area.setAttribute("aria-label", "Edit message");
  area.dataset.focusKey = `${index}:editor`;
  area.addEventListener("input", () => (ctx.editing.draft = area.value));
  const row = document.createElement("div");
  row.className = "edit-actions";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "btn";
  cancel.textContent = "Cancel";
  const save = document.createElement("button");
  save.type = "button";
  save.className = "btn btn-primary";
  save.textContent = "Save & submit";
  cancel.addEventListener("click", () => ctx.endEdit(false));
  save.addEventListener("click", () => ctx.endEdit(true));
  area.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.preventDefault();
      e.stopPropagation();
      ctx.endEdit(false);
    } else if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      ctx.endEdit(true);
    }
  });
  row.append(cancel, save);
  body.append(area, row);
}

export function messageNode(m, index, ctx) {
  const article = document.createElement("article");
  article.className = `msg msg-${m.role} status-${m.status}`;
  article.dataset.id = m.id;
  article.dataset.focusKey = `${index}:article`;
  article.tabIndex = -1;
  article.setAttribute("aria-label", m.role === "user" ? "Your message" : m.role === "tool" ? "Tool call" : "Answer");
  if (m.status === "streaming") article.setAttribute("aria-busy", "true");
  if (m.role === "tool") {
    bodyOf(article).appendChild(toolStepNode(m, index, ctx));
    return withFooter(article, m, index, ctx);
  }
  if (m.role === "assistant") {
    const avatar = document.createElement("div");
    avatar.className = "msg-avatar";
    avatar.innerHTML = ICONS.bot;
    article.appendChild(avatar);
  }
  const body = document.createElement("div");
  body.className = "msg-body";
  article.appendChild(body);

  if (m.role === "user" && ctx.editing && ctx.editing.id === m.id) {
    article.classList.add("editing");
    editor(m, index, ctx, body);
    return article;
  }
  if (m.role === "assistant" && m.context_dropped > 0) {
    const notice = document.createElement("p");
    notice.className = "msg-notice";
    const n = m.context_dropped;
    notice.textContent = `The conversation is longer than the model's context: the ${n} oldest message${
      n === 1 ? " was" : "s were"
    } left out of this answer's prompt.`;
    body.appendChild(notice);
  }
  if (m.role === "assistant" && m.reasoning) body.appendChild(reasoningNode(m));
  if (m.role === "assistant" && m.tool_calls && m.tool_calls.length && !m.content) {
    // An answer that only called tools: a line naming them; the calls follow as steps.
    const note = document.createElement("p");
    note.className = "msg-notice tool-calls-note";
    note.textContent = `Calling ${m.tool_calls.map((c) => c.name).join(", ")}`;
    body.appendChild(note);
  } else if (m.role === "user") {
    userText(m, body);
  } else {
    const content = document.createElement("div");
    content.className = "msg-content markdown";
    if (m.status === "streaming" && !m.content) {
      content.innerHTML = '<span class="thinking" aria-hidden="true"><i></i><i></i><i></i></span>';
    } else {
      renderMarkdown(content, m.content, m.status === "streaming");
    }
    body.appendChild(content);
  }
  if (m.status === "error") {
    const error = document.createElement("div");
    error.className = "msg-error";
    error.textContent = m.error || "The answer failed.";
    body.appendChild(error);
  }
  return withFooter(article, m, index, ctx);
}

function bodyOf(article) {
  const node = document.createElement("div");
  node.className = "msg-body";
  article.appendChild(node);
  return node;
}

function withFooter(article, m, index, ctx) {
  const body = article.querySelector(".msg-body");
  const footer = document.createElement("div");
  footer.className = "msg-footer";
  body.appendChild(footer);
  if (m.siblings && m.siblings.length > 1 && !ctx.inColumn) footer.appendChild(switcher(m, index, ctx));
  footer.appendChild(actionsNode(m, index, ctx));
  if (m.role === "assistant" && m.status !== "streaming" && m.content && !ctx.temporary && !ctx.inColumn) {
    footer.appendChild(ratingNode(m, index));
  }
  const state = stateNode(m);
  const meta = metaText(m);
  if (state || meta) {
    const span = document.createElement("span");
    span.className = "msg-meta";
    if (state) span.appendChild(state);
    if (state && meta) span.append(" · ");
    if (meta) span.append(meta);
    footer.appendChild(span);
  }
  return article;
}

function actionsNode(m, index, ctx) {
  const actions = document.createElement("div");
  actions.className = "msg-actions";
  const { busy, actions: act } = ctx;
  const add = (label, icon, onClick, { danger = false, disabled = false } = {}) => {
    const b = button(label, icon, danger ? "action action-danger" : "action", onClick, { key: `${index}:${label}` });
    b.disabled = disabled;
    actions.appendChild(b);
  };
  if (m.status === "streaming") return actions;
  if (ctx.inColumn) {
    // A side-by-side column: the choice is "Keep this answer"; the rest comes once one is kept.
    if (m.content) add("Copy", ICONS.copy, (e) => copyText(m.content, e.currentTarget));
    return actions;
  }
  if (m.role === "tool") {
    add("Copy", ICONS.copy, (e) => copyText(m.content, e.currentTarget));
  } else if (m.role === "user") {
    add("Edit", ICONS.edit, () => ctx.startEdit(m), { disabled: busy });
    add("Copy", ICONS.copy, (e) => copyText(m.content, e.currentTarget));
    if (ctx.isLast) add("Answer", ICONS.regenerate, () => act.regenerate(m.id), { disabled: busy });
  } else {
    if (m.content) add("Copy", ICONS.copy, (e) => copyText(m.content, e.currentTarget));
    add("Regenerate", ICONS.regenerate, () => act.regenerate(m.id), { disabled: busy });
    if ((ctx.models || []).length > 1) actions.appendChild(regenerateWith(m, ctx, ctx.models));
  }
  if (!ctx.temporary) add("Continue in a new conversation", ICONS.fork, () => act.fork(m.id), { disabled: busy });
  add("Delete message", ICONS.trash, () => ctx.confirmDeleteMessage(m), { danger: true, disabled: busy });
  return actions;
}
