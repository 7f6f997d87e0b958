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

// Each failure the forward survived, with what it was: a stall is the primary a hedge raced out.
function failures(list) {
  const cell = document.createDocumentFragment();
  if (!list.length) { cell.append("–"); return cell; }
  list.forEach(function (x, i) {
    const what = document.createElement("span");
    if (x.reason === "stalled") {
      what.className = "muted"; what.textContent = "stalled, hedged";
      what.title = "the primary was slow; a hedge to a backup answered first";
    } else {
      what.className = "warn"; what.textContent = x.reason;
    }
    cell.append(providerLabel(x.provider), " " + x.layer + "/" + x.expert + ": ", what);
    if (x.reason !== "stalled") cell.append(", retried");
    if (i < list.length - 1) cell.append(document.createElement("br"));
  });
  return cell;
}

onEvent("forward.done", function (payload) {
  const f = payload.forward;
  const tr = row(["just now", f.model_id, f.tokens, f.ok ? "ok" : "failed",
                  (f.elapsed_ms === null ? "–" : f.elapsed_ms.toFixed(1)) + " ms", f.batches,
                  f.retries + " / " + f.replans, f.hedges_fired + " / " + f.hedges_won, f.missing, holders(f.holders),
                  failures(f.failures)], {forward: f.forward_id});
  tr.cells[3].className = f.ok ? "state-running" : "state-exited";
  prependRow(body, tr, 50);
});
