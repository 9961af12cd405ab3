/* Everything the user or the server can make happen. Views call these; each one talks to the
 * server (socket or JSON views) and dispatches what changed to the store. Nothing else writes state. */

import { api, toast, announce } from "./dom.js";
import { createSocket } from "./socket.js";
import { allMessages } from "./store.js";
import { listParams, startOptions } from "./workspace/state.js";

/* The conversation list, fetched again `delay` ms after the latest call (calls in between coalesce). */
function listRefresher(store, listUrl) {
  let listTimer = 0;
  return function refreshConversations(delay = 0) {
    clearTimeout(listTimer);
    listTimer = setTimeout(async () => {
      const query = store.state.query;
      try {
        const data = await api(`${listUrl}?q=${encodeURIComponent(query)}${listParams()}`);
        store.dispatch({ type: "conversations", query, conversations: data.conversations });
      } catch (err) {
        /* the next event will retry */
      }
    }, delay);
  };
}

/* What a server event changes, through the store, the socket and the navigation actions. */
function handleServerEvent(data, { store, socket, show, openConversation, refreshConversations }) {
  switch (data.type) {
    case "thread":
      store.dispatch({ type: "thread", conversation: data.conversation, messages: data.messages, earlier: data.earlier });
      break;
    case "earlier":
      store.dispatch(data);
      break;
    case "started":
    case "delta":
    case "finished":
      store.dispatch(data);
      if (data.type === "finished" && data.message.status === "error") toast(data.message.error || "The answer failed.", "server_error");
      break;
    case "notice":
      toast(data.text, data.code || "");
      break;
    case "title":
      store.dispatch(data);
      break;
    case "conversations":
      refreshConversations(150);
      break;
    case "forked":
      refreshConversations();
      openConversation(data.conversation_id, true);
      announce("Opened the new conversation.");
      break;
    case "deleted":
      if (data.conversation_id === store.state.conversationId) {
        toast("This conversation was deleted.");
        show(null, true);
      }
      refreshConversations();
      break;
    case "error":
      // Shown, never acted on destructively: nothing is cleared (a failed send also closes the
      // socket, which reconnects).
      store.dispatch({ type: "error", code: data.code || "", message_id: data.message_id, detail: data.detail });
      toast(data.detail || "Something went wrong.", data.code || "");
      if (data.code === "not_found") socket.reopen();
      break;
    default:
      break; // heartbeat and pong only feed the socket's watchdog
  }
}

/* A message too long for one websocket frame comes cut (``truncated``): its whole text is
 * fetched over HTTP, once per message. */
function fetchWholeTexts(store) {
  const asked = new Set();
  store.subscribe((state) => {
    for (const m of allMessages(state)) {
      if (!m.truncated || !m.truncated.length || m.status === "streaming" || asked.has(m.id)) continue;
      asked.add(m.id);
      api(`/chat/messages/${m.id}/text/`)
        .then((data) => store.dispatch({ type: "full_text", id: data.id, content: data.content, reasoning: data.reasoning }))
        .catch((err) => {
          asked.delete(m.id);
          toast(`The rest of a long message could not be loaded: ${err.message}`);
        });
    }
  });
}

/* Requests about the open conversation's messages, sent over the socket. */
function messageRequests(store, socket) {
  function conversationRequest(type, fields) {
    socket.send({ type, conversation_id: store.state.conversationId, ...fields });
  }

  /** A request that starts an answer: Stop shows at once, until the new thread arrives. */
  function answerRequest(type, fields) {
    conversationRequest(type, fields);
    store.dispatch({ type: "sending", value: true });
  }

  return {
    stop() {
      allMessages(store.state)
        .filter((m) => m.status === "streaming")
        .forEach((m) => conversationRequest("stop", { message_id: m.id }));
    },
    edit: (messageId, content) => answerRequest("edit", { message_id: messageId, content }),
    /** Another answer to the same question; with ``model``, from that model ("Regenerate with…"). */
    regenerate: (messageId, model) =>
      answerRequest("regenerate", model ? { message_id: messageId, model } : { message_id: messageId }),
    /** The model picker: this conversation's model, and the user's default from now on. */
    setModel: (model) => conversationRequest("set_model", { model }),
    switchTo: (messageId) => conversationRequest("switch", { message_id: messageId }),
    /** Keep one of a question's side-by-side answers: its branch is shown as the answer. */
    keep: (messageId) => conversationRequest("keep", { message_id: messageId }),
    deleteMessage: (messageId) => conversationRequest("delete", { message_id: messageId }),
    fork: (messageId) => conversationRequest("fork", { message_id: messageId }),
    /** The page of older messages before the first one shown. */
    loadEarlier() {
      const first = store.state.messages[0];
      if (first && store.state.earlier > 0) conversationRequest("earlier", { before_id: first.id });
    },
    /** Allow or deny a tool call that waits for the user (approval on). */
    approve: (messageId, approved) => conversationRequest("approve", { message_id: messageId, approved }),
  };
}

/** The model of the open conversation: its own, else the user's default. */
export function currentModel(store, boot) {
  const c = store.state.conversation;
  return (c && c.model) || boot.default_model || "";
}

export function createActions(store, boot) {
  const urls = boot.urls;
  const refreshConversations = listRefresher(store, urls.list);
  let creating = null; // the "New chat" request in flight
  const app = { store, show, openConversation, refreshConversations };
  const socket = createSocket({
    url: urls.websocket,
    store,
    onEvent: (data) => handleServerEvent(data, app),
    onClosed(code) {
      if (code === 4404) {
        toast("That conversation does not exist.", "not_found");
        show(null, true);
      } else if (code === 4500 || code === 1009) {
        toast("The connection failed: the server could not send to this tab. Reconnecting…", "send_failed");
      }
    },
  });
  app.socket = socket;
  fetchWholeTexts(store);

  function show(id, push, conversation) {
    store.dispatch({ type: "show", id, conversation });
    const path = id ? `/c/${id}/` : "/";
    if (push && location.pathname !== path) history.pushState({ id }, "", path);
  }

  function openConversation(id, push) {
    const state = store.state;
    if (id === state.conversationId && state.conversation) return;
    show(id, push);
    if (id) socket.send({ type: "open", conversation_id: id });
  }

  async function ensureConversation() {
    if (store.state.conversationId) return store.state.conversationId;
    const data = await api(urls.create, { method: "POST", body: startOptions() });
    // No "open": the "send" that follows opens it on the server without an empty thread first.
    show(data.conversation.id, true, data.conversation);
    refreshConversations();
    return data.conversation.id;
  }

  return {
    refreshConversations,
    openConversation,
    ensureConversation,
    show,
    ...messageRequests(store, socket),
    async send(content) {
      const id = await ensureConversation();
      const messages = store.state.messages;
      const leaf = messages[messages.length - 1];
      const request = { type: "send", conversation_id: id, content, parent_id: leaf ? leaf.id : null };
      // Side by side: the question goes to the picked model and the compared one at once.
      const models = store.state.compareWith ? [currentModel(store, boot), store.state.compareWith] : null;
      if (models) request.models = models;
      // A chat started after picking a model has none of its own yet: the pick goes with it.
      const c = store.state.conversation;
      if (!models && !(c && c.model) && boot.default_model) request.model = boot.default_model;
      socket.send(request);
      store.dispatch({ type: "sending", value: true });
    },
    setQuery(query) {
      store.dispatch({ type: "query", query });
      refreshConversations(200);
    },
    async newChat() {
      creating = api(urls.create, { method: "POST", body: startOptions() });
      try {
        const data = await creating;
        show(data.conversation.id, true, data.conversation);
        socket.send({ type: "open", conversation_id: data.conversation.id });
      } finally {
        creating = null;
      }
      refreshConversations();
    },
    // Resolves once no "New chat" request is in flight (and its conversation is shown), so a
    // choice made meanwhile (the temporary toggle) applies to that conversation, not the one before.
    async creationSettled() {
      if (creating) await creating.catch(() => {});
    },
    async updateConversation(fields) {
      const c = store.state.conversation;
      const data = await api(`/chat/conversations/${c.id}/update/`, { body: fields });
      store.dispatch({ type: "conversation", conversation: data.conversation });
      refreshConversations();
      return data.conversation;
    },
    async deleteConversation(id = store.state.conversation.id) {
      await api(`/chat/conversations/${id}/delete/`, { method: "POST", body: {} });
      if (store.state.conversationId === id) show(null, true);
      refreshConversations();
    },
  };
}
