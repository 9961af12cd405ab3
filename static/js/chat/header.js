/* The conversation header: its title and rename, the settings panel, and the menu with export
 * links and delete. */

import { $, toast } from "./dom.js";
import { confirm } from "./dialogs.js";

const SETTINGS = ["system_prompt", "temperature", "top_p", "top_k", "max_tokens"];
// Tools through MCP: on for this conversation, and ask before each call.
const SWITCHES = ["tools_enabled", "tools_approval"];

/* Rename in place: the title gives way to a text field until it is saved or cancelled. */
function installRename(store, actions) {
  const title = $("conversation-title");
  const renameBtn = $("rename");
  const renameForm = $("rename-form");
  const renameInput = $("rename-input");

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
    focusOrMenu(renameBtn);
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
}

function settingsError(err) {
  const errors = err.data && err.data.errors;
  const first = errors && Object.entries(errors)[0];
  return first ? `${first[0].replace("_", " ")}: ${first[1][0].message}` : err.message;
}

/* The conversation's settings (system prompt and sampling), in a panel that opens below the header. */
function createSettingsPanel(store, actions) {
  const panel = $("settings-panel");
  const settingsToggle = $("settings-toggle");
  const form = $("settings-form");
  const saved = $("settings-saved");
  let savedTimer;

  function fill(c) {
    if (panel.contains(document.activeElement)) return;
    for (const name of SETTINGS) form.elements[name].value = c[name];
    for (const name of SWITCHES) form.elements[name].checked = Boolean(c[name]);
  }

  function hide() {
    panel.hidden = true;
    settingsToggle.setAttribute("aria-expanded", "false");
  }

  async function toggle() {
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
      fill(store.state.conversation);
      form.elements.system_prompt.focus();
    } else {
      settingsToggle.focus();
    }
  }

  async function save() {
    if (!store.state.conversation) return;
    const f = form.elements;
    const body = { system_prompt: f.system_prompt.value };
    for (const name of SETTINGS.slice(1)) body[name] = Number(f[name].value);
    for (const name of SWITCHES) body[name] = f[name].checked;
    try {
      await actions.updateConversation(body);
      saved.textContent = "Saved";
      // A save soon after another must not have its notice wiped by the earlier timer.
      clearTimeout(savedTimer);
      savedTimer = setTimeout(() => (saved.textContent = ""), 2500);
    } catch (err) {
      toast(settingsError(err), "invalid");
    }
  }

  settingsToggle.addEventListener("click", toggle);
  $("settings-close").addEventListener("click", toggle);
  panel.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.stopPropagation();
      toggle();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    save();
  });
  return { fill, hide, toggle };
}

/* The conversation's rarer actions (rename, share, export, delete) behind one button, so the
 * title keeps its room on a phone: a disclosure of buttons and links, opened with the button
 * (or ArrowDown on it), walked with the arrow keys, Home and End, shut with Escape. */
function createConversationMenu() {
  const menuBtn = $("conversation-menu-toggle");
  const menu = $("conversation-menu");
  const items = () => [...menu.querySelectorAll("a, button")].filter((el) => !el.disabled);

  function open(at = 0) {
    menu.hidden = false;
    menuBtn.setAttribute("aria-expanded", "true");
    const list = items();
    if (list.length) list[(at + list.length) % list.length].focus();
  }
  function close(returnFocus = true) {
    if (menu.hidden) return;
    menu.hidden = true;
    menuBtn.setAttribute("aria-expanded", "false");
    if (returnFocus) menuBtn.focus();
  }
  menuBtn.addEventListener("click", () => (menu.hidden ? open() : close()));
  menuBtn.addEventListener("keydown", (e) => {
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      open(e.key === "ArrowDown" ? 0 : -1);
    }
  });
  menu.addEventListener("keydown", (e) => {
    const list = items();
    const at = list.indexOf(document.activeElement);
    const moves = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: list.length - 1 };
    if (e.key in moves && list.length) {
      e.preventDefault();
      list[(moves[e.key] + list.length) % list.length].focus();
    } else if (e.key === "Escape") {
      e.stopPropagation();
      close();
    }
  });
  // An item's action takes over (a dialog, the rename field, a download): the menu shuts.
  menu.addEventListener("click", (e) => {
    if (e.target.closest("a, button")) close(false);
  });
  document.addEventListener("click", (e) => {
    if (!menu.hidden && !menu.contains(e.target) && !menuBtn.contains(e.target)) close(false);
  });
  menu.addEventListener("focusout", (e) => {
    if (e.relatedTarget && !menu.contains(e.relatedTarget) && e.relatedTarget !== menuBtn) close(false);
  });
  return { close };
}

/** Focus ``element``, or the "More actions" button when it sits in the shut menu. */
export function focusOrMenu(element) {
  (element.checkVisibility() ? element : $("conversation-menu-toggle")).focus();
}

export function createHeader(store, actions) {
  const title = $("conversation-title");
  installRename(store, actions);
  const settings = createSettingsPanel(store, actions);
  const menu = createConversationMenu();

  function render() {
    const c = store.state.conversation;
    title.textContent = c ? c.title : "New chat";
    document.title = c ? `${c.title} · Chat` : "Chat";
    $("rename").disabled = !c;
    $("conversation-menu-toggle").disabled = !c;
    if (c) {
      $("export-json").href = `/conversations/${c.id}/export.json`;
      $("export-md").href = `/conversations/${c.id}/export.md`;
      settings.fill(c);
    } else {
      menu.close(false);
      settings.hide();
    }
  }

  async function deleteConversation() {
    const c = store.state.conversation;
    if (!c) return;
    menu.close(false);
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
  return { deleteConversation, toggleSettings: settings.toggle };
}
