// The node page: everything live arrives over the websocket (live.js), nothing is polled:
// policy changes, kept receipts, repair passes, the process list (node.processes, every beat
// tick), the runtime (runtime.status, each worker publish and heartbeat). The network summary is
// fetched once per network.changed push (a gossip merge stored or dropped records). First paint
// of the runtime and network cards comes from the server (json_script).
import { onEvent, providerLabel } from "./live.js";
import { duration } from "./util.js";

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
      [proc.name, proc.state, proc.pid || "–", duration(proc.uptime_s), proc.restarts].forEach(function (v, i) {
        const cell = document.createElement("td");
        cell.textContent = v;
        if (i === 1) cell.className = "state-" + proc.state;
        if (i === 3) cell.className = "nowrap";
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
      (status.gpu_backend_active ? " (GPU)" : "") + "; demand " + status.committed_tps + " rows/s, capacity " +
      status.capacity_tps + " rows/s" +
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
      ["just now", r.model_id, r.layer, r.expert, providerLabel(r.provider_id), r.tokens,
       r.commitment_hash.slice(0, 16) + "…", r.dispute || "–"].forEach(function (v) {
        const cell = document.createElement("td");
        cell.append(v);
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

  onEvent("policy.changed", function (payload) { showPolicy(payload.policy); });
  onEvent("receipts.kept", function (payload) { showReceiptsKept(payload.receipts); });
  onEvent("repair.pass", function (payload) { showRepairPass(payload.pass); });

  let gossipTimer = null;
  function refreshNetwork() {
    gossipTimer = null;
    fetch("/api/network/gossip").then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) showNetwork(s); }).catch(function () {});
  }

  onEvent("node.processes", showProcesses);
  onEvent("runtime.status", showRuntime);
  onEvent("network.changed", function () {
    if (gossipTimer === null) gossipTimer = setTimeout(refreshNetwork, 200);  // coalesce a burst of merges
  });

  showRuntime(JSON.parse(document.getElementById("runtime-initial").textContent));
  showNetwork(JSON.parse(document.getElementById("gossip-initial").textContent));
