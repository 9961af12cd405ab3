/* Files in the chat: attach by the button, drag-and-drop or paste; each upload's reading
 * progress shows on its chip; a conversation can also draw on a file from the user's library.
 * The conversation's files and its answers' citations come from
 * GET /chat/conversations/<id>/documents/ (re-read when the thread or an answer changes).
 * Private view state only: the chips of the open conversation and their uploads. */

import { $, api, toast, announce } from "./dom.js";
import { drawCitations } from "./citations.js";

const POLL_MS = 500;

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

function buildControls() {
  const form = $("composer");
  const input = el("input", { type: "file", multiple: true, hidden: true, id: "attach-input" });
  const attach = el("button", {
    type: "button", id: "attach", className: "icon-btn attach-btn", title: "Attach files",
  });
  attach.setAttribute("aria-label", "Attach files");
  attach.innerHTML = '<svg viewBox="0 0 24 24" aria-hidden="true"><path d="M8 12.5 14 6.5a3 3 0 0 1 4.2 4.2l-7.4 7.4a5 5 0 0 1-7-7L11 4"/></svg>';
  const library = el("select", { id: "library-select", className: "library-select" });
  library.setAttribute("aria-label", "Add one of your files");
  library.hidden = true;
  const chips = el("ul", { id: "attachments", className: "attachments" });
  chips.setAttribute("aria-label", "Attached files");
  form.prepend(attach, input);
  form.parentElement.insertBefore(chips, form);
  form.parentElement.insertBefore(library, form);
  return { form, input, attach, library, chips };
}

export function installAttachments(store, actions) {
  const ui = buildControls();
  let docs = []; // the open conversation's files, as the server lists them
  let sources = {};
  const uploads = new Map(); // local id -> {filename, error} for uploads not yet listed
  let shownFor = null;

  function chip(d) {
    const item = el("li", { className: `attachment ${d.status}` }, el("span", { className: "name", textContent: d.filename }));
    item.dataset.status = d.status;
    if (d.status === "failed") item.append(el("span", { className: "error", textContent: d.error }));
    else if (d.status !== "ready") {
      const bar = el("progress", { max: 100, value: d.progress || 0 });
      bar.setAttribute("aria-label", `Reading ${d.filename}`);
      item.append(bar);
    }
    if (d.id) {
      const remove = el("button", { type: "button", textContent: "×", title: `Remove ${d.filename}` });
      remove.setAttribute("aria-label", `Remove ${d.filename} from this conversation`);
      remove.addEventListener("click", () => detach(d));
      item.append(remove);
    }
    return item;
  }

  function draw() {
    ui.chips.replaceChildren(...docs.map(chip), ...[...uploads.values()].map(chip));
    drawCitations($("thread"), sources);
  }

  // Aborted when another conversation is shown, so no read outlives the conversation it is for.
  let reading = new AbortController();

  async function refresh() {
    const id = store.state.conversationId;
    if (!id) {
      docs = [];
      sources = {};
      draw();
      return;
    }
    try {
      const data = await api(`/chat/conversations/${id}/documents/`, { signal: reading.signal });
      if (store.state.conversationId !== id) return;
      docs = data.documents;
      sources = data.sources;
      draw();
      if (docs.some((d) => d.status === "pending" || d.status === "extracting")) setTimeout(refresh, POLL_MS);
    } catch (err) {
      /* the next thread event reads it again */
    }
  }

  async function upload(file) {
    const key = `${Date.now()}-${Math.random()}`;
    uploads.set(key, { filename: file.name, status: "pending", progress: 0 });
    draw();
    try {
      const id = await actions.ensureConversation();
      const body = new FormData();
      body.append("file", file);
      body.append("conversation_id", id);
      const response = await fetch("/documents/upload/", {
        method: "POST", body, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
      });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(data.detail || `upload failed (${response.status})`);
      uploads.delete(key);
      announce(`${file.name} attached; reading it.`);
      await refresh();
    } catch (err) {
      uploads.set(key, { filename: file.name, status: "failed", error: err.message });
      toast(err.message, "invalid_file");
      draw();
    }
  }

  async function detach(d) {
    await api(`/chat/conversations/${store.state.conversationId}/documents/${d.id}/detach/`, { method: "POST", body: {} });
    await refresh();
  }

  async function fillLibrary() {
    const data = await api("/documents/").catch(() => ({ documents: [] }));
    const attached = new Set(docs.map((d) => d.id));
    const ready = data.documents.filter((d) => d.status === "ready" && !attached.has(d.id));
    ui.input.accept = (data.accept || []).join(",");
    ui.library.replaceChildren(
      el("option", { value: "", textContent: "Add from your files…" }),
      ...ready.map((d) => el("option", { value: String(d.id), textContent: d.filename }))
    );
    ui.library.hidden = ready.length === 0;
  }

  ui.library.addEventListener("change", async () => {
    const docId = Number(ui.library.value);
    if (!docId) return;
    const id = await actions.ensureConversation();
    await api(`/chat/conversations/${id}/documents/`, { body: { document_id: docId } });
    await refresh();
    fillLibrary();
  });
  ui.attach.addEventListener("click", () => ui.input.click());
  ui.input.addEventListener("change", () => {
    [...ui.input.files].forEach(upload);
    ui.input.value = "";
  });
  const zone = ui.form.parentElement;
  zone.addEventListener("dragover", (e) => {
    if (![...e.dataTransfer.types].includes("Files")) return;
    e.preventDefault();
    ui.form.classList.add("dragging");
  });
  zone.addEventListener("dragleave", () => ui.form.classList.remove("dragging"));
  zone.addEventListener("drop", (e) => {
    ui.form.classList.remove("dragging");
    if (!e.dataTransfer.files.length) return;
    e.preventDefault();
    [...e.dataTransfer.files].forEach(upload);
  });
  $("prompt").addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])];
    if (!files.length) return;
    e.preventDefault();
    files.forEach(upload);
  });

  store.subscribe((state, action) => {
    if (action.type === "show" && state.conversationId !== shownFor) {
      // The conversation left may be on its way out: its reads in flight would come back 404.
      reading.abort();
      reading = new AbortController();
      shownFor = state.conversationId;
      uploads.clear();
      refresh().then(fillLibrary);
    } else if (action.type === "thread" || action.type === "finished") {
      refresh();
    } else if (action.type === "started") {
      drawCitations($("thread"), sources);
    }
  });
  shownFor = store.state.conversationId;
  refresh().then(fillLibrary);
}
