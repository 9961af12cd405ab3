/* The chat UI: a sidebar of conversations, a branching thread streamed over a websocket.
 *
 * Server protocol: see conversations/consumers.py. Answers are Markdown rendered with
 * marked and sanitised with DOMPurify before they touch the DOM; user messages are text.
 */
(() => {
  "use strict";

  const initial = JSON.parse(document.getElementById("chat-state").textContent);
  const $ = (id) => document.getElementById(id);
  const els = {
    app: $("app"),
    sidebar: $("sidebar"),
    scrim: $("scrim"),
    openSidebar: $("open-sidebar"),
    closeSidebar: $("close-sidebar"),
    newChat: $("new-chat"),
    search: $("search"),
    list: $("conversation-list"),
    listEmpty: $("conversation-empty"),
    title: $("conversation-title"),
    renameBtn: $("rename"),
    renameForm: $("rename-form"),
    renameInput: $("rename-input"),
    renameCancel: $("rename-cancel"),
    actions: $("conversation-actions"),
    settingsToggle: $("settings-toggle"),
    settingsPanel: $("settings-panel"),
    settingsForm: $("settings-form"),
    settingsSaved: $("settings-saved"),
    settingsClose: $("settings-close"),
    deleteConversation: $("delete-conversation"),
    scroll: $("thread-scroll"),
    thread: $("thread"),
    empty: $("empty-state"),
    composer: $("composer"),
    prompt: $("prompt"),
    send: $("send"),
    stop: $("stop"),
    connection: $("connection"),
    dialog: $("confirm-dialog"),
    confirmTitle: $("confirm-title"),
    confirmText: $("confirm-text"),
    toast: $("toast"),
  };

  const state = {
    conversationId: initial.conversation_id,
    conversation: null,
    messages: [],
    conversations: initial.conversations || [],
    query: "",
    socket: null,
    socketReady: false,
    reconnectDelay: 500,
    pendingSends: [],
    dirty: new Set(),
    frame: 0,
    editing: null,
    sending: false, // a request is on its way and its thread has not come back yet
  };

  // --- Helpers ----------------------------------------------------------------------
  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  async function api(url, options = {}) {
    const init = { credentials: "same-origin", headers: { Accept: "application/json" }, ...options };
    if (init.body !== undefined) {
      init.method = init.method || "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(init.body);
    }
    if (init.method && init.method !== "GET") init.headers["X-CSRFToken"] = csrfToken();
    const response = await fetch(url, init);
    if (response.status === 401) {
      window.location.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname);
      throw new Error("signed out");
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = new Error(data.detail || `request failed (${response.status})`);
      error.data = data;
      error.status = response.status;
      throw error;
    }
    return data;
  }

  let toastTimer = 0;
  function toast(text) {
    els.toast.textContent = text;
    els.toast.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => (els.toast.hidden = true), 5000);
  }

  function svg(path) {
    return `<svg viewBox="0 0 24 24" aria-hidden="true">${path}</svg>`;
  }
  const ICONS = {
    copy: svg('<rect x="9" y="9" width="11" height="11" rx="2"/><path d="M5 15V6a2 2 0 0 1 2-2h8"/>'),
    check: svg('<path d="m5 12 5 5 9-10"/>'),
    edit: svg('<path d="M4 20h4L19 9l-4-4L4 16z"/><path d="m13.5 6.5 4 4"/>'),
    regenerate: svg('<path d="M20 12a8 8 0 1 1-2.3-5.7"/><path d="M20 4v5h-5"/>'),
    trash: svg('<path d="M5 7h14M10 7V5h4v2M7 7l1 12h8l1-12"/>'),
    prev: svg('<path d="m14 6-6 6 6 6"/>'),
    next: svg('<path d="m10 6 6 6-6 6"/>'),
    bot: svg('<path d="M12 3v3M7 8h10a3 3 0 0 1 3 3v5a3 3 0 0 1-3 3H7a3 3 0 0 1-3-3v-5a3 3 0 0 1 3-3z"/><circle cx="9.5" cy="13" r="1.2"/><circle cx="14.5" cy="13" r="1.2"/>'),
  };

  function button(label, icon, className, onClick, text) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = className;
    b.setAttribute("aria-label", label);
    b.title = label;
    b.innerHTML = icon + (text ? `<span>${text}</span>` : "");
    b.addEventListener("click", onClick);
    return b;
  }

  async function copyText(text, feedbackButton) {
    try {
      if (navigator.clipboard && window.isSecureContext) {
        await navigator.clipboard.writeText(text);
      } else {
        const area = document.createElement("textarea");
        area.value = text;
        area.style.position = "fixed";
        area.style.opacity = "0";
        document.body.appendChild(area);
        area.select();
        document.execCommand("copy");
        area.remove();
      }
      if (feedbackButton) {
        const before = feedbackButton.innerHTML;
        feedbackButton.innerHTML = ICONS.check + (feedbackButton.querySelector("span") ? "<span>Copied</span>" : "");
        feedbackButton.classList.add("copied");
        setTimeout(() => {
          feedbackButton.innerHTML = before;
          feedbackButton.classList.remove("copied");
        }, 1500);
      }
    } catch (err) {
      toast("Could not copy to the clipboard.");
    }
  }

  function timeAgo(iso) {
    const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
    if (seconds < 60) return "just now";
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    if (seconds < 7 * 86400) return `${Math.floor(seconds / 86400)} d ago`;
    return new Date(iso).toLocaleDateString();
  }

  // --- Markdown -------------------------------------------------------------------
  if (window.DOMPurify) {
    DOMPurify.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A" && node.getAttribute("href")) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer nofollow");
      }
    });
  }

  function renderMarkdown(target, text, streaming) {
    let html;
    if (window.marked && window.DOMPurify) {
      html = DOMPurify.sanitize(marked.parse(text || "", { gfm: true, async: false }));
    } else {
      const div = document.createElement("div");
      div.textContent = text || "";
      html = `<p>${div.innerHTML}</p>`;
    }
    target.innerHTML = html;
    decorateCodeBlocks(target, !streaming);
    if (streaming) {
      let spot = target;
      while (spot.lastElementChild && !["BR", "HR", "IMG"].includes(spot.lastElementChild.tagName)) {
        spot = spot.lastElementChild;
      }
      if (spot.tagName === "PRE" && spot.firstElementChild) spot = spot.firstElementChild;
      const cursor = document.createElement("span");
      cursor.className = "cursor";
      cursor.setAttribute("aria-hidden", "true");
      spot.appendChild(cursor);
    }
  }

  function decorateCodeBlocks(root, highlight) {
    root.querySelectorAll("pre > code").forEach((code) => {
      const pre = code.parentElement;
      const lang = (code.className.match(/language-([\w+#-]+)/) || [])[1] || "";
      if (highlight && window.hljs) {
        try {
          hljs.highlightElement(code);
        } catch (err) {
          /* unknown language: leave it plain */
        }
      }
      const wrap = document.createElement("div");
      wrap.className = "code-block";
      const head = document.createElement("div");
      head.className = "code-head";
      const label = document.createElement("span");
      label.textContent = lang || "code";
      head.appendChild(label);
      head.appendChild(
        button("Copy code", ICONS.copy, "code-copy", (e) => copyText(code.textContent, e.currentTarget), "Copy")
      );
      pre.replaceWith(wrap);
      wrap.appendChild(head);
      wrap.appendChild(pre);
    });
  }

  // --- Sidebar --------------------------------------------------------------------
  function renderConversations() {
    els.list.innerHTML = "";
    for (const c of state.conversations) {
      const li = document.createElement("li");
      const a = document.createElement("a");
      a.href = `/c/${c.id}/`;
      a.className = "conversation-link" + (c.id === state.conversationId ? " active" : "");
      if (c.id === state.conversationId) a.setAttribute("aria-current", "page");
      a.dataset.id = c.id;
      const title = document.createElement("span");
      title.className = "conversation-name";
      title.textContent = c.title;
      const meta = document.createElement("span");
      meta.className = "conversation-meta";
      meta.textContent = c.snippet || timeAgo(c.updated_at);
      a.append(title, meta);
      a.addEventListener("click", (event) => {
        if (event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
        event.preventDefault();
        openConversation(c.id, true);
        closeSidebar();
      });
      li.appendChild(a);
      els.list.appendChild(li);
    }
    els.listEmpty.hidden = state.conversations.length > 0;
    els.listEmpty.textContent = state.query ? "No chats match your search." : "No conversations yet.";
  }

  let listTimer = 0;
  function refreshConversations(delay = 0) {
    clearTimeout(listTimer);
    listTimer = setTimeout(async () => {
      try {
        const q = state.query;
        const data = await api(`${initial.urls.list}?q=${encodeURIComponent(q)}`);
        if (q !== state.query) return;
        state.conversations = data.conversations;
        renderConversations();
      } catch (err) {
        /* the next event will retry */
      }
    }, delay);
  }

  function openSidebar() {
    els.app.classList.add("sidebar-open");
    els.scrim.hidden = false;
    els.openSidebar.setAttribute("aria-expanded", "true");
  }
  function closeSidebar() {
    els.app.classList.remove("sidebar-open");
    els.scrim.hidden = true;
    els.openSidebar.setAttribute("aria-expanded", "false");
  }

  // --- Websocket ------------------------------------------------------------------
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${initial.urls.websocket}`);
    state.socket = socket;
    socket.addEventListener("open", () => {
      state.socketReady = true;
      state.reconnectDelay = 500;
      setConnection("");
      if (state.conversationId) socket.send(JSON.stringify({ type: "open", conversation_id: state.conversationId }));
      const queued = state.pendingSends.splice(0);
      queued.forEach((msg) => socket.send(JSON.stringify(msg)));
    });
    socket.addEventListener("message", (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      handleEvent(data);
    });
    socket.addEventListener("close", (event) => {
      state.socketReady = false;
      if (state.socket !== socket) return;
      if (event.code === 4401) {
        window.location.href = "/accounts/login/";
        return;
      }
      if (event.code === 4404) {
        toast("That conversation does not exist.");
        showConversation(null, true);
      }
      setConnection("Reconnecting…");
      setTimeout(connect, state.reconnectDelay);
      state.reconnectDelay = Math.min(state.reconnectDelay * 2, 5000);
    });
  }

  function setConnection(text) {
    els.connection.textContent = text;
    els.connection.hidden = !text;
  }

  function sendSocket(message) {
    if (state.socketReady && state.socket.readyState === WebSocket.OPEN) {
      state.socket.send(JSON.stringify(message));
    } else {
      state.pendingSends.push(message);
    }
  }

  /** A request that starts an answer: Stop shows at once, until the new thread arrives. */
  function request(message) {
    sendSocket(message);
    state.sending = true;
    updateComposer();
  }

  function handleEvent(data) {
    switch (data.type) {
      case "thread":
        if (data.conversation.id !== state.conversationId) return;
        state.sending = false;
        state.conversation = data.conversation;
        state.messages = data.messages;
        renderHeader();
        renderThread();
        break;
      case "started": {
        const m = findMessage(data.message_id);
        if (m) {
          m.context_dropped = data.context_dropped;
          m.prompt_tokens = data.prompt_tokens;
          renderMessage(m);
        }
        break;
      }
      case "delta": {
        if (data.conversation_id !== state.conversationId) return;
        const m = findMessage(data.message_id);
        if (!m) return;
        m.content += data.text;
        m.status = "streaming";
        scheduleRender(m.id);
        break;
      }
      case "finished": {
        if (data.conversation_id !== state.conversationId) return;
        const m = findMessage(data.message.id);
        if (!m) return;
        Object.assign(m, data.message);
        state.dirty.delete(m.id);
        // The last answer done: every message's buttons come back, so draw them all again.
        if (isStreaming()) renderMessage(m);
        else renderThread();
        updateComposer();
        if (m.status === "error") toast(m.error);
        break;
      }
      case "conversations":
        refreshConversations(150);
        break;
      case "deleted":
        if (data.conversation_id === state.conversationId) {
          toast("This conversation was deleted.");
          showConversation(null, true);
        }
        refreshConversations();
        break;
      case "error":
        state.sending = false;
        updateComposer();
        toast(data.detail);
        break;
      default:
        break;
    }
  }

  // --- Thread -----------------------------------------------------------------------
  function findMessage(id) {
    return state.messages.find((m) => m.id === id);
  }

  function isStreaming() {
    return state.messages.some((m) => m.status === "streaming");
  }

  function nearBottom() {
    const s = els.scroll;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 120;
  }

  function scrollToBottom() {
    els.scroll.scrollTop = els.scroll.scrollHeight;
  }

  function scheduleRender(id) {
    state.dirty.add(id);
    if (state.frame) return;
    state.frame = requestAnimationFrame(() => {
      state.frame = 0;
      const stick = nearBottom();
      for (const dirtyId of state.dirty) {
        const m = findMessage(dirtyId);
        const node = m && els.thread.querySelector(`[data-id="${dirtyId}"] .msg-content`);
        if (node) renderMarkdown(node, m.content, m.status === "streaming");
      }
      state.dirty.clear();
      if (stick) scrollToBottom();
    });
  }

  function renderHeader() {
    const c = state.conversation;
    els.title.textContent = c ? c.title : "New chat";
    document.title = c ? `${c.title} · Chat` : "Chat";
    els.renameBtn.disabled = !c;
    els.deleteConversation.disabled = !c;
    if (c) fillSettings(c);
    renderConversations();
  }

  function renderThread() {
    const stick = nearBottom() || els.thread.childElementCount === 0;
    els.thread.innerHTML = "";
    state.editing = null;
    for (const m of state.messages) els.thread.appendChild(messageNode(m));
    els.empty.hidden = state.messages.length > 0;
    updateComposer();
    if (stick) scrollToBottom();
  }

  function renderMessage(m) {
    const old = els.thread.querySelector(`[data-id="${m.id}"]`);
    if (!old) return;
    const stick = nearBottom();
    old.replaceWith(messageNode(m));
    if (stick) scrollToBottom();
  }

  function messageNode(m) {
    const article = document.createElement("article");
    article.className = `msg msg-${m.role} status-${m.status}`;
    article.dataset.id = m.id;
    article.setAttribute("aria-label", m.role === "user" ? "Your message" : "Answer");
    if (m.status === "streaming") article.setAttribute("aria-busy", "true");

    if (m.role === "assistant") {
      const avatar = document.createElement("div");
      avatar.className = "msg-avatar";
      avatar.innerHTML = ICONS.bot;
      article.appendChild(avatar);
    }
    const body = document.createElement("div");
    body.className = "msg-body";
    article.appendChild(body);

    if (m.role === "assistant" && m.context_dropped > 0) {
      const notice = document.createElement("p");
      notice.className = "msg-notice";
      const n = m.context_dropped;
      notice.textContent = `The conversation is longer than the model's context: the ${n} oldest message${
        n === 1 ? " was" : "s were"
      } left out of this answer's prompt.`;
      body.appendChild(notice);
    }

    const content = document.createElement("div");
    content.className = m.role === "user" ? "msg-content msg-text" : "msg-content markdown";
    if (m.role === "user") {
      content.textContent = m.content;
      if (m.content.length > 700 || m.content.split("\n").length > 12) {
        content.classList.add("clamped");
        const more = document.createElement("button");
        more.type = "button";
        more.className = "show-more";
        more.textContent = "Show more";
        more.setAttribute("aria-expanded", "false");
        more.addEventListener("click", () => {
          const open = content.classList.toggle("clamped") === false;
          more.textContent = open ? "Show less" : "Show more";
          more.setAttribute("aria-expanded", String(open));
        });
        body.appendChild(content);
        body.appendChild(more);
      }
    } else if (m.status === "streaming" && !m.content) {
      content.innerHTML = '<span class="thinking" aria-label="Writing"><i></i><i></i><i></i></span>';
    } else {
      renderMarkdown(content, m.content, m.status === "streaming");
    }
    if (!content.parentNode) body.appendChild(content);

    if (m.status === "error") {
      const error = document.createElement("div");
      error.className = "msg-error";
      error.setAttribute("role", "alert");
      error.textContent = m.error || "The answer failed.";
      body.appendChild(error);
    }

    const footer = document.createElement("div");
    footer.className = "msg-footer";
    body.appendChild(footer);

    if (m.siblings && m.siblings.length > 1) footer.appendChild(switcher(m));

    const actions = document.createElement("div");
    actions.className = "msg-actions";
    const busy = isStreaming();
    if (m.role === "user") {
      const edit = button("Edit", ICONS.edit, "action", () => startEdit(m, article));
      edit.disabled = busy;
      actions.appendChild(edit);
      actions.appendChild(button("Copy", ICONS.copy, "action", (e) => copyText(m.content, e.currentTarget)));
      const last = state.messages[state.messages.length - 1];
      if (last && last.id === m.id) {
        const answer = button("Answer", ICONS.regenerate, "action", () =>
          request({ type: "regenerate", conversation_id: state.conversationId, message_id: m.id })
        );
        answer.disabled = busy;
        actions.appendChild(answer);
      }
    } else if (m.status !== "streaming") {
      if (m.content) {
        actions.appendChild(button("Copy", ICONS.copy, "action", (e) => copyText(m.content, e.currentTarget)));
      }
      const regen = button("Regenerate", ICONS.regenerate, "action", () =>
        request({ type: "regenerate", conversation_id: state.conversationId, message_id: m.id })
      );
      regen.disabled = busy;
      actions.appendChild(regen);
    }
    if (m.status !== "streaming") {
      const del = button("Delete message", ICONS.trash, "action action-danger", async () => {
        const ok = await confirmDialog(
          "Delete this message?",
          "The message and every reply below it, in all branches, will be deleted."
        );
        if (ok) sendSocket({ type: "delete", conversation_id: state.conversationId, message_id: m.id });
      });
      del.disabled = busy;
      actions.appendChild(del);
    }
    footer.appendChild(actions);

    const meta = metaText(m);
    if (meta) {
      const span = document.createElement("span");
      span.className = "msg-meta";
      span.textContent = meta;
      footer.appendChild(span);
    }
    return article;
  }

  function metaText(m) {
    if (m.role !== "assistant") return "";
    const parts = [];
    if (m.status === "interrupted") parts.push("Stopped");
    if (m.status === "complete" && m.finish_reason === "length") parts.push("Reached the token limit");
    if (m.status !== "streaming" && m.completion_tokens) parts.push(`${m.completion_tokens} tokens`);
    if (m.status !== "streaming" && m.tokens_per_s) parts.push(`${m.tokens_per_s.toFixed(1)} tok/s`);
    return parts.join(" · ");
  }

  function switcher(m) {
    const wrap = document.createElement("div");
    wrap.className = "switcher";
    wrap.setAttribute("role", "group");
    wrap.setAttribute("aria-label", "Branches");
    const index = m.sibling_index;
    const total = m.siblings.length;
    const busy = isStreaming();
    const prev = button("Previous branch", ICONS.prev, "switch-btn", () =>
      sendSocket({ type: "switch", conversation_id: state.conversationId, message_id: m.siblings[index - 1] })
    );
    prev.disabled = index === 0 || busy;
    const label = document.createElement("span");
    label.className = "switch-label";
    label.textContent = `${index + 1}/${total}`;
    const next = button("Next branch", ICONS.next, "switch-btn", () =>
      sendSocket({ type: "switch", conversation_id: state.conversationId, message_id: m.siblings[index + 1] })
    );
    next.disabled = index === total - 1 || busy;
    wrap.append(prev, label, next);
    return wrap;
  }

  function startEdit(m, article) {
    if (state.editing) state.editing.cancel();
    const body = article.querySelector(".msg-body");
    const original = body.innerHTML;
    article.classList.add("editing");
    body.innerHTML = "";
    const area = document.createElement("textarea");
    area.className = "edit-area";
    area.value = m.content;
    area.setAttribute("aria-label", "Edit message");
    const row = document.createElement("div");
    row.className = "edit-actions";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "btn";
    cancel.textContent = "Cancel";
    const save = document.createElement("button");
    save.type = "button";
    save.className = "btn btn-primary";
    save.textContent = "Save & submit";
    row.append(cancel, save);
    body.append(area, row);
    autoGrow(area);
    area.addEventListener("input", () => autoGrow(area));
    area.focus();
    area.setSelectionRange(area.value.length, area.value.length);
    article.scrollIntoView({ block: "nearest" });
    const restore = () => {
      article.replaceWith(messageNode(m));
      state.editing = null;
    };
    const submit = () => {
      const text = area.value.trim();
      if (!text) return;
      sendSocket({ type: "edit", conversation_id: state.conversationId, message_id: m.id, content: text });
      state.sending = true;
      updateComposer();
      state.editing = null;
      body.innerHTML = original;
      article.classList.remove("editing");
    };
    cancel.addEventListener("click", restore);
    save.addEventListener("click", submit);
    area.addEventListener("keydown", (e) => {
      if (e.key === "Escape") restore();
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        submit();
      }
    });
    state.editing = { cancel: restore };
  }

  // --- Composer -------------------------------------------------------------------
  function updateComposer() {
    const streaming = isStreaming() || state.sending;
    els.send.hidden = streaming;
    els.stop.hidden = !streaming;
    els.send.disabled = !els.prompt.value.trim();
  }

  function autoGrow(area) {
    area.style.height = "auto";
    area.style.height = Math.min(area.scrollHeight, 240) + "px";
  }

  async function ensureConversation() {
    if (state.conversationId) return state.conversationId;
    const data = await api(initial.urls.create, { method: "POST", body: {} });
    showConversation(data.conversation.id, true, data.conversation);
    return state.conversationId;
  }

  async function submitPrompt() {
    const text = els.prompt.value.trim();
    if (!text || isStreaming() || state.sending) return;
    let id;
    try {
      id = await ensureConversation();
    } catch (err) {
      toast(err.message);
      return;
    }
    const leaf = state.messages[state.messages.length - 1];
    sendSocket({ type: "send", conversation_id: id, content: text, parent_id: leaf ? leaf.id : null });
    state.sending = true;
    els.prompt.value = "";
    autoGrow(els.prompt);
    updateComposer();
  }

  function stopAnswer() {
    const streaming = state.messages.filter((m) => m.status === "streaming");
    streaming.forEach((m) => sendSocket({ type: "stop", conversation_id: state.conversationId, message_id: m.id }));
  }

  // --- Conversations ------------------------------------------------------------------
  function showConversation(id, push, conversation) {
    state.conversationId = id;
    state.conversation = conversation || null;
    state.messages = [];
    state.sending = false;
    renderHeader();
    renderThread();
    if (!id) els.settingsPanel.hidden = true;
    const path = id ? `/c/${id}/` : "/";
    if (push && location.pathname !== path) history.pushState({ id }, "", path);
  }

  function openConversation(id, push) {
    if (id === state.conversationId && state.conversation) return;
    showConversation(id, push);
    if (id) sendSocket({ type: "open", conversation_id: id });
    els.prompt.focus();
  }

  async function newChat() {
    if (state.editing) state.editing.cancel();
    try {
      const data = await api(initial.urls.create, { method: "POST", body: {} });
      openConversation(data.conversation.id, true);
      state.conversation = data.conversation;
      renderHeader();
      refreshConversations();
    } catch (err) {
      toast(err.message);
    }
    closeSidebar();
    els.prompt.focus();
  }

  function startRename() {
    if (!state.conversation) return;
    els.renameInput.value = state.conversation.title;
    els.title.hidden = true;
    els.renameForm.hidden = false;
    els.renameInput.focus();
    els.renameInput.select();
  }

  function endRename() {
    els.renameForm.hidden = true;
    els.title.hidden = false;
  }

  async function saveRename(event) {
    event.preventDefault();
    const title = els.renameInput.value.trim();
    if (!title || !state.conversation) return;
    try {
      const data = await api(`/chat/conversations/${state.conversation.id}/update/`, { body: { title } });
      state.conversation = data.conversation;
      renderHeader();
      refreshConversations();
      endRename();
    } catch (err) {
      toast(err.message);
    }
  }

  function confirmDialog(title, text) {
    els.confirmTitle.textContent = title;
    els.confirmText.textContent = text;
    return new Promise((resolve) => {
      const onClose = () => {
        els.dialog.removeEventListener("close", onClose);
        resolve(els.dialog.returnValue === "confirm");
      };
      els.dialog.returnValue = "";
      els.dialog.addEventListener("close", onClose);
      els.dialog.showModal();
    });
  }

  async function deleteConversation() {
    const c = state.conversation;
    if (!c) return;
    const ok = await confirmDialog("Delete this chat?", `“${c.title}” and all its messages will be deleted.`);
    if (!ok) return;
    try {
      await api(`/chat/conversations/${c.id}/delete/`, { method: "POST", body: {} });
      state.conversations = state.conversations.filter((x) => x.id !== c.id);
      showConversation(null, true);
      refreshConversations();
    } catch (err) {
      toast(err.message);
    }
  }

  function fillSettings(c) {
    const f = els.settingsForm.elements;
    if (els.settingsPanel.contains(document.activeElement)) return;
    f.system_prompt.value = c.system_prompt;
    f.temperature.value = c.temperature;
    f.top_p.value = c.top_p;
    f.top_k.value = c.top_k;
    f.max_tokens.value = c.max_tokens;
  }

  async function toggleSettings() {
    const opening = els.settingsPanel.hidden;
    if (opening && !state.conversationId) {
      try {
        await ensureConversation();
      } catch (err) {
        toast(err.message);
        return;
      }
    }
    els.settingsPanel.hidden = !opening;
    els.settingsToggle.setAttribute("aria-expanded", String(opening));
    if (opening && state.conversation) fillSettings(state.conversation);
    els.settingsSaved.textContent = "";
  }

  async function saveSettings(event) {
    event.preventDefault();
    if (!state.conversation) return;
    const f = els.settingsForm.elements;
    const body = {
      system_prompt: f.system_prompt.value,
      temperature: Number(f.temperature.value),
      top_p: Number(f.top_p.value),
      top_k: Number(f.top_k.value),
      max_tokens: Number(f.max_tokens.value),
    };
    try {
      const data = await api(`/chat/conversations/${state.conversation.id}/update/`, { body });
      state.conversation = data.conversation;
      els.settingsSaved.textContent = "Saved";
      setTimeout(() => (els.settingsSaved.textContent = ""), 2500);
    } catch (err) {
      const errors = err.data && err.data.errors;
      if (errors) {
        const first = Object.entries(errors)[0];
        toast(`${first[0].replace("_", " ")}: ${first[1][0].message}`);
      } else {
        toast(err.message);
      }
    }
  }

  // --- Wiring -------------------------------------------------------------------------
  els.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    submitPrompt();
  });
  els.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submitPrompt();
    }
  });
  els.prompt.addEventListener("input", () => {
    autoGrow(els.prompt);
    updateComposer();
  });
  els.stop.addEventListener("click", stopAnswer);
  els.newChat.addEventListener("click", newChat);
  els.renameBtn.addEventListener("click", startRename);
  els.renameForm.addEventListener("submit", saveRename);
  els.renameCancel.addEventListener("click", endRename);
  els.renameInput.addEventListener("keydown", (e) => {
    if (e.key === "Escape") endRename();
  });
  els.settingsToggle.addEventListener("click", toggleSettings);
  els.settingsClose.addEventListener("click", toggleSettings);
  els.settingsForm.addEventListener("submit", saveSettings);
  els.deleteConversation.addEventListener("click", deleteConversation);
  els.openSidebar.addEventListener("click", openSidebar);
  els.closeSidebar.addEventListener("click", closeSidebar);
  els.scrim.addEventListener("click", closeSidebar);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && els.app.classList.contains("sidebar-open")) closeSidebar();
  });
  els.search.addEventListener("input", () => {
    state.query = els.search.value.trim();
    refreshConversations(200);
  });
  window.addEventListener("popstate", () => {
    const match = location.pathname.match(/^\/c\/(\d+)\/$/);
    openConversation(match ? Number(match[1]) : null, false);
  });
  setInterval(() => {
    if (!state.query) renderConversations();
  }, 60000);

  showConversation(state.conversationId, false);
  renderConversations();
  connect();
  els.prompt.focus();
})();
