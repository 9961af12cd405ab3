/* The composer: send with Enter, a new line with Shift+Enter, Stop while an answer is written.
 * What was sent is kept until the server accepts it, so an error never loses the user's text. */

import { $, toast } from "./dom.js";
import { isBusy } from "./store.js";

export function createComposer(store, actions, { editLast }) {
  const form = $("composer");
  const prompt = $("prompt");
  const sendBtn = $("send");
  const stopBtn = $("stop");
  let unconfirmed = null; // the text of a send the server has not answered yet

  function autoGrow() {
    prompt.style.height = "auto";
    prompt.style.height = Math.min(prompt.scrollHeight, 240) + "px";
  }

  function update() {
    const busy = isBusy(store.state);
    const hadFocus = document.activeElement === stopBtn || document.activeElement === sendBtn;
    sendBtn.hidden = busy;
    stopBtn.hidden = !busy;
    sendBtn.disabled = !prompt.value.trim();
    // The button under focus just disappeared: keep the keyboard in the composer.
    if (hadFocus && (sendBtn.hidden || stopBtn.hidden) && document.activeElement === document.body) prompt.focus();
  }

  async function submit() {
    const text = prompt.value.trim();
    if (!text || isBusy(store.state)) return;
    unconfirmed = prompt.value;
    prompt.value = "";
    autoGrow();
    try {
      await actions.send(text);
    } catch (err) {
      restoreDraft();
      toast(err.message);
    }
    update();
  }

  function restoreDraft() {
    if (unconfirmed !== null && !prompt.value) {
      prompt.value = unconfirmed;
      autoGrow();
    }
    unconfirmed = null;
  }

  function stop() {
    actions.stop();
    prompt.focus();
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    submit();
  });
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submit();
    } else if (e.key === "ArrowUp" && !prompt.value && !e.altKey && !e.ctrlKey && !e.metaKey && !e.shiftKey) {
      e.preventDefault();
      editLast();
    }
  });
  prompt.addEventListener("input", () => {
    autoGrow();
    update();
  });
  stopBtn.addEventListener("click", stop);

  store.subscribe((state, action) => {
    if (action.type === "thread" && unconfirmed !== null) unconfirmed = null;
    if (action.type === "error") restoreDraft();
    if (["thread", "show", "sending", "finished", "error"].includes(action.type)) update();
  });

  return { focus: () => prompt.focus(), stop, update };
}
