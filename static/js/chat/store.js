/* The page's state, in one place. Views never change it: they call the actions in actions.js,
 * which dispatch plain objects here; ``reduce`` makes the next state and every subscriber is
 * told (state, action), so data flows one way: event -> action -> state -> views. */

export function initialState(boot) {
  return {
    conversationId: boot.conversation_id,
    conversation: null,
    messages: [],
    beside: {}, // id -> the answers of a side-by-side group that the thread does not run through
    earlier: 0, // older messages of the visible branch not loaded yet (the thread comes in pages)
    conversations: boot.conversations || [],
    query: "",
    sending: false, // a request that starts an answer is on its way; its thread has not come back
    connection: "", // "" when connected, otherwise what the status pill says
  };
}

/** The messages of ``current`` before the first of ``page``, if ``page`` starts on the same
 * branch: both are paths from the root, so they share everything above a common message. */
function keptBefore(current, page) {
  if (!page.length) return [];
  const at = current.findIndex((m) => m.id === page[0].id);
  return at > 0 ? current.slice(0, at) : [];
}

function patchMessage(messages, id, patch) {
  return messages.map((m) => (m.id === id ? { ...m, ...patch(m) } : m));
}

/** The state with message ``id`` patched, on the thread or beside it (a side-by-side column). */
function patched(state, id, patch) {
  const beside = state.beside[id] ? { ...state.beside, [id]: { ...state.beside[id], ...patch(state.beside[id]) } } : state.beside;
  return { ...state, messages: patchMessage(state.messages, id, patch), beside };
}

/** The side-by-side answers off the thread that a page's questions carry (``beside``). */
function besideOf(messages) {
  const beside = {};
  for (const m of messages) for (const answer of m.beside || []) beside[answer.id] = answer;
  return beside;
}

/** The next state; ``state`` itself is never modified. */
export function reduce(state, action) {
  switch (action.type) {
    case "show":
      return { ...state, conversationId: action.id, conversation: action.conversation || null, messages: [], beside: {}, earlier: 0, sending: false };
    case "thread": {
      if (action.conversation.id !== state.conversationId) return state;
      // The newest page: older pages already loaded stay where the branch still runs through them.
      const kept = keptBefore(state.messages, action.messages);
      const earlier = kept.length ? state.earlier : action.earlier || 0;
      const messages = [...kept, ...action.messages];
      return { ...state, conversation: action.conversation, messages, beside: besideOf(messages), earlier, sending: false };
    }
    case "earlier": {
      if (action.conversation_id !== state.conversationId) return state;
      const first = state.messages[0];
      if (!first || first.id !== action.before_id) return state; // the branch changed meanwhile
      return { ...state, messages: [...action.messages, ...state.messages], earlier: action.earlier };
    }
    case "full_text":
      return patched(state, action.id, () => ({ content: action.content, reasoning: action.reasoning, truncated: null }));
    case "conversation":
      if (action.conversation.id !== state.conversationId) return state;
      return { ...state, conversation: action.conversation };
    case "title": {
      const conversations = state.conversations.map((c) =>
        c.id === action.conversation_id ? { ...c, title: action.title } : c
      );
      const open = state.conversation && state.conversation.id === action.conversation_id;
      return { ...state, conversations, conversation: open ? { ...state.conversation, title: action.title } : state.conversation };
    }
    case "started":
      return patched(state, action.message_id, () => ({
        context_dropped: action.context_dropped,
        prompt_tokens: action.prompt_tokens,
      }));
    case "delta":
      if (action.conversation_id !== state.conversationId) return state;
      return patched(state, action.message_id, (m) => ({
        content: m.content + (action.text || ""),
        reasoning: (m.reasoning || "") + (action.reasoning || ""),
        status: "streaming",
      }));
    case "finished":
      if (action.conversation_id !== state.conversationId) return state;
      return patched(state, action.message.id, () => action.message);
    case "conversations":
      if (action.query !== state.query) return state;
      return { ...state, conversations: action.conversations };
    case "query":
      return { ...state, query: action.query };
    case "sending":
      return { ...state, sending: action.value };
    case "error":
      return { ...state, sending: false };
    case "connection":
      return { ...state, connection: action.text };
    default:
      return state;
  }
}

export function createStore(state) {
  const listeners = [];
  return {
    get state() {
      return state;
    },
    dispatch(action) {
      const next = reduce(state, action);
      if (next === state) return;
      state = next;
      for (const listener of listeners) listener(state, action);
    },
    subscribe(listener) {
      listeners.push(listener);
    },
  };
}

// Questions views ask of the state.
/** The thread's messages and the side-by-side answers beside it. */
export const allMessages = (state) => [...state.messages, ...Object.values(state.beside)];
export const isStreaming = (state) => allMessages(state).some((m) => m.status === "streaming");
export const isBusy = (state) => state.sending || isStreaming(state);
export const findMessage = (state, id) => state.messages.find((m) => m.id === id) || state.beside[id];
export const lastUserMessage = (state) => [...state.messages].reverse().find((m) => m.role === "user");
