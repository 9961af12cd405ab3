/* Thumbs up or down on an answer, with an optional reason asked in a small dialog. Pressing
 * the chosen thumb again takes the rating back. The server tells every tab showing the
 * conversation, which draws the thread again with the rating. */

import { $, api, announce, toast } from "../dom.js";

const THUMB_UP = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M7 11v9H4v-9zM7 11l4-8a2 2 0 0 1 2 2v4h5.5a2 2 0 0 1 2 2.3l-1.2 7A2 2 0 0 1 17.3 20H7"/></svg>';
const THUMB_DOWN = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M17 13V4h3v9zM17 13l-4 8a2 2 0 0 1-2-2v-4H5.5a2 2 0 0 1-2-2.3l1.2-7A2 2 0 0 1 6.7 4H17"/></svg>';

function askReason(value) {
  const dialog = $("rating-dialog");
  const reason = $("rating-reason");
  reason.value = "";
  $("rating-title").textContent = value > 0 ? "What was good about this answer?" : "What was wrong with this answer?";
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "send" ? reason.value.trim() : ""), {
      once: true,
    });
    dialog.showModal();
    reason.focus();
  });
}

async function rate(m, value, opener) {
  const current = m.rating ? m.rating.value : 0;
  const next = current === value ? 0 : value;
  const reason = next ? await askReason(next) : "";
  try {
    await api(`/chat/messages/${m.id}/rate/`, { body: { value: next, reason } });
    announce(next === 0 ? "Rating removed." : next > 0 ? "Rated good." : "Rated bad.");
  } catch (err) {
    toast(err.message);
  }
  if (opener.isConnected) opener.focus();
}

/** The two thumbs of a finished answer (``index`` names them for focus after a re-render). */
export function ratingNode(m, index) {
  const wrap = document.createElement("div");
  wrap.className = "msg-rating";
  wrap.setAttribute("role", "group");
  wrap.setAttribute("aria-label", "Rate this answer");
  for (const [value, label, icon] of [
    [1, "Good answer", THUMB_UP],
    [-1, "Bad answer", THUMB_DOWN],
  ]) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "action rate-btn";
    b.setAttribute("aria-label", label);
    b.title = label;
    b.innerHTML = icon;
    const pressed = Boolean(m.rating && m.rating.value === value);
    b.setAttribute("aria-pressed", String(pressed));
    if (pressed && m.rating.reason) b.title = `${label}: ${m.rating.reason}`;
    b.dataset.focusKey = `${index}:${label}`;
    b.addEventListener("click", (e) => rate(m, value, e.currentTarget));
    wrap.append(b);
  }
  return wrap;
}
