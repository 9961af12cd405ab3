/* The chat page: builds the store, the actions and the views, and wires them together.
 * Module layout and data flow: docs/interfaces.md ("Browser UI"). */

import { $, toast } from "./dom.js";
import { createActions } from "./actions.js";
import { installAttachments } from "./attachments.js";
import { createComposer } from "./composer.js";
import { confirm, openHelp, renderHelp } from "./dialogs.js";
import { createHeader } from "./header.js";
import { installModelPicker } from "./models.js";
import { installShortcuts } from "./keyboard.js";
import { createSidebar } from "./sidebar.js";
import { createStore, initialState } from "./store.js";
import { createThreadView } from "./thread.js";
import { installWorkspace } from "./workspace/index.js";

const boot = JSON.parse($("chat-state").textContent);
const store = createStore(initialState(boot));
const actions = createActions(store, boot);
const thread = createThreadView(store, actions, { confirm });
const composer = createComposer(store, actions, { editLast: thread.editLast });
const sidebar = createSidebar(store, actions);
const header = createHeader(store, actions);
const picker = installModelPicker(store, actions, boot);
thread.setModels(picker.models);

async function newChat() {
  try {
    await actions.newChat();
  } catch (err) {
    toast(err.message);
  }
  sidebar.close(false);
  composer.focus();
}

$("new-chat").addEventListener("click", newChat);
renderHelp();
$("help-open").addEventListener("click", openHelp);
store.subscribe((state, action) => {
  if (action.type === "connection") {
    $("connection").textContent = state.connection;
    $("connection").hidden = !state.connection;
  }
});
window.addEventListener("popstate", () => {
  const match = location.pathname.match(/^\/c\/(\d+)\/$/);
  actions.openConversation(match ? Number(match[1]) : null, false);
});
installShortcuts(store, { actions, sidebar, header, thread, newChat });
installWorkspace(store, actions, boot, { confirm });
installAttachments(store, actions);

actions.show(store.state.conversationId, false);
composer.update();
composer.focus();
