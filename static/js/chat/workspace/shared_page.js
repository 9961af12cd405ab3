/* The shared page (/s/<token>/): its answers, escaped by the server, drawn as Markdown (with
 * math) through the same sanitiser as the chat. */

import { renderMarkdown } from "../markdown.js";

for (const el of document.querySelectorAll(".shared-md")) {
  renderMarkdown(el, el.textContent, false);
}
