/* Markdown rendering. Model output is untrusted: marked turns it into HTML, and DOMPurify keeps
 * only what Markdown needs (an allow-list, not a block-list) before anything touches the page.
 * While an answer streams, only its last block is parsed again on each frame. */

import { ICONS, button, copyText } from "./dom.js";
import { MATH_ATTR, MATH_TAGS, parseWithMath } from "./workspace/math.js";

const { marked, DOMPurify, hljs } = globalThis;

export const SANITIZE_CONFIG = {
  ALLOWED_TAGS: [
    "h1", "h2", "h3", "h4", "h5", "h6", "p", "br", "hr",
    "ul", "ol", "li", "strong", "em", "b", "i", "del", "s", "sub", "sup",
    "code", "pre", "kbd", "blockquote",
    "table", "thead", "tbody", "tr", "th", "td", "a",
    ...MATH_TAGS, // KaTeX's MathML, sanitised like the rest (workspace/math.js)
  ],
  ALLOWED_ATTR: ["href", "title", "class", "start", "align", "colspan", "rowspan", ...MATH_ATTR],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
  // MathML's attributes hold plain words (display="block"), never a URL: not held to the regexp above.
  ADD_URI_SAFE_ATTR: MATH_ATTR,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
};

if (DOMPurify) {
  // Images are never loaded: a remote one becomes a link to it, any other becomes its alt text.
  // This hook sees every element before the allow-list does, so <img> itself is never allowed.
  DOMPurify.addHook("uponSanitizeElement", (node, data) => {
    if (data.tagName !== "img" || !node.parentNode) return;
    const src = node.getAttribute("src") || "";
    const alt = node.getAttribute("alt") || "";
    const doc = node.ownerDocument;
    let replacement;
    if (/^https?:/i.test(src)) {
      replacement = doc.createElement("a");
      replacement.setAttribute("href", src);
      replacement.textContent = `Image: ${alt || src}`;
    } else {
      replacement = doc.createTextNode(alt);
    }
    node.parentNode.replaceChild(replacement, node);
  });
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    // Classes only say a code block's language: a model must not borrow the page's own styles.
    if (node.hasAttribute("class")) {
      const keep = node.tagName === "CODE" ? node.className.split(/\s+/).filter((c) => /^language-[\w+#-]+$/.test(c)) : [];
      if (keep.length) node.setAttribute("class", keep.join(" "));
      else node.removeAttribute("class");
    }
    if (node.tagName === "A") {
      if (node.getAttribute("href")) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer");
      } else {
        node.removeAttribute("target");
      }
    }
  });
}

export function toSafeHtml(text) {
  if (!marked || !DOMPurify) {
    const div = document.createElement("div");
    div.textContent = text || "";
    return `<p>${div.innerHTML}</p>`;
  }
  return DOMPurify.sanitize(parseWithMath(text || ""), SANITIZE_CONFIG);
}

/** Where the finished blocks of a streaming text end: after its last blank line outside a code fence. */
export function stableLength(text) {
  let inFence = false;
  let fenceMark = "";
  let cut = 0;
  let pos = 0;
  for (const line of text.split("\n")) {
    const end = pos + line.length + 1;
    const fence = line.match(/^ {0,3}(`{3,}|~{3,})/);
    if (fence) {
      if (!inFence) {
        inFence = true;
        fenceMark = fence[1];
      } else if (fence[1][0] === fenceMark[0] && fence[1].length >= fenceMark.length && !line.trim().slice(fence[1].length).trim()) {
        inFence = false;
      }
    } else if (!inFence && line.trim() === "" && end <= text.length) {
      cut = end;
    }
    pos = end;
  }
  return cut;
}

/** A text longer than this is shown as plain text: parsing and sanitising megabytes of
 * Markdown would hold the page for seconds. */
export const PLAIN_TEXT_OVER = 200000;

/** Renders ``text`` into ``target``. A streaming answer keeps its finished blocks as they are. */
export function renderMarkdown(target, text, streaming) {
  if (!streaming && text && text.length > PLAIN_TEXT_OVER) {
    delete target._md;
    target.classList.add("msg-plain");
    target.textContent = text;
    return;
  }
  target.classList.remove("msg-plain");
  if (!streaming) {
    delete target._md;
    target.innerHTML = toSafeHtml(text);
    decorateCodeBlocks(target, true);
    return;
  }
  let md = target._md;
  if (!md) {
    target.innerHTML = "";
    md = target._md = { stable: document.createElement("div"), tail: document.createElement("div"), cut: 0 };
    md.stable.className = "md-part";
    md.tail.className = "md-part";
    target.append(md.stable, md.tail);
  }
  const cut = stableLength(text);
  if (cut !== md.cut) {
    md.stable.innerHTML = toSafeHtml(text.slice(0, cut));
    decorateCodeBlocks(md.stable, false);
    md.cut = cut;
  }
  md.tail.innerHTML = toSafeHtml(text.slice(cut));
  decorateCodeBlocks(md.tail, false);
  let spot = md.tail.lastElementChild ? md.tail : md.stable;
  while (spot.lastElementChild && !["BR", "HR"].includes(spot.lastElementChild.tagName)) spot = spot.lastElementChild;
  if (spot.classList.contains("code-block")) spot = spot.querySelector("code") || spot;
  const cursor = document.createElement("span");
  cursor.className = "cursor";
  cursor.setAttribute("aria-hidden", "true");
  spot.appendChild(cursor);
}

function decorateCodeBlocks(root, highlight) {
  root.querySelectorAll("pre > code").forEach((code) => {
    const pre = code.parentElement;
    const lang = (code.className.match(/language-([\w+#-]+)/) || [])[1] || "";
    if (highlight && hljs) {
      try {
        hljs.highlightElement(code);
      } catch (err) {
        /* unknown language: leave it plain */
      }
    }
    // A scrollable block must be reachable by keyboard to scroll it.
    pre.tabIndex = 0;
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.textContent = lang || "code";
    head.append(label, button("Copy code", ICONS.copy, "code-copy", (e) => copyText(code.textContent, e.currentTarget), { text: "Copy" }));
    pre.replaceWith(wrap);
    wrap.append(head, pre);
  });
}
