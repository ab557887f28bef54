// STAR pages: streamed replies in the red-team chat, 1-9 keys on the rating form, Ctrl+Enter submitting
// the form being filled in (never while a reply streams: the server refuses a message before the reply,
// and finishing then would drop the exchange), the break reminder.
// Everything here is an enhancement: without JavaScript the forms post and the server does the same work.
"use strict";

(function () {
  function csrfOf(form) {
    const field = form.querySelector('input[name="csrf_token"]');
    return field ? field.value : "";
  }

  function addTurn(list, role, text) {
    const item = document.createElement("li");
    item.className = "turn " + role;
    item.id = "turn-" + list.children.length;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Model";
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    item.append(who, body);
    list.append(item);
    return item;
  }

  // Server-sent events from a fetch() body: "event: NAME\ndata: {json}\n\n" blocks.
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        onEvent(name, data ? JSON.parse(data).text : "");
      }
    }
  }

  // Whether a reply is on its way: one at a time, and the finish form waits for it.
  function replying() {
    return document.body.dataset.replying === "true";
  }

  async function streamReply(form, list, status) {
    const chatForm = document.getElementById("chat-form");
    const message = form.querySelector("textarea");
    if (replying() || (message && !message.value.trim())) return;  // the typed text stays in the box
    const body = new URLSearchParams(new FormData(form));
    if (message) {
      addTurn(list, "user", message.value.trim());
      message.value = "";
    }
    const buttons = document.querySelectorAll("#chat-form button, #reply-form button, #finish-form button");
    buttons.forEach((b) => { b.disabled = true; });
    document.body.dataset.replying = "true";
    status.classList.remove("error");
    status.textContent = "The model is replying…";
    const reply = addTurn(list, "assistant", "");
    reply.classList.add("streaming");
    reply.dataset.chunks = "0";
    const text = reply.querySelector(".text");
    let failed = null;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        headers: { "X-CSRF-Token": csrfOf(form), Accept: "text/event-stream" },
        body: body,
      });
      if (!response.ok || !response.body) throw new Error("the server answered " + response.status);
      await readEvents(response, (name, value) => {
        if (name === "status") {
          status.textContent = value;  // the model is loading first, and about how long that takes
        } else if (name === "delta") {
          if (reply.dataset.chunks === "0") status.textContent = "The model is replying…";
          text.textContent += value;
          reply.dataset.chunks = String(Number(reply.dataset.chunks) + 1);
        } else if (name === "done") {
          text.textContent = value;
          reply.dataset.done = "true";
        } else if (name === "error") {
          failed = value;
        }
      });
    } catch (error) {
      failed = String(error.message || error);
    }
    reply.classList.remove("streaming");
    buttons.forEach((b) => { b.disabled = false; });
    delete document.body.dataset.replying;
    if (failed !== null) {
      reply.remove();
      status.textContent = "No reply: " + failed + ". Reload the page to ask for it again.";
      status.classList.add("error");
      return;
    }
    status.textContent = "";
    const retry = document.getElementById("reply-form");
    if (retry) retry.remove();
    const refused = document.getElementById("finish-error");  // "send a message first" holds no more
    if (refused) refused.remove();
    if (chatForm) {
      chatForm.hidden = false;
      chatForm.querySelector("textarea").focus();
    }
  }

  function setUpChat() {
    const list = document.getElementById("dialogue");
    const chatForm = document.getElementById("chat-form");
    if (!list || !chatForm || !window.fetch || !window.TextDecoder) return;
    const status = chatForm.querySelector(".chat-status");
    document.querySelectorAll("form[data-stream]").forEach((form) => {
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        streamReply(form, list, status);
      });
    });
    const finish = document.getElementById("finish-form");
    if (finish) {
      finish.addEventListener("submit", (event) => {
        if (replying()) event.preventDefault();  // finishing now would leave the exchange out
      });
    }
  }

  // Ctrl+Enter (Cmd+Enter on a Mac) submits the form that has the focus, on every STAR page, or the rating
  // form when nothing has the focus yet (after the number keys, say). requestSubmit runs the browser's own
  // checks (a point and a reason are required) and the form's submit handlers (the chat streams its reply).
  function setUpKeyboardSubmit() {
    document.addEventListener("keydown", (event) => {
      if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey) || event.defaultPrevented) return;
      const target = event.target;
      const form = (target && target.closest && target.closest("form")) || document.querySelector("form.rating-form");
      if (!form || form.hidden || !form.closest("main")) return;  // the page's forms, not sign-out
      event.preventDefault();
      if (replying()) return;  // sending or finishing waits for the reply on its way
      form.requestSubmit();
    });
  }

  // Number keys choose a rating point, unless the person is typing (the reason box).
  function setUpRatingKeys() {
    const form = document.querySelector("form.rating-form");
    if (!form) return;
    document.addEventListener("keydown", (event) => {
      const target = event.target;
      if (event.ctrlKey || event.metaKey || event.altKey) return;
      if (target && (target.tagName === "TEXTAREA" || (target.tagName === "INPUT" && target.type === "text"))) return;
      const radio = form.querySelector('input[type="radio"][data-key="' + event.key + '"]');
      if (!radio) return;
      event.preventDefault();
      radio.checked = true;
      radio.focus();
    });
  }

  function setUpBreakReminder() {
    const box = document.getElementById("break-reminder");
    if (!box) return;
    const dueIn = Number(box.dataset.dueIn);
    if (box.hidden && dueIn > 0) {
      window.setTimeout(() => { box.hidden = false; }, dueIn * 1000);
    }
    const dismiss = box.querySelector("[data-dismiss]");
    if (dismiss) dismiss.addEventListener("click", () => { box.hidden = true; });
  }

  document.addEventListener("DOMContentLoaded", () => {
    setUpChat();
    setUpRatingKeys();
    setUpKeyboardSubmit();
    setUpBreakReminder();
  });
})();
