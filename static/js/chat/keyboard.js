/* Page-wide keyboard shortcuts, following the ones ChatGPT users know. Which keys do what is
 * listed in shortcuts.js, which the help dialog (?) shows too. */

import { $ } from "./dom.js";
import { anyDialogOpen, openHelp } from "./dialogs.js";
import { pageShortcutFor } from "./shortcuts.js";
import { isBusy } from "./store.js";

export function installShortcuts(store, { actions, sidebar, header, thread, newChat }) {
  const commands = {
    stopAnswer(e) {
      if (isBusy(store.state) && !thread.isEditing()) {
        e.preventDefault();
        actions.stop();
        $("prompt").focus();
      } else if (sidebar.isOpen()) {
        sidebar.close();
      }
    },
    focusPrompt(e) {
      e.preventDefault();
      $("prompt").focus();
    },
    newChat(e) {
      e.preventDefault();
      newChat();
    },
    searchChats(e) {
      e.preventDefault();
      sidebar.focusSearch();
    },
    deleteChat(e) {
      e.preventDefault();
      header.deleteConversation();
    },
    help(e) {
      e.preventDefault();
      openHelp();
    },
  };

  document.addEventListener("keydown", (e) => {
    if (e.defaultPrevented || e.isComposing) return;
    if (anyDialogOpen()) return; // the dialog's own keys (Esc closes it) and nothing else
    const shortcut = pageShortcutFor(e);
    if (shortcut) commands[shortcut.command](e);
  });
}
