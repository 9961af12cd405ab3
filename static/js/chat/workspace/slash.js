/* "/" at the start of the message box lists the saved prompts (presets with a system prompt);
 * typing filters them, ↑/↓ choose, Enter or Tab inserts the prompt's text, Esc closes. A
 * listbox with aria-activedescendant: the focus stays in the message box. */

import { $, announce } from "../dom.js";
import { workspace } from "./state.js";

export function installSlashMenu() {
  const prompt = $("prompt");
  const menu = $("slash-menu");
  let matches = [];
  let active = 0;

  const saved = () => workspace.presets.filter((p) => p.system_prompt.trim());

  function close() {
    menu.hidden = true;
    matches = [];
    prompt.removeAttribute("aria-activedescendant");
    prompt.removeAttribute("aria-controls");
  }

  function draw() {
    menu.replaceChildren(
      ...matches.map((p, i) => {
        const li = document.createElement("li");
        li.id = `slash-option-${p.id}`;
        li.setAttribute("role", "option");
        li.setAttribute("aria-selected", String(i === active));
        li.className = "slash-option";
        const name = document.createElement("span");
        name.className = "slash-name";
        name.textContent = p.name;
        const text = document.createElement("span");
        text.className = "slash-text";
        text.textContent = p.system_prompt.slice(0, 90);
        li.append(name, text);
        li.addEventListener("mousedown", (e) => {
          e.preventDefault();
          insert(p);
        });
        return li;
      })
    );
    menu.hidden = matches.length === 0;
    if (matches.length) {
      prompt.setAttribute("aria-controls", "slash-menu");
      prompt.setAttribute("aria-activedescendant", `slash-option-${matches[active].id}`);
    }
  }

  function update() {
    const value = prompt.value;
    if (!value.startsWith("/") || value.includes("\n")) return close();
    const query = value.slice(1).toLowerCase();
    matches = saved().filter((p) => p.name.toLowerCase().includes(query));
    active = Math.min(active, Math.max(matches.length - 1, 0));
    draw();
  }

  function insert(preset) {
    prompt.value = preset.system_prompt;
    close();
    prompt.dispatchEvent(new Event("input"));
    prompt.focus();
    announce(`Inserted the prompt ${preset.name}.`);
  }

  prompt.addEventListener("input", update);
  // Capturing on the form: these keys are the menu's before the composer sees them.
  $("composer").addEventListener(
    "keydown",
    (e) => {
      if (menu.hidden || e.target !== prompt) return;
      const moves = { ArrowDown: 1, ArrowUp: -1 };
      if (e.key in moves) {
        active = (active + moves[e.key] + matches.length) % matches.length;
        draw();
      } else if ((e.key === "Enter" && !e.shiftKey) || e.key === "Tab") {
        insert(matches[active]);
      } else if (e.key === "Escape") {
        close();
      } else {
        return;
      }
      e.preventDefault();
      e.stopImmediatePropagation();
    },
    true
  );
  prompt.addEventListener("blur", () => setTimeout(close, 100));
}
