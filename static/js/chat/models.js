/* The model picker in the conversation header (a native select: keyboard-usable as it is),
 * the "side by side" choice next to it, and "Regenerate with…" on answers. The choice is the
 * conversation's and becomes the user's default (the server keeps both). */

import { $ } from "./dom.js";
import { currentModel } from "./actions.js";

function label(m) {
  const about = m.description ? ` — ${m.description}` : m.adapter_of ? ` — adapter of ${m.adapter_of}` : "";
  return `${m.id}${about}`;
}

export function installModelPicker(store, actions, boot) {
  const models = boot.models || [];
  const picker = $("model-picker");
  const compare = $("compare-model");
  const wrap = $("model-picker-wrap");
  wrap.hidden = models.length < 2;
  for (const m of models) picker.append(new Option(label(m), m.id));

  function render() {
    const current = currentModel(store, boot);
    if (picker !== document.activeElement) picker.value = current;
    const kept = store.state.compareWith;
    compare.replaceChildren(new Option("Side by side…", ""));
    for (const m of models) if (m.id !== current) compare.append(new Option(`and ${m.id}`, m.id));
    compare.value = kept && kept !== current ? kept : "";
  }
  picker.addEventListener("change", () => {
    const c = store.state.conversation;
    if (c) {
      c.model = picker.value;
      actions.setModel(picker.value);
    }
    boot.default_model = picker.value; // a new chat starts with it too
    render();
  });
  compare.addEventListener("change", () => {
    store.state.compareWith = compare.value || null;
  });
  store.subscribe((state, action) => {
    if (["show", "thread", "conversation"].includes(action.type)) render();
  });
  render();
  return { models };
}

/* "Regenerate with…": a select of the other models under an answer. */
export function regenerateWith(m, ctx, models) {
  const select = document.createElement("select");
  select.className = "model-select regenerate-with";
  select.setAttribute("aria-label", "Regenerate with another model");
  select.append(new Option("Regenerate with…", ""));
  for (const option of models) if (option.id !== m.model) select.append(new Option(option.id, option.id));
  select.disabled = ctx.busy;
  select.addEventListener("change", () => {
    if (select.value) ctx.actions.regenerate(m.id, select.value);
  });
  return select;
}
