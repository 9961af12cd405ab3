/* A question sent to several models at once: its answers (a side-by-side group, marked by the
 * server with ``side_by_side`` on the question) drawn as columns, all streaming together, each
 * headed by its model and with a "Keep this answer" button. Keeping one shows its branch as the
 * usual single answer; a message sent without choosing goes on from the first column's answer
 * (the one the thread runs through). */

import { messageNode } from "./message.js";

/** The group the answer at ``index`` of the thread opens, or null: its question's column ids. */
export function groupAt(messages, index) {
  const question = index > 0 ? messages[index - 1] : null;
  const ids = question && question.side_by_side;
  return ids && ids.includes(messages[index].id) ? ids : null;
}

function column(m, position, count, index, ctx) {
  const section = document.createElement("section");
  section.className = "sbs-col";
  const headingId = `sbs-model-${m.id}`;
  section.setAttribute("aria-labelledby", headingId);
  const heading = document.createElement("h2");
  heading.className = "sbs-model";
  heading.id = headingId;
  heading.textContent = m.model || `Answer ${position + 1}`;
  const place = document.createElement("span");
  place.className = "visually-hidden";
  place.textContent = `, answer ${position + 1} of ${count}`;
  heading.appendChild(place);
  const article = messageNode(m, index, { ...ctx, inColumn: true, isLast: false });
  article.dataset.focusKey = `${index}.${position}:article`;
  const keep = document.createElement("button");
  keep.type = "button";
  keep.className = "btn sbs-keep";
  keep.textContent = "Keep this answer";
  keep.setAttribute("aria-describedby", headingId);
  keep.dataset.focusKey = `${index}.${position}:keep`;
  keep.disabled = ctx.sending;
  keep.addEventListener("click", () => ctx.actions.keep(m.id));
  section.append(heading, article, keep);
  return section;
}

/** The columns of a group: ``ids`` in order, ``shown`` the answer the thread runs through, the
 * others from ``beside`` (the store's answers of the group that are off the thread). */
export function columnsNode(ids, shown, index, ctx, beside) {
  const answers = ids.map((id) => (id === shown.id ? shown : beside[id])).filter(Boolean);
  const group = document.createElement("div");
  group.className = "sbs";
  group.setAttribute("role", "group");
  group.setAttribute("aria-label", `${answers.length} answers side by side`);
  group.dataset.group = ids.join(" ");
  const row = document.createElement("div");
  row.className = "sbs-columns";
  row.style.setProperty("--sbs-count", String(answers.length));
  answers.forEach((m, position) => row.appendChild(column(m, position, answers.length, index, ctx)));
  const hint = document.createElement("p");
  hint.className = "sbs-hint";
  const first = answers[0] && answers[0].model ? `${answers[0].model}'s answer` : "the first answer";
  hint.textContent = `Keep the answer you prefer. A new message without choosing goes on from ${first}.`;
  group.append(row, hint);
  return group;
}
