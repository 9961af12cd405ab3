/* The sidebar: the conversation list, search, and on narrow screens a drawer that is out of the
 * tab order (inert) while closed and holds the focus while open. */

import { $, timeAgo } from "./dom.js";
import { groupedItems } from "./workspace/organise.js";

const NARROW = window.matchMedia("(max-width: 820px)");

/* The drawer's open and shut states; only one side takes focus on a phone: the open drawer,
 * or the page with the drawer shut. */
function createDrawer() {
  const app = $("app");
  const sidebar = $("sidebar");
  const main = $("main");
  const scrim = $("scrim");
  const openBtn = $("open-sidebar");
  const search = $("search");

  const isOpen = () => app.classList.contains("sidebar-open");

  function syncInert() {
    const narrow = NARROW.matches;
    sidebar.inert = narrow && !isOpen();
    main.inert = narrow && isOpen();
  }

  function open(focusSearch = false) {
    app.classList.add("sidebar-open");
    scrim.hidden = false;
    openBtn.setAttribute("aria-expanded", "true");
    syncInert();
    (focusSearch ? search : sidebar.querySelector(".conversation-link.active") || $("new-chat")).focus();
  }

  function close(returnFocus = true) {
    if (!isOpen()) return;
    const hadFocus = sidebar.contains(document.activeElement);
    app.classList.remove("sidebar-open");
    scrim.hidden = true;
    openBtn.setAttribute("aria-expanded", "false");
    syncInert();
    if (returnFocus && hadFocus && NARROW.matches) openBtn.focus();
  }

  $("close-sidebar").addEventListener("click", () => close());
  openBtn.addEventListener("click", () => open());
  scrim.addEventListener("click", () => close());
  sidebar.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && isOpen()) {
      e.stopPropagation();
      close();
    }
  });
  NARROW.addEventListener("change", () => {
    if (!NARROW.matches) close(false);
    syncInert();
  });
  syncInert();
  return { isOpen, open, close };
}

/* One conversation's link; a plain click opens it in this page (`onOpen`), a modified one is
 * left to the browser (a new tab or window). */
function conversationItem(c, active, onOpen) {
  const li = document.createElement("li");
  const a = document.createElement("a");
  a.href = `/c/${c.id}/`;
  a.className = "conversation-link" + (active ? " active" : "");
  if (active) a.setAttribute("aria-current", "page");
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
    onOpen(c.id);
  });
  li.appendChild(a);
  return li;
}

export function createSidebar(store, actions) {
  const list = $("conversation-list");
  const listEmpty = $("conversation-empty");
  const search = $("search");
  const drawer = createDrawer();

  function openFromList(id) {
    actions.openConversation(id, true);
    drawer.close(false);
    $("prompt").focus();
  }

  function render() {
    const state = store.state;
    // Pinned, folders, the rest (workspace/organise.js): each row is conversationItem's.
    const items = groupedItems(state, (c) => conversationItem(c, c.id === state.conversationId, openFromList));
    const focusedId = list.contains(document.activeElement) ? document.activeElement.getAttribute("href") : null;
    list.replaceChildren(...items);
    if (focusedId) {
      const again = list.querySelector(`a[href="${focusedId}"]`);
      if (again) again.focus();
    }
    listEmpty.hidden = state.conversations.length > 0;
    listEmpty.textContent = state.query ? "No chats match your search." : "No conversations yet.";
  }

  search.addEventListener("input", () => actions.setQuery(search.value.trim()));
  setInterval(() => store.state.query || render(), 60000);

  store.subscribe((state, action) => {
    if (["conversations", "show", "thread", "title", "conversation"].includes(action.type)) render();
  });
  render();

  const { open, close, isOpen } = drawer;
  return {
    open,
    close,
    isOpen,
    toggle: () => (isOpen() ? close() : open()),
    /** Ctrl+K: the search box, opening the drawer on a phone first. */
    focusSearch() {
      if (NARROW.matches) open(true);
      else search.focus();
      search.select();
    },
  };
}
