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

  function showRuntime(status) {
    const mib = function (b) { return (b / 1048576).toFixed(1); };
    const size = function (b) { return b >= 1048576 ? mib(b) + " MiB" : (b / 1024).toFixed(1) + " KiB"; };
    document.getElementById("runtime-summary").textContent =
      status.counts.warm + " warm, " + status.counts.cold + " cold experts, " + status.counts.gates + " gates; " +
      mib(status.memory_used_bytes) + " of " + mib(status.memory_budget_bytes) + " MiB; kernel " + status.cpu_kernel +
      (status.gpu_backend_active ? " (GPU)" : "") + "; " + status.committed_tps + " rows/s" +
      (status.stale ? " — stale: the expert worker has not reported for " + status.heartbeat_age_s + " s" : "");
    const body = document.querySelector("#experts tbody");
    body.replaceChildren(...status.experts.map(function (e) {
      const row = document.createElement("tr");
      const formats = Object.values(e.formats).join("/");
      [e.model_id, e.layer, e.expert, e.tier === "memory" ? "Warm" : "Cold", formats,
       size(e.tier === "memory" ? e.memory_bytes : e.disk_bytes)].forEach(function (v) {
        const cell = document.createElement("td");
        cell.textContent = v;
        row.appendChild(cell);
      });
      return row;
    }));
  }

  function showNetwork(status) {
    const record = status.record;
    const announced = record ? [record.http_endpoint, record.quic_endpoint].filter(Boolean).join(", ") : "";
    document.getElementById("network-summary").textContent =
      status.known_providers + " other providers known; " +
      (record ? "announcing seq " + record.seq + ", " + record.holdings + " holdings" +
        (announced ? " at " + announced : ", no endpoint") : "no record signed yet");
    const why = document.getElementById("network-not-announced");
    why.hidden = !status.not_announced_as_holder;
    why.textContent = status.not_announced_as_holder
      ? "Not announced as a holder: " + status.not_announced_as_holder + "." : "";
  }

  function showReceiptsKept(receipts) {
    const body = document.querySelector("#receipts tbody");
    const total = document.getElementById("receipts-total");
    total.textContent = String(Number(total.textContent) + receipts.length);
    receipts.slice().reverse().forEach(function (r) {  // newest first: prepend the oldest first
      const row = document.createElement("tr");
      row.dataset.receipt = r.id;
      [r.created_at, r.model_id, r.layer, r.expert, r.provider_id.slice(0, 16) + "…", r.tokens,
       r.commitment_hash.slice(0, 16) + "…", r.dispute || "–"].forEach(function (v) {
        const cell = document.createElement("td");
        cell.textContent = v;
        row.appendChild(cell);
      });
      body.prepend(row);
    });
    while (body.rows.length > 20) body.deleteRow(body.rows.length - 1);
  }

  function showRepairPass(pass) {
    const body = document.querySelector("#repair-passes tbody");
    const row = document.createElement("tr");
    row.dataset.pass = pass.id;
    const rows = pass.rows.map(function (r) {
      return r.action + " " + r.model_id + " " + r.layer + "/" + r.expert + ": " + r.outcome + (r.why ? " (" + r.why + ")" : "");
    }).join("; ") || "–";
    [pass.started_at, pass.trigger, pass.considered, pass.fetched, pass.dropped, pass.unrepairable,
     rows + (pass.error ? " " + pass.error : "")].forEach(function (v) {
      const cell = document.createElement("td");
      cell.textContent = v;
      row.appendChild(cell);
    });
    body.prepend(row);
    while (body.rows.length > 10) body.deleteRow(body.rows.length - 1);
  }

  let retryMs = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/dashboard/");
    socket.onopen = function () { retryMs = 500; setBadge("live", "live"); };
    socket.onmessage = function (message) {
      const data = JSON.parse(message.data);
      if (data.event === "policy.changed") showPolicy(data.payload.policy);
      if (data.event === "receipts.kept") showReceiptsKept(data.payload.receipts);
      if (data.event === "repair.pass") showRepairPass(data.payload.pass);
    };
    socket.onclose = function () {
      setBadge("down", "disconnected, retrying");
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  function poll() {
    fetch("/api/node/processes").then(function (r) { return r.json(); }).then(showProcesses).catch(function () {});
    fetch("/api/moe/status").then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) showRuntime(s); }).catch(function () {});
    fetch("/api/network/gossip").then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) showNetwork(s); }).catch(function () {});
  }

  connect();
  poll();
  setInterval(poll, 5000);
})();
