/* The sidebar's organisation: pinned conversations first, then one level of folders, then
 * the rest. A conversation moves by drag-and-drop onto a group, or from the keyboard through
 * its "Organise" dialog (pin, folder, archive). Searching, and the archive view, show a flat
 * list; an archived conversation found by search is marked and can be restored. */

import { api, toast, announce } from "../dom.js";
import { workspace } from "./state.js";

const DOTS = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><circle cx="5" cy="12" r="1.3"/><circle cx="12" cy="12" r="1.3"/><circle cx="19" cy="12" r="1.3"/></svg>';
const PENCIL = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M4 20h4L19 9l-4-4L4 16z"/></svg>';
const CROSS = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M6 6l12 12M18 6 6 18"/></svg>';

let ctx = null; // { actions, onOrganise(c), onFolderRename(f), onFolderDelete(f) }

export function setOrganiseContext(value) {
  ctx = value;
}

/** Change one conversation's place (``{pinned?, folder_id?, archived?}``) and reload the list. */
export async function organise(id, fields, said) {
  try {
    await api(`/chat/conversations/${id}/organise/`, { body: fields });
    if (said) announce(said);
  } catch (err) {
    toast(err.message);
  }
  ctx.actions.refreshConversations();
}

function iconButton(label, icon, className, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.setAttribute("aria-label", label);
  b.title = label;
  b.innerHTML = icon;
  b.addEventListener("click", onClick);
  return b;
}

/* A conversation's row with the workspace's additions: a checkbox for bulk actions (shown
 * while selecting), its "Organise" button, drag-and-drop, and an archive mark. */
function decorate(li, c) {
  li.dataset.id = c.id;
  li.className = "conversation-item";
  li.draggable = !c.archived;
  li.addEventListener("dragstart", (e) => {
    e.dataTransfer.setData("text/plain", String(c.id));
    e.dataTransfer.effectAllowed = "move";
    li.classList.add("dragging");
  });
  li.addEventListener("dragend", () => li.classList.remove("dragging"));
  const box = document.createElement("input");
  box.type = "checkbox";
  box.className = "select-box";
  box.setAttribute("aria-label", `Select “${c.title}”`);
  box.checked = workspace.selected.has(c.id);
  box.addEventListener("change", () => {
    if (box.checked) workspace.selected.add(c.id);
    else workspace.selected.delete(c.id);
    ctx.onSelection();
  });
  li.prepend(box);
  const link = li.querySelector("a");
  if (c.archived) {
    const mark = document.createElement("span");
    mark.className = "archived-mark";
    mark.textContent = "Archived";
    link.querySelector(".conversation-meta").prepend(mark, " · ");
  }
  li.append(iconButton(`Organise “${c.title}”`, DOTS, "item-options", () => ctx.onOrganise(c)));
  return li;
}

function dropTarget(el, fields, label) {
  el.addEventListener("dragover", (e) => {
    e.preventDefault();
    e.dataTransfer.dropEffect = "move";
    el.classList.add("drop-over");
  });
  el.addEventListener("dragleave", (e) => {
    if (!el.contains(e.relatedTarget)) el.classList.remove("drop-over");
  });
  el.addEventListener("drop", (e) => {
    e.preventDefault();
    el.classList.remove("drop-over");
    const id = Number(e.dataTransfer.getData("text/plain"));
    if (id) organise(id, fields, `Moved to ${label}.`);
  });
}

function groupNode(key, title, items, fields, folder) {
  const group = document.createElement("li");
  group.className = "conv-group";
  group.dataset.group = key;
  const head = document.createElement("div");
  head.className = "group-head";
  const list = document.createElement("ul");
  list.className = "conversation-list group-items";
  list.id = `group-${key.replace(":", "-")}`;
  if (folder) {
    const open = !workspace.collapsed.has(folder.id);
    const toggle = document.createElement("button");
    toggle.type = "button";
    toggle.className = "group-toggle";
    toggle.setAttribute("aria-expanded", String(open));
    toggle.setAttribute("aria-controls", list.id);
    toggle.textContent = `${title} (${items.length})`;
    toggle.addEventListener("click", () => {
      if (open) workspace.collapsed.add(folder.id);
      else workspace.collapsed.delete(folder.id);
      ctx.actions.refreshConversations();
    });
    list.hidden = !open;
    head.append(
      toggle,
      iconButton(`Rename folder “${title}”`, PENCIL, "group-action", () => ctx.onFolderRename(folder)),
      iconButton(`Delete folder “${title}”`, CROSS, "group-action", () => ctx.onFolderDelete(folder))
    );
  } else {
    const label = document.createElement("span");
    label.className = "group-title";
    label.id = `${list.id}-title`;
    label.textContent = title;
    list.setAttribute("aria-labelledby", label.id);
    head.append(label);
  }
  list.append(...items);
  if (folder && !items.length) {
    const hint = document.createElement("li");
    hint.className = "group-empty";
    hint.textContent = "Empty: drag chats here or use a chat's Organise button.";
    list.append(hint);
  }
  group.append(head, list);
  dropTarget(group, fields, title);
  return group;
}

/** The sidebar list's items: groups, or a flat list while searching or showing the archive.
 * ``makeItem(c)`` is the chat's own row (a <li> with the conversation's link). */
export function groupedItems(state, makeItem) {
  const item = (c) => decorate(makeItem(c), c);
  if (state.query || workspace.archivedView) return state.conversations.map(item);
  const pinned = state.conversations.filter((c) => c.pinned);
  const byFolder = new Map(workspace.folders.map((f) => [f.id, []]));
  const loose = [];
  for (const c of state.conversations) {
    if (!c.pinned) (byFolder.get(c.folder_id) || loose).push(c);
  }
  if (!pinned.length && !workspace.folders.length) return loose.map(item);
  const groups = [];
  if (pinned.length) groups.push(groupNode("pinned", "Pinned", pinned.map(item), { pinned: true }));
  for (const f of workspace.folders) {
    const fields = { folder_id: f.id, pinned: false };
    groups.push(groupNode(`folder:${f.id}`, f.name, byFolder.get(f.id).map(item), fields, f));
  }
  groups.push(groupNode("loose", "Chats", loose.map(item), { folder_id: null, pinned: false }));
  return groups;
}
