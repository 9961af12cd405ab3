/* How a conversation starts: with a preset's settings, or as a temporary chat. A temporary
 * chat is marked by a banner while it shows, and is closed (deleted on the server) as soon as
 * the tab leaves it: another conversation opened, or the page closed. */

import { $, api, announce, toast } from "../dom.js";
import { workspace } from "./state.js";

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

function closeTemporary(id, { beacon = false } = {}) {
  const url = `/chat/conversations/${id}/close/`;
  if (beacon && navigator.sendBeacon) {
    const form = new FormData();
    form.append("csrfmiddlewaretoken", csrfToken());
    navigator.sendBeacon(url, form);
  } else {
    api(url, { method: "POST", body: {} }).catch(() => {});
  }
}

function fillPresets() {
  const select = $("preset-select");
  const own = workspace.presets.filter((p) => !p.site_wide);
  const site = workspace.presets.filter((p) => p.site_wide);
  const group = (label, presets) => {
    const g = document.createElement("optgroup");
    g.label = label;
    g.append(...presets.map((p) => new Option(p.name, String(p.id))));
    return g;
  };
  select.replaceChildren(new Option("Default settings", ""));
  if (own.length) select.append(group("Yours", own));
  if (site.length) select.append(group("Site-wide", site));
  select.value = workspace.next.presetId;
}

export function installStart(store, actions) {
  const toggle = $("temporary-toggle");
  const banner = $("temporary-banner");
  let shown = null; // the conversation on screen: {id, temporary}

  function isEmptyShown() {
    return store.state.conversationId && store.state.messages.length === 0;
  }

  function render() {
    const c = store.state.conversation;
    const temporary = c ? c.temporary : workspace.next.temporary;
    banner.hidden = !temporary;
    document.body.classList.toggle("is-temporary", Boolean(temporary));
    toggle.setAttribute("aria-pressed", String(workspace.next.temporary));
  }

  toggle.addEventListener("click", async () => {
    // Right after "New chat" its conversation may not be shown yet: wait for it, or the empty
    // ordinary conversation would stay behind and take the first message.
    await actions.creationSettled();
    workspace.next.temporary = !workspace.next.temporary;
    // An empty conversation already open would take the first message: start afresh instead.
    // An empty ordinary one ("New chat" just before) is removed, so no empty row stays behind.
    if (isEmptyShown()) {
      const c = store.state.conversation;
      if (workspace.next.temporary && c && !c.temporary && c.title === "New chat") {
        // Left first, so its reads in flight stop before it goes.
        actions.show(null, true);
        actions.deleteConversation(c.id).catch((err) => toast(err.message));
      } else {
        actions.show(null, true);
      }
    }
    announce(workspace.next.temporary ? "Temporary chat on." : "Temporary chat off.");
    render();
  });

  $("preset-select").addEventListener("change", async (e) => {
    workspace.next.presetId = e.target.value;
    const preset = workspace.presets.find((p) => String(p.id) === e.target.value);
    if (preset && isEmptyShown() && store.state.conversation) {
      const { system_prompt, temperature, top_p, top_k, max_tokens } = preset;
      try {
        await actions.updateConversation({ system_prompt, temperature, top_p, top_k, max_tokens });
      } catch (err) {
        toast(err.message);
      }
    }
  });

  store.subscribe((state, action) => {
    if (!["show", "thread", "conversation"].includes(action.type)) return;
    const c = state.conversation;
    if (shown && shown.temporary && shown.id !== state.conversationId) {
      closeTemporary(shown.id);
      shown = null; // closed once: the next event of the switch must not close it again
    }
    if (c && c.id === state.conversationId) shown = { id: c.id, temporary: c.temporary };
    else if (!state.conversationId) shown = null;
    render();
  });
  window.addEventListener("pagehide", () => {
    if (shown && shown.temporary) closeTemporary(shown.id, { beacon: true });
  });
  fillPresets();
  render();
}
