/* Every keyboard shortcut of the chat page, listed once: the help dialog (?) shows them all, and
 * the page-wide key handler (keyboard.js) runs those with a `command`. The others belong to one
 * control, which handles its keys itself: the message box (composer.js), a branch switcher
 * (message.js).
 *
 * A chord is { key, ctrl, shift, alt, typing }. `key` is KeyboardEvent.key, a letter in lower
 * case. ctrl (Ctrl, or ⌘ on a Mac), shift and alt must be as given where given and are ignored
 * where left out; `typing: false` skips the chord while the focus is in a text field (a bare
 * printable key would otherwise steal the user's typing). */

export const SHORTCUTS = [
  { chords: [{ key: "Enter", shift: false }], action: "Send the message" },
  { chords: [{ key: "Enter", shift: true }], action: "New line" },
  // Also closes the sidebar drawer when no answer is being written.
  { chords: [{ key: "Escape", shift: false }], action: "Stop the answer being written", command: "stopAnswer" },
  { chords: [{ key: "ArrowUp" }], where: "in an empty message box", action: "Edit your last message" },
  // Handled by the message box's saved-prompt menu (workspace/slash.js).
  { chords: [{ key: "/" }], where: "at the start of the message box", action: "Insert a saved prompt" },
  {
    chords: [{ key: "ArrowLeft" }, { key: "ArrowRight" }],
    joiner: " / ",
    where: "on a branch button",
    action: "Previous / next branch",
  },
  { chords: [{ key: "o", ctrl: true, shift: true }], action: "New chat", command: "newChat" },
  { chords: [{ key: "k", ctrl: true, shift: false }], action: "Search chats", command: "searchChats" },
  { chords: [{ key: "Escape", shift: true }], action: "Focus the message box", command: "focusPrompt" },
  { chords: [{ key: "Backspace", ctrl: true, shift: true }], action: "Delete this chat", command: "deleteChat" },
  {
    chords: [
      { key: "?", ctrl: false, alt: false, typing: false },
      { key: "/", ctrl: true },
    ],
    action: "This list",
    command: "help",
  },
];

const KEY_LABELS = { Escape: "Esc", ArrowUp: "↑", ArrowLeft: "←", ArrowRight: "→" };

/* The keys of a chord as the help shows them, e.g. ["Ctrl", "Shift", "O"]. */
export function chordKeys(chord) {
  const keys = [];
  if (chord.ctrl) keys.push("Ctrl");
  if (chord.shift) keys.push("Shift");
  if (chord.alt) keys.push("Alt");
  keys.push(KEY_LABELS[chord.key] ?? (chord.key.length === 1 ? chord.key.toUpperCase() : chord.key));
  return keys;
}

function typingIn(target) {
  return target instanceof HTMLElement && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
}

function chordMatches(chord, e) {
  const key = e.key.length === 1 ? e.key.toLowerCase() : e.key;
  const held = { ctrl: e.ctrlKey || e.metaKey, shift: e.shiftKey, alt: e.altKey };
  if (key !== chord.key) return false;
  if (Object.keys(held).some((mod) => mod in chord && chord[mod] !== held[mod])) return false;
  return chord.typing !== false || !typingIn(e.target);
}

/* The page-wide shortcut a key press is, if any. */
export function pageShortcutFor(e) {
  return SHORTCUTS.find((s) => s.command && s.chords.some((chord) => chordMatches(chord, e)));
}
