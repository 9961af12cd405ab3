/* Page-wide keyboard shortcuts, following the ones ChatGPT users know. The list shown by the
 * help dialog (?) is in templates/conversations/chat.html; keep the two in step. */

import { $ } from "./dom.js";
import { anyDialogOpen, openHelp } from "./dialogs.js";
import { isBusy } from "./store.js";

function typingIn(target) {
  return target instanceof HTMLElement && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
}

export function installShortcuts(store, { actions, sidebar, header, thread, newChat }) {
  document.addEventListener("keydown", (e) => {
    if (e.defaultPrevented || e.isComposing) return;
    const mod = e.ctrlKey || e.metaKey;
    const key = e.key.length === 1 ? e.key.toLowerCase() : e.key;

    if (anyDialogOpen()) return; // the dialog's own keys (Esc closes it) and nothing else

    if (key === "Escape" && e.shiftKey) {
      e.preventDefault();
      $("prompt").focus();
    } else if (key === "Escape") {
      if (isBusy(store.state) && !thread.isEditing()) {
        e.preventDefault();
        actions.stop();
        $("prompt").focus();
      } else if (sidebar.isOpen()) {
        sidebar.close();
      }
    } else if (mod && e.shiftKey && key === "o") {
      e.preventDefault();
      newChat();
    } else if (mod && !e.shiftKey && key === "k") {
      e.preventDefault();
      sidebar.focusSearch();
    } else if (mod && e.shiftKey && key === "Backspace") {
      e.preventDefault();
      header.deleteConversation();
    } else if ((mod && key === "/") || (key === "?" && !mod && !e.altKey && !typingIn(e.target))) {
      e.preventDefault();
      openHelp();
    }
  });
}
