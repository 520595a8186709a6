"""The proxy's chat page (``GET /chat``): one HTML file, no build step.

It is the reference for a chat UI's side of resuming: it streams an answer with ``fetch``,
keeps the answer's id (``x-streamres-answer``) and the number of the last event it showed in
``localStorage`` with the text, and when the page is reloaded — or its connection drops — it
asks ``GET /v1/answers/{id}/events`` with ``Last-Event-ID`` and shows the rest, each part once.
It shows the proxy's status events (``x-streamres-status: events``) as a line under the answer,
and Stop ends the answer on purpose (``POST /v1/answers/{id}/stop``); a stopped answer keeps a
"stopped" mark. Enter sends (Shift+Enter, or Enter while an input method composes, is a new
line); the conversation follows the answer down unless the reader has scrolled up; the model
picker starts on the first fallback chain the proxy lists.
"""

from __future__ import annotations

__all__ = ["CHAT_HTML"]

CHAT_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>streamres chat</title>
<style>
  body { font: 16px/1.5 system-ui, sans-serif; margin: 0; background: #f7f9fa; color: #1b1f23; }
  main { max-width: 46rem; margin: 0 auto; padding: 1rem; }
  h1 { font-size: 1.1rem; margin: 0 0 1rem; }
  .msg { white-space: pre-wrap; padding: .6rem .8rem; border-radius: .5rem; margin: .5rem 0; }
  .msg[data-role="user"] { background: #dbeafe; margin-left: 3rem; }
  .msg[data-role="assistant"] { background: #fff; border: 1px solid #e3e6e8; margin-right: 3rem; }
  #status { color: #6a737d; font-size: .85rem; min-height: 1.3rem; }
  form { display: flex; gap: .5rem; flex-wrap: wrap; margin-top: 1rem; }
  textarea { flex: 1 1 100%; min-height: 4rem; font: inherit; padding: .5rem; }
  button, select, input { font: inherit; padding: .3rem .7rem; }
  .error { color: #b31d28; }
  .mark { display: block; color: #6a737d; font-size: .8rem; font-style: italic; }
</style>
</head>
<body>
<main>
  <h1>streamres chat</h1>
  <div id="log"></div>
  <div id="status" aria-live="polite"></div>
  <form id="ask">
    <textarea id="q" placeholder="Ask something" required></textarea>
    <select id="model" aria-label="model"></select>
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" disabled>Stop</button>
    <button id="clear" type="button">New chat</button>
    <input id="key" type="password" placeholder="client key (if the proxy needs one)"
           aria-label="client key" autocomplete="off">
  </form>
</main>
<script>
"use strict";
const KEY = "streamres.chat";
const state = JSON.parse(localStorage.getItem(KEY) || "null") || { messages: [], answer: null };
const $ = (id) => document.getElementById(id);
$("key").value = localStorage.getItem(KEY + ".key") || "";
$("key").onchange = () => localStorage.setItem(KEY + ".key", $("key").value);

function save() { localStorage.setItem(KEY, JSON.stringify(state)); }
function say(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}
function headers(extra) {
  const h = { "content-type": "application/json", "x-streamres-status": "events", ...extra };
  if ($("key").value) h.authorization = "Bearer " + $("key").value;
  return h;
}
function bubble(role, text, stopped) {
  const div = document.createElement("div");
  div.className = "msg"; div.dataset.role = role; div.textContent = text;
  if (stopped) {
    div.dataset.stopped = "true";
    const mark = document.createElement("span");
    mark.className = "mark"; mark.textContent = "stopped";
    div.append(mark);
  }
  return div;
}
function atBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 48;
}
function render() {
  const follow = atBottom();   // a reader who scrolled up to read is left where they are
  const log = $("log");
  log.replaceChildren(...state.messages.map((m) => bubble(m.role, m.content, m.stopped)));
  const a = state.answer;
  if (a) {
    const div = bubble("assistant", a.text);
    div.id = "answer"; div.dataset.state = a.error ? "error" : "streaming";
    log.append(div);
  }
  $("send").disabled = !!a; $("stop").disabled = !a || !a.id;
  document.body.dataset.state = a ? "answering" : "idle";
  if (follow) window.scrollTo(0, document.documentElement.scrollHeight);
}

function event(ev) {
  const a = state.answer;
  if (!a) return;
  if (ev.id !== null) a.last = ev.id;
  if (ev.event === "streamres.status") {
    say(JSON.parse(ev.data).message);
  } else if (ev.event === "streamres.stopped") {
    a.stopped = true;
  } else if (ev.data === "[DONE]") {
    a.done = true;
  } else if (ev.data) {
    const d = JSON.parse(ev.data);
    if (d.error) { a.error = d.error.message; }
    for (const c of d.choices || []) {
      if (c.delta && c.delta.content) a.text += c.delta.content;
    }
    if (d.id && !a.id) a.id = d.id;
  }
  save(); render();   // the text and the last event's number are kept together
}

async function read(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\\n\\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev = { id: null, event: null, data: "" };
      for (const line of block.split("\\n")) {
        if (!line || line[0] === ":") continue;
        const j = line.indexOf(":");
        const name = j < 0 ? line : line.slice(0, j);
        let value = j < 0 ? "" : line.slice(j + 1);
        if (value[0] === " ") value = value.slice(1);
        if (name === "data") ev.data += (ev.data ? "\\n" : "") + value;
        else if (name === "id") ev.id = value;
        else if (name === "event") ev.event = value;
      }
      event(ev);
    }
  }
}

function finish() {
  const a = state.answer;
  if (!a) return;
  if (a.done) {
    state.messages.push({ role: "assistant", content: a.text, stopped: !!a.stopped });
    state.answer = null;
    say("");
  } else if (a.error) {
    say(a.error, true);
    if (a.text) state.messages.push({ role: "assistant", content: a.text });
    state.answer = null;
  }
  save(); render();
}

// Read the answer on from the last event shown, until it ends; a dropped connection (or a
// proxy restarting) is tried again, the wait doubling up to 5 s.
async function follow() {
  let wait = 250;
  while (state.answer && !state.answer.done && !state.answer.error) {
    const a = state.answer;
    try {
      const h = headers(a.last === null ? {} : { "last-event-id": a.last });
      const r = await fetch("/v1/answers/" + encodeURIComponent(a.id) + "/events", { headers: h });
      if (r.status >= 400 && r.status < 500) {
        const body = await r.json().catch(() => ({}));
        a.error = (body.error && body.error.message) || "the answer cannot be read again";
        break;
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      say("");
      await read(r);
      wait = 250;
    } catch (e) {
      say("connection lost — picking the answer up again…");
      await new Promise((ok) => setTimeout(ok, wait));
      wait = Math.min(wait * 2, 5000);
    }
  }
  finish();
}

async function ask(question) {
  state.messages.push({ role: "user", content: question });
  state.answer = { id: null, text: "", last: null, done: false, error: null };
  save(); render();
  const messages = state.messages.map((m) => ({ role: m.role, content: m.content }));
  const body = { model: $("model").value || "demo", messages, stream: true };
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body),
    });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      state.answer.error = (err.error && err.error.message) || "HTTP " + r.status;
      return finish();
    }
    state.answer.id = r.headers.get("x-streamres-answer");
    save(); render();
    await read(r);
  } catch (e) {
    if (!state.answer.id) { state.answer.error = "no connection to the proxy"; return finish(); }
  }
  await follow();
}

$("q").onkeydown = (e) => {
  // Enter sends; Shift+Enter is a new line, and so is the Enter that ends an input method's
  // composition (typing Chinese: it picks the characters, it does not send).
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
    e.preventDefault();
    $("ask").requestSubmit();
  }
};
$("ask").onsubmit = (e) => {
  e.preventDefault();
  const q = $("q").value.trim();
  if (q && !state.answer) { $("q").value = ""; ask(q); }
};
$("stop").onclick = async () => {
  const a = state.answer;
  if (a && a.id) {
    const url = "/v1/answers/" + encodeURIComponent(a.id) + "/stop";
    await fetch(url, { method: "POST", headers: headers() });
  }
};
$("clear").onclick = () => { if (!state.answer) { state.messages = []; save(); render(); } };

fetch("/v1/models", { headers: headers() }).then((r) => r.json()).then((m) => {
  for (const model of m.data || []) {
    const o = document.createElement("option"); o.value = o.textContent = model.id;
    $("model").append(o);
  }
  // The proxy lists its fallback chains first: the picker starts on the first of them.
}).catch(() => {});

render();
if (state.answer && state.answer.id) follow();   // reloaded mid-answer: pick it up
else if (state.answer) { state.answer.error = "the answer was lost before it began"; finish(); }
</script>
</body>
</html>
"""
