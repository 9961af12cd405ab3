/* Citations under answers: the passages (file and where in it) an answer's question was given,
 * each a link that opens the passage in the document. Drawn after the thread view draws. */

const PASSAGE_URL = (p) => `/documents/${p.document_id}/passage/?start=${p.start}&end=${p.end}#passage`;

function citationList(sources) {
  const list = document.createElement("ol");
  list.className = "citations";
  list.setAttribute("aria-label", "Sources");
  for (const p of sources.passages || []) {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = PASSAGE_URL(p);
    link.target = "_blank";
    link.rel = "noopener";
    link.className = "citation";
    link.textContent = `[${p.n}] ${p.filename}${p.heading ? ` · ${p.heading}` : ""}`;
    const excerpt = document.createElement("span");
    excerpt.className = "excerpt";
    excerpt.textContent = p.excerpt;
    item.append(link, excerpt);
    list.appendChild(item);
  }
  return list;
}

/** Put each answer's citations (``sources``: answer id -> {passages, whole}) under it. */
export function drawCitations(thread, sources) {
  for (const article of thread.querySelectorAll("article.msg-assistant")) {
    const found = sources[article.dataset.id];
    const body = article.querySelector(".msg-body");
    const old = body && body.querySelector(":scope > .citations");
    if (old) old.remove();
    if (!body || !found || !(found.passages || []).length) continue;
    body.appendChild(citationList(found));
  }
}
