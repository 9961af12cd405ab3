/* The thread view: draws the visible path of messages from the store, streams deltas at most once
 * per animation frame, keeps keyboard focus across re-renders and announces finished answers. */

import { $, announce, prefersReducedMotion } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { messageNode, reasoningSummary } from "./message.js";
import { findMessage, isBusy, lastUserMessage } from "./store.js";

const ANNOUNCE_CHARS = 600;

export function createThreadView(store, actions, { confirm }) {
  const scroll = $("thread-scroll");
  const thread = $("thread");
  const empty = $("empty-state");
  const dirty = new Set();
  let frame = 0;
  let editing = null; // {id, draft}: the one message being edited, kept across re-renders
  let submittedEdit = null; // an edit the server has not accepted yet: an error reopens it

  const nearBottom = () => scroll.scrollHeight - scroll.scrollTop - scroll.clientHeight < 120;
  function scrollToBottom(smooth) {
    scroll.scrollTo({ top: scroll.scrollHeight, behavior: smooth && !prefersReducedMotion() ? "smooth" : "auto" });
  }

  const ctx = () => {
    const state = store.state;
    return {
      busy: isBusy(state),
      actions,
      editing,
      startEdit,
      endEdit,
      confirmDeleteMessage,
      isLast: false,
    };
  };

  function node(m, index, context) {
    const last = store.state.messages[store.state.messages.length - 1];
    return messageNode(m, index, { ...context, isLast: last && last.id === m.id });
  }

  /** The element to focus after a re-render: the same control, its group's other control, or the composer. */
  function focusKeyOf(el) {
    return el && thread.contains(el) && el.dataset ? el.dataset.focusKey : null;
  }
  function restoreFocus(key) {
    if (!key) return;
    const [index] = key.split(":");
    const candidates = [key, `${index}:prev`, `${index}:next`];
    for (const k of candidates) {
      const el = thread.querySelector(`[data-focus-key="${k}"]`);
      if (el && !el.disabled) {
        el.focus();
        return;
      }
    }
    $("prompt").focus();
  }

  function renderAll() {
    const state = store.state;
    const stick = nearBottom() || thread.childElementCount === 0;
    const focusKey = focusKeyOf(document.activeElement);
    if (editing && !findMessage(state, editing.id)) editing = null;
    const context = ctx();
    thread.replaceChildren(...state.messages.map((m, i) => node(m, i, context)));
    empty.hidden = state.messages.length > 0;
    restoreFocus(focusKey);
    if (stick) scrollToBottom(false);
  }

  function renderOne(id) {
    const state = store.state;
    const index = state.messages.findIndex((m) => m.id === id);
    const old = thread.querySelector(`[data-id="${id}"]`);
    if (index < 0 || !old) return;
    const stick = nearBottom();
    const focusKey = focusKeyOf(document.activeElement);
    old.replaceWith(node(state.messages[index], index, ctx()));
    restoreFocus(focusKey);
    if (stick) scrollToBottom(false);
  }

  /** Streaming: at most one DOM update per frame, and only of the text that changed. */
  function scheduleFrame(id) {
    dirty.add(id);
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      // With reduced motion the page does not scroll by itself while text streams in.
      const stick = nearBottom() && !prefersReducedMotion();
      for (const dirtyId of dirty) {
        const m = findMessage(store.state, dirtyId);
        const article = m && thread.querySelector(`[data-id="${dirtyId}"]`);
        if (!article) continue;
        const reasoning = article.querySelector(".reasoning");
        if (m.reasoning && !reasoning) {
          renderOne(m.id); // the first reasoning text: the block appears
          continue;
        }
        if (reasoning) {
          reasoning.querySelector(".reasoning-body").textContent = m.reasoning;
          reasoning.querySelector("summary").textContent = reasoningSummary(m);
          if (m.content && !reasoning.dataset.folded) {
            reasoning.open = false; // the answer has begun: fold the thoughts away once
            reasoning.dataset.folded = "1";
          }
        }
        const content = article.querySelector(".msg-content");
        if (m.content) renderMarkdown(content, m.content, true);
      }
      dirty.clear();
      if (stick) scrollToBottom(false);
    });
  }

  function startEdit(m) {
    editing = { id: m.id, draft: m.content };
    renderOne(m.id);
    const area = thread.querySelector(".edit-area");
    if (area) {
      area.focus();
      area.setSelectionRange(area.value.length, area.value.length);
      area.closest("article").scrollIntoView({ block: "nearest" });
    }
  }

  function endEdit(submit) {
    if (!editing) return;
    const { id, draft } = editing;
    const text = draft.trim();
    if (submit && !text) return;
    editing = null;
    renderOne(id);
    if (submit) {
      submittedEdit = { id, draft };
      actions.edit(id, text);
      $("prompt").focus();
    } else {
      const index = store.state.messages.findIndex((m) => m.id === id);
      restoreFocus(`${index}:Edit`);
    }
  }

  async function confirmDeleteMessage(m) {
    const ok = await confirm("Delete this message?", "The message and every reply below it, in all branches, will be deleted.");
    if (ok) actions.deleteMessage(m.id);
  }

  function announceFinished(message) {
    if (message.role !== "assistant") return;
    if (message.status === "interrupted") announce("Answer stopped.");
    else if (message.status === "error") announce(`The answer failed: ${message.error || ""}`);
    else {
      const article = thread.querySelector(`[data-id="${message.id}"] .msg-content`);
      let text = article ? article.textContent.trim() : message.content;
      if (text.length > ANNOUNCE_CHARS) text = text.slice(0, ANNOUNCE_CHARS) + "…";
      announce(`Answer: ${text}`);
    }
  }

  store.subscribe((state, action) => {
    switch (action.type) {
      case "show":
        editing = null;
        renderAll();
        break;
      case "thread":
        submittedEdit = null;
        renderAll();
        break;
      case "error":
        if (submittedEdit && findMessage(state, submittedEdit.id)) {
          const { id } = submittedEdit;
          editing = submittedEdit;
          submittedEdit = null;
          renderOne(id);
          const area = thread.querySelector(".edit-area");
          if (area) area.focus();
        }
        break;
      case "sending":
        break;
      case "started":
        renderOne(action.message_id);
        break;
      case "delta":
        scheduleFrame(action.message_id);
        break;
      case "finished":
        dirty.delete(action.message.id);
        // The last answer done: every message's buttons come back, so draw them all again.
        if (isBusy(state)) renderOne(action.message.id);
        else renderAll();
        announceFinished(findMessage(state, action.message.id) || action.message); // the event has no role
        break;
      default:
        break;
    }
  });

  return {
    renderAll,
    /** ↑ in an empty composer: edit the last question of the thread. */
    editLast() {
      const state = store.state;
      const last = lastUserMessage(state);
      if (last && !isBusy(state)) startEdit(last);
    },
    isEditing: () => editing !== null,
  };
}
