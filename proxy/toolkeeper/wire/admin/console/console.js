// toolkeeper's console: the live approvals queue and its clocks. No markup is built from a value here: the
// server sends each waiting call's HTML, rendered and escaped, and this only adds and removes whole rows.
"use strict";

function duration(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return seconds + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
}

function tick() {
  const now = Date.now() / 1000;
  for (const row of document.querySelectorAll("[data-approval]")) {
    const age = row.querySelector(".age");
    if (age) age.textContent = duration(now - Number(row.dataset.created));
    const left = row.querySelector(".left");
    if (left && row.dataset.expires) left.textContent = duration(Number(row.dataset.expires) - now);
  }
}

function live(queue) {
  const source = new EventSource(queue.dataset.live);
  source.addEventListener("queue", (event) => {
    const data = JSON.parse(event.data);
    const waiting = new Set(data.rows.map((row) => row.id));
    for (const row of queue.querySelectorAll("[data-approval]")) {
      if (!waiting.has(row.dataset.approval)) row.remove();
    }
    for (const row of data.rows) {
      if (!queue.querySelector('[data-approval="' + CSS.escape(row.id) + '"]')) {
        queue.insertAdjacentHTML("beforeend", row.html);
      }
    }
    document.getElementById("empty").hidden = data.rows.length > 0;
    const grants = document.getElementById("grants");
    if (grants.dataset.shown !== data.grants) {
      grants.innerHTML = data.grants;
      grants.dataset.shown = data.grants;
    }
    tick();
    document.body.dataset.live = "on";  // tests and people can tell the stream is up
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const queue = document.getElementById("queue");
  if (queue) live(queue);
  tick();
  setInterval(tick, 1000);
});
