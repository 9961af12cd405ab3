/* The thread view: draws the visible path of messages from the store, streams deltas at most once
 * per animation frame, keeps keyboard focus across re-renders and announces finished answers. */

import { $, announce, prefersReducedMotion } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { messageNode, reasoningSummary } from "./message.js";
import { columnsNode, groupAt } from "./side_by_side.js";
import { findMessage, isBusy, lastUserMessage } from "./store.js";

const ANNOUNCE_CHARS = 600;

/** The element to focus after a re-render: the same control, its group's other control, or the composer. */
function focusKeyOf(thread, el) {
  return el && thread.contains(el) && el.dataset ? el.dataset.focusKey : null;
}

function restoreFocus(thread, key) {
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

/* The streamed text and reasoning of a drawn message, updated in place; false when the message
 * must be drawn again instead (its first reasoning text: the block appears). */
function updateStreamed(article, m) {
  const reasoning = article.querySelector(".reasoning");
  if (m.reasoning && !reasoning) return false;
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
  return true;
}

function announceFinished(thread, message) {
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

/* Drawing the thread: all of it, one message, or the streamed text of some at most once per
 * frame. `context()` gives what message.js needs beyond the message (edit state, actions). */
function createRenderer(store, context) {
  const scroll = $("thread-scroll");
  const thread = $("thread");
  const empty = $("empty-state");
  const dirty = new Set();
  let frame = 0;

  const nearBottom = () => scroll.scrollHeight - scroll.scrollTop - scroll.clientHeight < 120;
  function scrollToBottom(smooth) {
    scroll.scrollTo({ top: scroll.scrollHeight, behavior: smooth && !prefersReducedMotion() ? "smooth" : "auto" });
  }

  function node(m, index, ctx) {
    const { messages, beside } = store.state;
    const group = groupAt(messages, index);
    if (group) return columnsNode(group, m, index, ctx, beside);
    const last = messages[messages.length - 1];
    return messageNode(m, index, { ...ctx, isLast: last && last.id === m.id });
  }

  const earlierButton = $("load-earlier");
  function showEarlierButton() {
    earlierButton.hidden = !(store.state.earlier > 0);
  }

  function renderAll() {
    const state = store.state;
    showEarlierButton();
    const stick = nearBottom() || thread.childElementCount === 0;
    const focusKey = focusKeyOf(thread, document.activeElement);
    const ctx = context();
    thread.replaceChildren(...state.messages.map((m, i) => node(m, i, ctx)));
    empty.hidden = state.messages.length > 0;
    restoreFocus(thread, focusKey);
    if (stick) scrollToBottom(false);
  }

  function renderOne(id) {
    const state = store.state;
    const index = state.messages.findIndex((m) => m.id === id);
    const old = thread.querySelector(`[data-id="${id}"]`);
    // An answer in side-by-side columns: the columns are drawn again, with the rest.
    if (old && old.closest(".sbs")) return renderAll();
    if (index < 0 || !old) return;
    const stick = nearBottom();
    const focusKey = focusKeyOf(thread, document.activeElement);
    old.replaceWith(node(state.messages[index], index, context()));
    restoreFocus(thread, focusKey);
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
        if (article && !updateStreamed(article, m)) renderOne(m.id);
      }
      dirty.clear();
      if (stick) scrollToBottom(false);
    });
  }

  /** Older messages drawn above: what was on screen stays where it was. */
  function renderPrepended() {
    const fromBottom = scroll.scrollHeight - scroll.scrollTop;
    const focusKey = focusKeyOf(thread, document.activeElement);
    const ctx = context();
    thread.replaceChildren(...store.state.messages.map((m, i) => node(m, i, ctx)));
    showEarlierButton();
    restoreFocus(thread, focusKey);
    scroll.scrollTop = scroll.scrollHeight - fromBottom;
  }

  return {
    thread,
    scroll,
    earlierButton,
    renderAll,
    renderPrepended,
    renderOne,
    scheduleFrame,
    forget: (id) => dirty.delete(id),
    restoreFocus: (key) => restoreFocus(thread, key),
  };
}

/* Editing a question in place: one message at a time, kept across re-renders; an edit the
 * server refuses opens again with its text. */
function createEditing(store, actions, view) {
  let editing = null; // {id, draft}: the one message being edited
  let submitted = null; // an edit the server has not accepted yet: an error reopens it

  function focusEditArea() {
    const area = view.thread.querySelector(".edit-area");
    if (area) area.focus();
    return area;
  }

  function start(m) {
    editing = { id: m.id, draft: m.content };
    view.renderOne(m.id);
    const area = focusEditArea();
    if (area) {
      area.setSelectionRange(area.value.length, area.value.length);
      area.closest("article").scrollIntoView({ block: "nearest" });
    }
  }

  function end(submit) {
    if (!editing) return;
    const { id, draft } = editing;
    const text = draft.trim();
    if (submit && !text) return;
    editing = null;
    view.renderOne(id);
    if (submit) {
      submitted = { id, draft };
      actions.edit(id, text);
      $("prompt").focus();
    } else {
      const index = store.state.messages.findIndex((m) => m.id === id);
      view.restoreFocus(`${index}:Edit`);
    }
  }

  function reopenRefused(state) {
    if (!submitted || !findMessage(state, submitted.id)) return;
    const { id } = submitted;
    editing = submitted;
    submitted = null;
    view.renderOne(id);
    focusEditArea();
  }

  return {
    current: () => editing,
    start,
    end,
    reopenRefused,
    cancel: () => (editing = null),
    accepted: () => (submitted = null),
    /** Before the whole thread is drawn: an edit of a message no longer shown is dropped. */
    dropStale(state) {
      if (editing && !findMessage(state, editing.id)) editing = null;
    },
  };
}

export function createThreadView(store, actions, { confirm }) {
  const view = createRenderer(store, messageContext);
  const edits = createEditing(store, actions, view);
  let models = []; // the picker's, for "Regenerate with…"

  function messageContext() {
    return {
      busy: isBusy(store.state),
      sending: store.state.sending,
      // A temporary chat is never kept: no rating, no permanent copy.
      temporary: Boolean(store.state.conversation && store.state.conversation.temporary),
      actions,
      editing: edits.current(),
      startEdit: edits.start,
      endEdit: edits.end,
      confirmDeleteMessage,
      isLast: false,
      models,
    };
  }

  function renderAll() {
    edits.dropStale(store.state);
    view.renderAll();
  }

  async function confirmDeleteMessage(m) {
    const ok = await confirm("Delete this message?", "The message and every reply below it, in all branches, will be deleted.");
    if (ok) actions.deleteMessage(m.id);
  }

  // The thread comes newest first: older pages load on scrolling near the top (or the button).
  let asked = null; // the message an earlier page was asked before, until it comes
  function loadEarlier() {
    const first = store.state.messages[0];
    if (!first || store.state.earlier <= 0 || asked === first.id) return;
    asked = first.id;
    actions.loadEarlier();
  }
  view.scroll.addEventListener("scroll", () => {
    if (view.scroll.scrollTop < 300) loadEarlier();
  }, { passive: true });
  view.earlierButton.addEventListener("click", loadEarlier);

  store.subscribe((state, action) => {
    switch (action.type) {
      case "show":
        asked = null;
        edits.cancel();
        renderAll();
        break;
      case "earlier":
        asked = null;
        view.renderPrepended();
        break;
      case "full_text":
        view.renderOne(action.id);
        break;
      case "thread":
        asked = null;
        edits.accepted();
        renderAll();
        break;
      case "error":
        edits.reopenRefused(state);
        break;
      case "started":
        view.renderOne(action.message_id);
        break;
      case "delta":
        view.scheduleFrame(action.message_id);
        break;
      case "finished":
        view.forget(action.message.id);
        // The last answer done: every message's buttons come back, so draw them all again.
        if (isBusy(state)) view.renderOne(action.message.id);
        else renderAll();
        announceFinished(view.thread, findMessage(state, action.message.id) || action.message); // the event has no role
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
      if (last && !isBusy(state)) edits.start(last);
    },
    isEditing: () => edits.current() !== null,
    setModels(list) {
      models = list;
      renderAll();
    },
  };
}
