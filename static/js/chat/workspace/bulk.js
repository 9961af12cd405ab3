/* Selecting several conversations in the sidebar and archiving, restoring, moving or deleting
 * them at once. "Select" shows a checkbox on each row; the bar counts and acts on them. */

import { $, api, toast, announce } from "../dom.js";
import { fillFolderSelect } from "./dialogs.js";
import { workspace } from "./state.js";

export function createBulk(store, actions, confirm) {
  const bar = $("bulk-bar");
  const toggle = $("select-toggle");
  const sidebar = $("sidebar");

  function update() {
    const n = workspace.selected.size;
    $("bulk-count").textContent = `${n} selected`;
    for (const id of ["bulk-archive", "bulk-restore", "bulk-move", "bulk-delete"]) $(id).disabled = n === 0;
    $("bulk-archive").hidden = workspace.archivedView;
    $("bulk-restore").hidden = !workspace.archivedView;
  }

  function setSelecting(on) {
    workspace.selecting = on;
    if (!on) workspace.selected.clear();
    sidebar.classList.toggle("selecting", on);
    toggle.setAttribute("aria-pressed", String(on));
    toggle.textContent = on ? "Done" : "Select";
    bar.hidden = !on;
    fillFolderSelect($("bulk-folder"), null, "Out of folders");
    sidebar.querySelectorAll(".select-box").forEach((box) => (box.checked = false));
    update();
  }

  async function run(action, extra = {}) {
    const ids = [...workspace.selected];
    if (!ids.length) return;
    try {
      const data = await api("/chat/conversations/bulk/", { body: { action, ids, ...extra } });
      announce(`${data.changed} chat${data.changed === 1 ? "" : "s"}: ${action} done.`);
      if (action === "delete" && ids.includes(store.state.conversationId)) actions.show(null, true);
    } catch (err) {
      toast(err.message);
    }
    workspace.selected.clear();
    sidebar.querySelectorAll(".select-box").forEach((box) => (box.checked = false));
    update();
    actions.refreshConversations();
  }

  toggle.addEventListener("click", () => setSelecting(!workspace.selecting));
  $("bulk-archive").addEventListener("click", () => run("archive"));
  $("bulk-restore").addEventListener("click", () => run("restore"));
  $("bulk-move").addEventListener("click", () => {
    const value = $("bulk-folder").value;
    run("move", { folder_id: value ? Number(value) : null });
  });
  $("bulk-delete").addEventListener("click", async () => {
    const n = workspace.selected.size;
    if (n && (await confirm(`Delete ${n} chat${n === 1 ? "" : "s"}?`, "They and all their messages will be deleted."))) run("delete");
  });
  return { update, setSelecting };
}
