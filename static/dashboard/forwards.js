// Forwards page: each distributed forward this node routes arrives as `forward.done`.
import { onEvent, providerLabel } from "./live.js";
import { prependRow, row } from "./util.js";

const body = document.querySelector("#forwards tbody");

function holders(list) {
  const cell = document.createDocumentFragment();
  if (!list.length) { cell.append("–"); return cell; }
  list.forEach(function (h, i) {
    const code = providerLabel(h.provider);
    const dash = function (v) { return v === null || v === undefined ? "–" : v; };
    cell.append(code, " " + dash(h.latency_ms_median) + " / " + dash(h.latency_ms_max) + " ms");
    if (h.failures) { const w = document.createElement("span"); w.className = "warn"; w.textContent = h.failures + " failed"; cell.append(" ", w); }
    if (i < list.length - 1) cell.append(document.createElement("br"));
  });
  return cell;
}

onEvent("forward.done", function (payload) {
  const f = payload.forward;
  const tr = row([f.at.slice(0, 19), f.model_id, f.tokens, f.ok ? "ok" : "failed",
                  (f.elapsed_ms === null ? "–" : f.elapsed_ms.toFixed(1)) + " ms", f.batches, f.retries, f.replans,
                  f.missing, holders(f.holders)], {forward: f.forward_id});
  tr.cells[3].className = f.ok ? "state-running" : "state-exited";
  prependRow(body, tr, 50);
});
