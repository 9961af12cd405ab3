/* Small DOM helpers shared by the views: icons, buttons, the toast, the clipboard, the server's JSON API. */

function svg(path) {
  return `<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false">${path}</svg>`;
}

export const ICONS = {
  copy: svg('<rect x="9" y="9" width="11" height="11" rx="2"/><path d="M5 15V6a2 2 0 0 1 2-2h8"/>'),
  check: svg('<path d="m5 12 5 5 9-10"/>'),
  edit: svg('<path d="M4 20h4L19 9l-4-4L4 16z"/><path d="m13.5 6.5 4 4"/>'),
  regenerate: svg('<path d="M20 12a8 8 0 1 1-2.3-5.7"/><path d="M20 4v5h-5"/>'),
  fork: svg('<circle cx="6" cy="5" r="2"/><circle cx="18" cy="5" r="2"/><circle cx="12" cy="19" r="2"/><path d="M6 7v2a3 3 0 0 0 3 3h6a3 3 0 0 0 3-3V7M12 12v5"/>'),
  trash: svg('<path d="M5 7h14M10 7V5h4v2M7 7l1 12h8l1-12"/>'),
  prev: svg('<path d="m14 6-6 6 6 6"/>'),
  next: svg('<path d="m10 6 6 6-6 6"/>'),
  bot: svg('<path d="M12 3v3M7 8h10a3 3 0 0 1 3 3v5a3 3 0 0 1-3 3H7a3 3 0 0 1-3-3v-5a3 3 0 0 1 3-3z"/><circle cx="9.5" cy="13" r="1.2"/><circle cx="14.5" cy="13" r="1.2"/>'),
};

export const $ = (id) => document.getElementById(id);

/** An icon button; ``key`` names it so focus can come back to it after a re-render. */
export function button(label, icon, className, onClick, { text = "", key = "" } = {}) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.setAttribute("aria-label", label);
  b.title = label;
  b.innerHTML = icon + (text ? `<span aria-hidden="true">${text}</span>` : "");
  if (key) b.dataset.focusKey = key;
  b.addEventListener("click", onClick);
  return b;
}

export function prefersReducedMotion() {
  return window.matchMedia("(prefers-reduced-motion: reduce)").matches;
}

let toastTimer = 0;
/** A short notice that never replaces what the user typed or sees (errors are shown, not acted on). */
export function toast(text, code = "") {
  const el = $("toast");
  el.textContent = text;
  el.dataset.code = code;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (el.hidden = true), 6000);
}

let announceTimer = 0;
/** Says ``text`` once, politely, through the page's one live region. */
export function announce(text) {
  const el = $("announcer");
  el.textContent = "";
  clearTimeout(announceTimer);
  // A fresh text node after a tick, so the same words said twice are still announced.
  announceTimer = setTimeout(() => (el.textContent = text), 50);
}

export async function copyText(text, feedbackButton) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
    } else {
      // Plain-http LAN addresses have no clipboard API: the old copy command still works there.
      const area = document.createElement("textarea");
      area.value = text;
      area.className = "offscreen";
      document.body.appendChild(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    if (feedbackButton) {
      const before = feedbackButton.innerHTML;
      feedbackButton.innerHTML = ICONS.check + (feedbackButton.querySelector("span") ? "<span>Copied</span>" : "");
      feedbackButton.classList.add("copied");
      announce("Copied");
      setTimeout(() => {
        feedbackButton.innerHTML = before;
        feedbackButton.classList.remove("copied");
      }, 1500);
    }
  } catch (err) {
    toast("Could not copy to the clipboard.");
  }
}

export function timeAgo(iso) {
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  if (seconds < 7 * 86400) return `${Math.floor(seconds / 86400)} d ago`;
  return new Date(iso).toLocaleDateString();
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** JSON in and out of the site's views; a 401 goes to the sign-in page. */
export async function api(url, options = {}) {
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
