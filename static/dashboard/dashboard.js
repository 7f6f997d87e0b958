// Live dashboard: policy changes arrive over the websocket; process states are polled.
(function () {
  "use strict";
  const badge = document.getElementById("live-status");

  function setBadge(state, text) {
    badge.dataset.state = state;
    badge.textContent = text;
    badge.className = "badge " + (state === "live" ? "badge-live" : state === "down" ? "badge-down" : "badge-wait");
  }

  function showPolicy(policy) {
    document.getElementById("policy-id").textContent = policy.id;
    document.getElementById("policy-decided-by").textContent = policy.decided_by || "genesis";
    document.querySelectorAll("#policy td[data-field]").forEach(function (cell) {
      const value = String(policy[cell.dataset.field]);
      if (cell.textContent !== value) {
        cell.textContent = value;
        cell.classList.remove("flash"); void cell.offsetWidth; cell.classList.add("flash");
      }
    });
  }

  function showProcesses(data) {
    const body = document.querySelector("#processes tbody");
    if (!data.processes.length) return;
    body.replaceChildren(...data.processes.map(function (proc) {
      const row = document.createElement("tr");
      row.dataset.process = proc.name;
      [proc.name, proc.state, proc.pid || "–", Math.round(proc.uptime_s) + " s", proc.restarts].forEach(function (v, i) {
        const cell = document.createElement("td");
        cell.textContent = v;
        if (i === 1) cell.className = "state-" + proc.state;
        row.appendChild(cell);
      });
      return row;
    }));
    const age = data.celery_heartbeat_age_s;
    document.getElementById("celery-heartbeat").textContent = age === null ? "none yet" : age + " s ago";
  }

  let retryMs = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/dashboard/");
    socket.onopen = function () { retryMs = 500; setBadge("live", "live"); };
    socket.onmessage = function (message) {
      const data = JSON.parse(message.data);
      if (data.event === "policy.changed") showPolicy(data.payload.policy);
    };
    socket.onclose = function () {
      setBadge("down", "disconnected, retrying");
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  function poll() {
    fetch("/api/node/processes").then(function (r) { return r.json(); }).then(showProcesses).catch(function () {});
  }

  connect();
  setInterval(poll, 5000);
})();
