/* The websocket: connects, reconnects with backoff, queues requests while it is down, and
 * re-reads the thread when a streaming answer goes quiet (the watchdog contract in docs/interfaces.md). */

import { isStreaming } from "./store.js";

/** A streaming answer with no delta or heartbeat for this long is re-read (the server beats every 5 s). */
export const WATCHDOG_MS = 15000;

export function createSocket({ url, store, onEvent, onClosed }) {
  let socket = null;
  let ready = false;
  let delay = 500;
  let lastSign = Date.now(); // the last delta, heartbeat or thread from the server
  const pending = [];

  function send(message) {
    if (ready && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
    else pending.push(message);
  }

  function reopen() {
    const id = store.state.conversationId;
    if (id) send({ type: "open", conversation_id: id });
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const current = new WebSocket(`${scheme}://${location.host}${url}`);
    socket = current;
    current.addEventListener("open", () => {
      ready = true;
      delay = 500;
      lastSign = Date.now();
      store.dispatch({ type: "connection", text: "" });
      // The thread first, then whatever was asked for while the socket was down.
      const queued = pending.splice(0);
      const id = store.state.conversationId;
      if (id) current.send(JSON.stringify({ type: "open", conversation_id: id }));
      queued.filter((m) => m.type !== "open").forEach((m) => current.send(JSON.stringify(m)));
    });
    current.addEventListener("message", (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      if (["delta", "heartbeat", "thread", "started", "finished"].includes(data.type)) lastSign = Date.now();
      onEvent(data);
    });
    current.addEventListener("close", (event) => {
      ready = false;
      if (socket !== current) return;
      if (event.code === 4401) {
        window.location.href = "/accounts/login/";
        return;
      }
      onClosed(event.code);
      store.dispatch({ type: "connection", text: "Reconnecting…" });
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 5000);
    });
  }

  // The watchdog: a lost delta stream (a dropped pub/sub message, a process that died) must
  // not leave the answer hanging; re-reading the thread shows where it really is.
  setInterval(() => {
    if (!ready || !isStreaming(store.state)) {
      lastSign = Date.now();
      return;
    }
    if (Date.now() - lastSign >= WATCHDOG_MS) {
      lastSign = Date.now();
      reopen();
    }
  }, 1000);

  connect();
  return { send, reopen };
}
