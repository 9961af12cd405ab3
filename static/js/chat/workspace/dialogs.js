/* The workspace's dialogs: organise one conversation (pin, folder, archive) and name a folder.
 * Native modal dialogs: the focus stays inside, Esc closes, and it returns where it was. */

import { $, api, toast, announce } from "../dom.js";
import { organise } from "./organise.js";
import { workspace } from "./state.js";

function openModal(dialog) {
  const opener = document.activeElement;
  dialog.addEventListener(
    "close",
    () => {
      // The row that opened it may have been drawn again meanwhile: find its twin.
      const key = opener && opener.getAttribute && opener.getAttribute("aria-label");
      const again = opener && opener.isConnected ? opener : key && document.querySelector(`[aria-label="${CSS.escape(key)}"]`);
      (again || $("prompt")).focus();
    },
    { once: true }
  );
  dialog.showModal();
}

/** Options of a folder <select>: "No folder" and the user's folders. */
export function fillFolderSelect(select, current, noneLabel = "No folder") {
  const none = new Option(noneLabel, "");
  select.replaceChildren(none, ...workspace.folders.map((f) => new Option(f.name, String(f.id))));
  select.value = current ? String(current) : "";
}

export function createOrganiseDialog() {
  const dialog = $("organise-dialog");
  const select = $("organise-folder");
  let current = null;

  function label() {
    $("organise-pin").textContent = current.pinned ? "Unpin" : "Pin";
    $("organise-archive").textContent = current.archived ? "Restore" : "Archive";
  }

  $("organise-move").addEventListener("click", async () => {
    const folderId = select.value ? Number(select.value) : null;
    const name = select.options[select.selectedIndex].text;
    current = { ...current, folder_id: folderId, pinned: false };
    await organise(current.id, { folder_id: folderId, pinned: false }, folderId ? `Moved to ${name}.` : "Moved out of its folder.");
    dialog.close();
  });
  $("organise-pin").addEventListener("click", async () => {
    current = { ...current, pinned: !current.pinned };
    label();
    await organise(current.id, { pinned: current.pinned }, current.pinned ? "Pinned." : "Unpinned.");
  });
  $("organise-archive").addEventListener("click", async () => {
    const archived = !current.archived;
    await organise(current.id, { archived }, archived ? "Archived: find it by search or under Archived." : "Restored.");
    dialog.close();
  });

  return function open(c) {
    current = { ...c };
    $("organise-name").textContent = c.title;
    fillFolderSelect(select, c.folder_id);
    label();
    openModal(dialog);
  };
}

/** Asks for a folder name; resolves to it, or null when cancelled. */
export function askFolderName(title, initial = "") {
  const dialog = $("folder-dialog");
  const input = $("folder-name");
  // Enter in the field saves (the form's default button would be Cancel, the first one).
  input.onkeydown = (e) => {
    if (e.key === "Enter" && !e.isComposing) {
      e.preventDefault();
      dialog.close("save");
    }
  };
  $("folder-dialog-title").textContent = title;
  input.value = initial;
  return new Promise((resolve) => {
    dialog.returnValue = "";
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "save" && input.value.trim() ? input.value.trim() : null),
      { once: true }
    );
    openModal(dialog);
    input.focus();
    input.select();
  });
}

export async function reloadFolders(actions) {
  try {
    workspace.folders = (await api("/chat/folders/")).folders;
  } catch (err) {
    /* the next change retries */
  }
  actions.refreshConversations();
}

export function createFolderCommands(actions, confirm) {
  async function create() {
    const name = await askFolderName("New folder");
    if (!name) return;
    try {
      await api("/chat/folders/new/", { body: { name } });
      announce(`Folder ${name} created.`);
    } catch (err) {
      toast(err.message);
    }
    await reloadFolders(actions);
  }
  async function rename(folder) {
    const name = await askFolderName("Rename folder", folder.name);
    if (!name || name === folder.name) return;
    try {
      await api(`/chat/folders/${folder.id}/rename/`, { body: { name } });
    } catch (err) {
      toast(err.message);
    }
    await reloadFolders(actions);
  }
  async function remove(folder) {
    const ok = await confirm(`Delete the folder “${folder.name}”?`, "Its chats are kept, outside any folder.");
    if (!ok) return;
    try {
      await api(`/chat/folders/${folder.id}/delete/`, { method: "POST", body: {} });
      announce(`Folder ${folder.name} deleted.`);
    } catch (err) {
      toast(err.message);
    }
    await reloadFolders(actions);
  }
  return { create, rename, remove };
}
