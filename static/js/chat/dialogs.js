/* Modal dialogs: the delete confirmation and the keyboard shortcuts help. Each gives the focus
 * back to where it was when it closes. */

import { $ } from "./dom.js";
import { SHORTCUTS, chordKeys } from "./shortcuts.js";

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

function keysCell(shortcut) {
  const cell = document.createElement("td");
  shortcut.chords.forEach((chord, i) => {
    if (i > 0) cell.append(shortcut.joiner ?? " or ");
    chordKeys(chord).forEach((name, j) => {
      if (j > 0) cell.append(" + ");
      const kbd = document.createElement("kbd");
      kbd.textContent = name;
      cell.append(kbd);
    });
  });
  if (shortcut.where) cell.append(` ${shortcut.where}`);
  return cell;
}

/* Fills the help dialog's table from the one list of shortcuts. */
export function renderHelp() {
  const rows = SHORTCUTS.map((shortcut) => {
    const action = document.createElement("td");
    action.textContent = shortcut.action;
    const row = document.createElement("tr");
    row.append(keysCell(shortcut), action);
    return row;
  });
  $("shortcut-rows").replaceChildren(...rows);
}

export function openHelp() {
  const dialog = $("help-dialog");
  if (!dialog.open) showModal(dialog);
}

export const anyDialogOpen = () => document.querySelector("dialog[open]") !== null;
