// The shard map page: a layer × expert heatmap of replication drawn as inline SVG from the JSON
// the server embedded; a shardmap.changed event naming this model refetches it (one GET) and redraws.
import { onEvent, providerLabel } from "./live.js";

const SVG = "http://www.w3.org/2000/svg";
const heatmap = document.getElementById("heatmap");
const select = document.getElementById("model");
let grid = JSON.parse(document.getElementById("shardmap-data").textContent);
let model = heatmap.dataset.model;
let selected = null;  // [layer, expert] whose holders are shown

// Replication 0 is pale red (nobody holds it); 1..max_replication runs light to dark blue;
// above max_replication is purple (more copies than the policy wants).
function colour(r, policy) {
  if (r === 0) return "#fbd5d5";
  if (r > policy.max_replication) return "#6b46c1";
  const t = policy.max_replication <= 1 ? 1 : (r - 1) / (policy.max_replication - 1);
  const light = [198, 219, 239], dark = [8, 69, 148];
  const c = light.map(function (v, i) { return Math.round(v + (dark[i] - v) * t); });
  return "rgb(" + c.join(",") + ")";
}

function drawLegend(policy) {
  const legend = document.getElementById("legend");
  const items = [[colour(0, policy), "0 (unheld)"]];
  for (let r = 1; r <= Math.min(policy.max_replication, 8); r++) items.push([colour(r, policy), String(r)]);
  if (policy.max_replication > 8) items.push([colour(policy.max_replication, policy), String(policy.max_replication)]);
  items.push([colour(policy.max_replication + 1, policy), "> max"]);
  legend.replaceChildren(...items.map(function ([fill, text]) {
    const span = document.createElement("span");
    span.innerHTML = '<span class="swatch"></span>';
    span.firstChild.style.background = fill;
    span.append(text);
    return span;
  }));
  const under = document.createElement("span");
  under.innerHTML = '<span class="swatch" style="border:2px solid #c53030"></span>under-replicated (&lt; ' +
    policy.min_replication + ")";
  const hot = document.createElement("span");
  hot.innerHTML = '<span class="swatch" style="background:#dd6b20;border-radius:50%"></span>hot (≥ ' +
    policy.hot_threshold_tps + " tokens/s of demand)";
  legend.append(under, hot);
}

function draw() {
  if (!grid) { heatmap.replaceChildren(); return; }
  document.getElementById("shardmap-summary").textContent = grid.covered_experts + " experts held by " +
    grid.distinct_providers + " providers; " + grid.n_layers + " layers × " + grid.n_experts + " experts";
  const notice = document.getElementById("shardmap-unannounced");
  notice.hidden = !grid.unannounced;
  notice.textContent = grid.unannounced ? "This node's " + grid.unannounced.experts +
    " experts are drawn but not announced: " + grid.unannounced.reason + "." : "";
  document.getElementById("policy-min").textContent = grid.policy.min_replication;
  document.getElementById("policy-max").textContent = grid.policy.max_replication;
  document.getElementById("policy-hot").textContent = grid.policy.hot_threshold_tps;
  drawLegend(grid.policy);
  if (grid.too_large) { heatmap.textContent = "The map is too large to draw."; return; }
  const L = grid.n_layers, E = grid.n_experts;
  // Cells as large as the card allows (up to 44 px), never under 10: a wide map scrolls in its box.
  const left = 52, top = 40, room = Math.max(200, heatmap.parentElement.clientWidth - left - 8);
  const cell = Math.max(10, Math.min(44, Math.floor(room / Math.max(E, 1))));
  const every = Math.max(1, Math.ceil(24 / cell));
  const under = new Set(grid.under.map(function (p) { return p[0] * E + p[1]; }));
  const parts = [];
  for (let l = 0; l < L; l++) {
    if (l % every === 0) parts.push('<text x="' + (left - 4) + '" y="' + (top + l * cell + cell * 0.75) + '" text-anchor="end" font-size="9">' + l + "</text>");
    for (let e = 0; e < E; e++) {
      const r = grid.replication[l * E + e];
      const u = under.has(l * E + e);
      parts.push('<rect class="cell" data-cell="' + l + "-" + e + '" data-replication="' + r + '" x="' + (left + e * cell) + '" y="' +
        (top + l * cell) + '" width="' + (cell - 1) + '" height="' + (cell - 1) + '" fill="' + colour(r, grid.policy) + '"' +
        (u ? ' stroke="#c53030" stroke-width="1"' : "") + "><title>layer " + l + " expert " + e + ": " + r +
        (u ? " (under-replicated)" : "") + "</title></rect>");
      if (cell >= 18) {  // the count itself, so 2 and 3 copies read apart without comparing shades
        parts.push('<text class="count" pointer-events="none" x="' + (left + e * cell + cell / 2 - 0.5) + '" y="' +
          (top + l * cell + cell / 2 + 3.5) + '" text-anchor="middle" font-size="' + Math.min(13, cell / 2.2) +
          '" fill="' + (r >= 0.5 * grid.policy.max_replication || r > grid.policy.max_replication ? "#fff" : "#1d2330") +
          '">' + r + "</text>");
      }
    }
  }
  parts.push('<text x="' + (left + Math.min(E * cell, room) / 2) + '" y="11" text-anchor="middle" font-size="11" ' +
    'font-weight="600">expert →</text>');
  parts.push('<text x="12" y="' + (top + Math.min(L * cell, 400) / 2) + '" text-anchor="middle" font-size="11" ' +
    'font-weight="600" transform="rotate(-90 12 ' + (top + Math.min(L * cell, 400) / 2) + ')">layer →</text>');
  for (let e = 0; e < E; e += every) {
    parts.push('<text x="' + (left + e * cell + cell / 2) + '" y="' + (top - 6) + '" text-anchor="middle" font-size="9">' + e + "</text>");
  }
  const dot = Math.max(2, cell / 6);  // a hot expert's mark, in the cell's corner (its count stays legible)
  grid.hot.forEach(function ([l, e]) {
    parts.push('<circle class="hot" data-hot="' + l + "-" + e + '" pointer-events="none" cx="' +
      (left + e * cell + cell - dot - 1.5) + '" cy="' + (top + l * cell + dot + 0.5) + '" r="' + dot +
      '" fill="#dd6b20" stroke="#fff" stroke-width="0.5"/>');
  });
  const width = left + E * cell + 4, height = top + L * cell + 4;
  heatmap.innerHTML = '<svg xmlns="' + SVG + '" width="' + width + '" height="' + height + '" viewBox="0 0 ' + width + " " + height + '">' +
    parts.join("") + "</svg>";
  if (selected) markSelected();
}

function markSelected() {
  heatmap.querySelectorAll("rect.selected").forEach(function (r) { r.classList.remove("selected"); });
  const rect = heatmap.querySelector('rect[data-cell="' + selected[0] + "-" + selected[1] + '"]');
  if (rect) rect.classList.add("selected");
}

function showHolders(entry) {
  document.getElementById("cell-card").hidden = false;
  document.getElementById("cell-layer").textContent = entry.layer;
  document.getElementById("cell-expert").textContent = entry.expert;
  document.getElementById("cell-replication").textContent = entry.replication;
  const body = document.querySelector("#cell-holders tbody");
  if (!entry.holders.length) {
    body.innerHTML = '<tr><td colspan="6">Nobody holds this expert.</td></tr>';
    return;
  }
  body.replaceChildren(...entry.holders.map(function (h) {
    const row = document.createElement("tr");
    row.dataset.provider = h.provider;
    [providerLabel(h.provider), h.residency, h.committed_tps, h.capacity_tps, h.blob_uri || "–",
     h.reputation.toFixed(3)].forEach(function (v, i) {
      const td = document.createElement("td");
      if (i === 0) {
        td.append(v);
        if (h.announced === false) td.append(" (this node, unannounced)");
      } else if (i === 4) { const code = document.createElement("code"); code.textContent = v; td.appendChild(code); }
      else td.textContent = v;
      row.appendChild(td);
    });
    return row;
  }));
}

function fetchHolders() {
  const q = new URLSearchParams({ model: model, layer: selected[0], expert: selected[1] });
  fetch("/shardmap/cell.json?" + q).then(function (r) { return r.json(); }).then(showHolders);
}

heatmap.addEventListener("click", function (event) {
  const rect = event.target.closest("rect.cell");
  if (!rect) return;
  selected = rect.dataset.cell.split("-").map(Number);
  markSelected();
  fetchHolders();
});

function refetch() {
  fetch("/shardmap/data.json?" + new URLSearchParams({ model: model }))
    .then(function (r) { return r.json(); })
    .then(function (data) { grid = data; draw(); if (selected) fetchHolders(); });
}

onEvent("shardmap.changed", function (payload) {
  if (!model && payload.model_ids.length) {  // the first model to appear: adopt it
    model = payload.model_ids[0];
    heatmap.dataset.model = model;
    select.replaceChildren(new Option(model, model, true, true));
  }
  if (payload.model_ids.includes(model)) refetch();
});

draw();
