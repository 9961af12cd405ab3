/* "Share": a read-only link to a copy of the open conversation's visible branch. */

import { $, api, copyText, toast } from "../dom.js";
import { focusOrMenu } from "../header.js";
import { workspace } from "./state.js";

export function installShare(store, actions) {
  const dialog = $("share-dialog");
  const button = $("share-open");

  function render() {
    const c = store.state.conversation;
    button.disabled = !c || c.temporary || store.state.messages.length === 0;
  }

  button.addEventListener("click", async () => {
    const c = store.state.conversation;
    if (!c) return;
    let share;
    try {
      share = (await api(`/chat/conversations/${c.id}/share/`, { method: "POST", body: {} })).share;
    } catch (err) {
      toast(err.message);
      return;
    }
    $("share-url").value = share.url;
    $("share-who").textContent = workspace.allowPublicShares
      ? "Anyone with this link can read the conversation."
      : "Anyone signed in to this site with this link can read the conversation.";
    const opener = button;
    dialog.addEventListener("close", () => focusOrMenu(opener), { once: true });
    dialog.showModal();
    $("share-url").select();
  });
  $("share-copy").addEventListener("click", (e) => copyText($("share-url").value, e.currentTarget));

  store.subscribe((state, action) => {
    if (["show", "thread", "conversation", "finished"].includes(action.type)) render();
  });
  render();
}
