// The runtime page: first paint from the server (and #runtime-initial); every runtime.status push
// (each worker publish and heartbeat) redraws the gauge, the tables and the sparklines. The last
// SPARK_POINTS committed_tps values of each holding are kept in the page only.
import { onEvent } from "./live.js";

const SPARK_POINTS = 60;
const history = new Map();  // "model/layer/expert" -> [committed_tps, ...]

function size(b) { return b >= 1048576 ? (b / 1048576).toFixed(1) + " MiB" : (b / 1024).toFixed(1) + " KiB"; }

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function sparkline(svg, points) {
  const max = Math.max(1, ...points);
  const step = points.length > 1 ? 100 / (points.length - 1) : 0;
  const coords = points.map(function (v, i) { return (i * step).toFixed(1) + "," + (22 - 20 * v / max).toFixed(1); });
  if (coords.length === 1) coords.push("100," + coords[0].split(",")[1]);
  let line = svg.querySelector("polyline");
  if (!line) {
    line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#2b6cb0");
    line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
  }
  line.setAttribute("points", coords.join(" "));
  svg.dataset.points = String(points.length);
}

function showGauge(status) {
  const budget = status.memory_budget_bytes;
  const pct = budget ? Math.round(1000 * status.memory_used_bytes / budget) / 10 : 0;
  document.getElementById("memory-arc").setAttribute("stroke-dasharray", pct + " 100");
  document.getElementById("memory-arc").setAttribute("stroke", pct > 90 ? "#c53030" : pct > 75 ? "#b7791f" : "#1f9d55");
  // a few MiB of a many-GiB budget is not "0%"
  document.getElementById("memory-pct").textContent = status.memory_used_bytes > 0 && pct < 0.1 ? "<0.1%" : pct + "%";
  const used = document.getElementById("memory-used");
  used.textContent = size(status.memory_used_bytes);
  used.dataset.bytes = String(status.memory_used_bytes);
  document.getElementById("memory-budget").textContent = size(budget);
  document.getElementById("cpu-kernel").textContent = status.cpu_kernel || "–";
  document.getElementById("backend").textContent = status.backend || "–";
  document.getElementById("gpu-active").textContent = status.gpu_backend_active ? "active" : "inactive";
  showCompute(status.compute || {candidates: [], device: null});
  document.getElementById("committed-tps").textContent = String(status.committed_tps);
  document.getElementById("capacity-tps").textContent = String(status.capacity_tps);
  document.getElementById("worker-state").textContent = status.stale
    ? "stale" + (status.heartbeat_age_s === null ? "" : " (" + status.heartbeat_age_s + " s silent)") : "reporting";
}

function showCompute(compute) {
  // why this backend runs, and the GPU device tier when there is one (docs/operations.md, "GPU backends")
  const active = compute.candidates.filter(function (c) { return c.active; });
  document.getElementById("backend-reason").textContent = active.length ? active[0].reason : "–";
  const d = compute.device;
  document.getElementById("device-memory").textContent = d
    ? size(d.memory_used_bytes) + " of " + size(d.memory_budget_bytes) + ", " + d.experts + " experts, " + d.state : "–";
}

function showExperts(status) {
  const body = document.querySelector("#runtime-experts tbody");
  const keys = new Set();
  const rows = status.experts.map(function (e) {
    const key = e.model_id + "/" + e.layer + "/" + e.expert;
    keys.add(key);
    // each expert's own demand: rows it served per wall second over the last minute
    const points = (history.get(key) || []).concat([e.committed_tps]).slice(-SPARK_POINTS);
    history.set(key, points);
    const row = document.createElement("tr");
    row.dataset.key = key;
    [e.model_id, e.layer, e.expert].forEach(function (v) { cell(row, v); });
    cell(row, e.tier === "memory" ? "Warm (memory)" : "Cold (disk)", "tier-" + e.tier);
    cell(row, e.tier === "memory" ? e.memory_bytes : e.disk_bytes);
    cell(row, Object.values(e.formats).join("/"));
    const td = cell(row, "", "spark-cell");
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 100 24");
    svg.setAttribute("width", "100");
    svg.setAttribute("height", "24");
    sparkline(svg, points);
    const tps = document.createElement("span");
    tps.className = "tps";
    tps.textContent = " " + e.committed_tps;
    td.append(svg, tps);
    return row;
  });
  for (const key of Array.from(history.keys())) if (!keys.has(key)) history.delete(key);
  if (!rows.length) {
    const row = document.createElement("tr");
    row.className = "empty";
    cell(row, "No experts held.").colSpan = 7;
    rows.push(row);
  }
  body.replaceChildren(...rows);
  document.getElementById("expert-count").textContent = String(status.experts.length);
}

function showGates(status) {
  const body = document.querySelector("#runtime-gates tbody");
  const rows = status.gates.map(function (g) {
    const row = document.createElement("tr");
    row.dataset.key = g.model_id + "/" + g.layer;
    [g.model_id, g.layer, g.router, g.n_routed, g.top_k, "Warm (memory)", g.memory_bytes].forEach(function (v) { cell(row, v); });
    return row;
  });
  if (!rows.length) {
    const row = document.createElement("tr");
    row.className = "empty";
    cell(row, "No gates held.").colSpan = 7;
    rows.push(row);
  }
  body.replaceChildren(...rows);
  document.getElementById("gate-count").textContent = String(status.gates.length);
}

function show(status) { showGauge(status); showExperts(status); showGates(status); }

show(JSON.parse(document.getElementById("runtime-initial").textContent));
onEvent("runtime.status", show);
