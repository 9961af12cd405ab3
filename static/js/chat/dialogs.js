/* Modal dialogs: the delete confirmation and the keyboard shortcuts help. Each gives the focus
 * back to where it was when it closes. */

import { $ } from "./dom.js";

function showModal(dialog) {
  const opener = document.activeElement;
  dialog.addEventListener(
    "close",
    () => {
      if (opener && opener.isConnected && !opener.disabled && typeof opener.focus === "function") opener.focus();
      else $("prompt").focus();
    },
    { once: true }
  );
  dialog.showModal();
}

export function confirm(title, text, confirmLabel = "Delete") {
  const dialog = $("confirm-dialog");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = confirmLabel;
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true });
    showModal(dialog);
  });
}

export function openHelp() {
  const dialog = $("help-dialog");
  if (!dialog.open) showModal(dialog);
}

export const anyDialogOpen = () => document.querySelector("dialog[open]") !== null;
