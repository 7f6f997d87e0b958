// The network page: rows are server-rendered; a network.changed push (ids stored or dropped by a
// gossip merge, and the alive_ms of the heartbeats it brought) fetches just the changed rows as an
// HTML fragment and moves the others' liveness in place. Ages count up locally between pushes, offset
// by the server's clock at render; alive / suspect / dead as apps/dashboard/pages_node.py liveness().
// A dropped provider stays a minute, marked dead, so the operator sees it go.
import { onEvent } from "./live.js";

const body = document.querySelector("#providers tbody");
const skewMs = Number(body.dataset.nowMs) - Date.now();  // server clock minus this browser's
const heartbeatS = Number(body.dataset.heartbeatS);
const ttlS = Number(body.dataset.ttlS);
const GONE_KEPT_MS = 60000;

function liveness(ageS) {
  if (ageS >= ttlS) return "dead";
  return ageS <= 2 * heartbeatS ? "alive" : "suspect";
}

function showLiveness(row, state) {
  const badge = row.querySelector(".liveness");
  if (badge.textContent !== state) {
    badge.textContent = state;
    badge.className = "liveness " + state;
  }
}
let pending = new Set();
let timer = null;

function tickAges() {
  const now = Date.now() + skewMs;
  body.querySelectorAll("tr[data-alive-ms]").forEach(function (row) {
    const age = Math.max(0, Math.round((now - Number(row.dataset.aliveMs)) / 1000));
    row.querySelector(".age").textContent = age + " s ago";
    showLiveness(row, row.classList.contains("gone") ? "dead" : liveness(age));
  });
}

function updateCount() {
  document.getElementById("provider-count").textContent =
    String(body.querySelectorAll("tr[data-provider]:not(.gone)").length);
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
    if (!row || row.classList.contains("gone")) return;
    row.classList.add("gone");
    showLiveness(row, "dead");
    setTimeout(function () { if (row.classList.contains("gone")) row.remove(); }, GONE_KEPT_MS);
  });
  Object.entries(payload.alive || {}).forEach(function ([pid, aliveMs]) {
    const row = body.querySelector('tr[data-provider="' + pid + '"]');
    if (row && Number(aliveMs) > Number(row.dataset.aliveMs)) row.dataset.aliveMs = String(aliveMs);
  });
  updateCount();
  tickAges();
  payload.changed.forEach(function (pid) { pending.add(pid); });
  if (pending.size && timer === null) timer = setTimeout(fetchRows, 200);
});

tickAges();
setInterval(tickAges, 1000);
