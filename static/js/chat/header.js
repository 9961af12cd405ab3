/* The conversation header: its title and rename, the settings panel, and the menu with export
 * links and delete. */

import { $, toast } from "./dom.js";
import { confirm } from "./dialogs.js";

const SETTINGS = ["system_prompt", "temperature", "top_p", "top_k", "max_tokens"];

export function createHeader(store, actions) {
  const title = $("conversation-title");
  const renameBtn = $("rename");
  const renameForm = $("rename-form");
  const renameInput = $("rename-input");
  const panel = $("settings-panel");
  const settingsToggle = $("settings-toggle");
  const form = $("settings-form");
  const saved = $("settings-saved");
  const menuBtn = $("conversation-menu-toggle");
  const menu = $("conversation-menu");

  function render() {
    const c = store.state.conversation;
    title.textContent = c ? c.title : "New chat";
    document.title = c ? `${c.title} · Chat` : "Chat";
    renameBtn.disabled = !c;
    menuBtn.disabled = !c;
    if (c) {
      $("export-json").href = `/conversations/${c.id}/export.json`;
      $("export-md").href = `/conversations/${c.id}/export.md`;
      fillSettings(c);
    } else {
      closeMenu(false);
      panel.hidden = true;
      settingsToggle.setAttribute("aria-expanded", "false");
    }
  }

  function fillSettings(c) {
    if (panel.contains(document.activeElement)) return;
    for (const name of SETTINGS) form.elements[name].value = c[name];
  }

  // Rename ------------------------------------------------------------------------------
  function startRename() {
    if (!store.state.conversation) return;
    renameInput.value = store.state.conversation.title;
    title.hidden = true;
    renameForm.hidden = false;
    renameInput.focus();
    renameInput.select();
  }
  function endRename() {
    renameForm.hidden = true;
    title.hidden = false;
    renameBtn.focus();
  }
  renameBtn.addEventListener("click", startRename);
  $("rename-cancel").addEventListener("click", endRename);
  renameInput.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.stopPropagation();
      endRename();
    }
  });
  renameForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const value = renameInput.value.trim();
    if (!value || !store.state.conversation) return;
    try {
      await actions.updateConversation({ title: value });
      endRename();
    } catch (err) {
      toast(err.message);
    }
  });

  // Settings ----------------------------------------------------------------------------
  async function toggleSettings() {
    const opening = panel.hidden;
    if (opening) {
      try {
        await actions.ensureConversation();
      } catch (err) {
        toast(err.message);
        return;
      }
    }
    panel.hidden = !opening;
    settingsToggle.setAttribute("aria-expanded", String(opening));
    saved.textContent = "";
    if (opening) {
      fillSettings(store.state.conversation);
      form.elements.system_prompt.focus();
    } else {
      settingsToggle.focus();
    }
  }
  settingsToggle.addEventListener("click", toggleSettings);
  $("settings-close").addEventListener("click", toggleSettings);
  panel.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.stopPropagation();
      toggleSettings();
    }
  });
  let savedTimer;
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!store.state.conversation) return;
    const f = form.elements;
    const body = { system_prompt: f.system_prompt.value };
    for (const name of SETTINGS.slice(1)) body[name] = Number(f[name].value);
    try {
      await actions.updateConversation(body);
      saved.textContent = "Saved";
      // A save soon after another must not have its notice wiped by the earlier timer.
      clearTimeout(savedTimer);
      savedTimer = setTimeout(() => (saved.textContent = ""), 2500);
    } catch (err) {
      const errors = err.data && err.data.errors;
      const first = errors && Object.entries(errors)[0];
      toast(first ? `${first[0].replace("_", " ")}: ${first[1][0].message}` : err.message, "invalid");
    }
  });

  // The conversation menu (a disclosure: links and one button, reached with Tab) -------------
  function openMenu() {
    menu.hidden = false;
    menuBtn.setAttribute("aria-expanded", "true");
    menu.querySelector("a, button").focus();
  }
  function closeMenu(returnFocus = true) {
    if (menu.hidden) return;
    menu.hidden = true;
    menuBtn.setAttribute("aria-expanded", "false");
    if (returnFocus) menuBtn.focus();
  }
  menuBtn.addEventListener("click", () => (menu.hidden ? openMenu() : closeMenu()));
  menu.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.stopPropagation();
      closeMenu();
    }
  });
  document.addEventListener("click", (e) => {
    if (!menu.hidden && !menu.contains(e.target) && !menuBtn.contains(e.target)) closeMenu(false);
  });
  menu.addEventListener("focusout", (e) => {
    if (e.relatedTarget && !menu.contains(e.relatedTarget) && e.relatedTarget !== menuBtn) closeMenu(false);
  });

  async function deleteConversation() {
    const c = store.state.conversation;
    if (!c) return;
    closeMenu(false);
    const ok = await confirm("Delete this chat?", `“${c.title}” and all its messages will be deleted.`);
    if (!ok) return;
    try {
      await actions.deleteConversation();
      $("prompt").focus();
    } catch (err) {
      toast(err.message);
    }
  }
  $("delete-conversation").addEventListener("click", deleteConversation);

  store.subscribe((state, action) => {
    if (["show", "thread", "conversation", "title"].includes(action.type)) render();
  });
  render();
  return { deleteConversation, toggleSettings };
}
