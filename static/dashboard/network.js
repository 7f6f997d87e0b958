// The network page: rows are server-rendered; a network.changed push (ids stored or dropped by a
// gossip merge) removes rows or fetches just the changed ones as an HTML fragment. Heartbeat ages
// count up locally from each row's alive_ms (no request), offset by the server's clock at render.
import { onEvent } from "./live.js";

const body = document.querySelector("#providers tbody");
const skewMs = Number(body.dataset.nowMs) - Date.now();  // server clock minus this browser's
let pending = new Set();
let timer = null;

function tickAges() {
  const now = Date.now() + skewMs;
  body.querySelectorAll("tr[data-alive-ms]").forEach(function (row) {
    const age = Math.max(0, Math.round((now - Number(row.dataset.aliveMs)) / 1000));
    row.querySelector(".age").textContent = age + " s ago";
  });
}

function updateCount() {
  document.getElementById("provider-count").textContent = String(body.querySelectorAll("tr[data-provider]").length);
}

function fetchRows() {
  // Coalesce: merges arrive in bursts (a sync answer, then its ack2); one fetch covers them.
  const ids = Array.from(pending);
  pending = new Set();
  timer = null;
  fetch("/network/rows/?ids=" + encodeURIComponent(ids.join(",")), { credentials: "same-origin" })
    .then(function (r) { return r.ok ? r.text() : ""; })
    .then(function (html) {
      const holder = document.createElement("tbody");
      holder.innerHTML = html;
      Array.from(holder.querySelectorAll("tr[data-provider]")).forEach(function (row) {
        const old = body.querySelector('tr[data-provider="' + row.dataset.provider + '"]');
        if (old) old.replaceWith(row); else body.appendChild(row);
        row.classList.add("flash");
      });
      updateCount();
      tickAges();
    })
    .catch(function () {});
}

onEvent("network.changed", function (payload) {
  payload.removed.forEach(function (pid) {
    const row = body.querySelector('tr[data-provider="' + pid + '"]');
    if (row) row.remove();
  });
  updateCount();
  payload.changed.forEach(function (pid) { pending.add(pid); });
  if (pending.size && timer === null) timer = setTimeout(fetchRows, 200);
});

tickAges();
setInterval(tickAges, 1000);
