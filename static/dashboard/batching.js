// Generate page, continuous batching: the router's running and waiting generations, its KV cache, the
// aggregate tokens/s and a bar per recent iteration (its batch size). Read once from
// /generate/batching.json when the page opens and when the socket (re)connects; then each
// `generation.batching` push (at most twice a second while generations run) replaces it.
import { onEvent } from "./live.js";

const text = function (id, value) { document.getElementById(id).textContent = value; };
const mib = function (n) { return (n / 1048576).toFixed(1) + " MiB"; };

function render(view) {
  text("batch-running", view.running + " of " + view.max_concurrent);
  text("batch-queued", String(view.queued));
  text("batch-kv", mib(view.kv_bytes) + " of " + mib(view.kv_budget_bytes));
  text("batch-rate", view.tokens_per_s.toFixed(1) + " (last " + view.window_s + " s)");
  const largest = Math.max(1, view.max_concurrent);
  const bars = view.iterations.map(function (it) {
    const bar = document.createElement("span");
    bar.style.height = Math.max(3, Math.round(100 * it.batch / largest)) + "%";
    bar.dataset.batch = it.batch;
    bar.title = it.model_id + ": batch " + it.batch + ", " + it.rows + " rows, " + it.ms.toFixed(1) + " ms";
    return bar;
  });
  document.getElementById("batch-bars").replaceChildren(...bars);
}

function load() {
  return fetch("/generate/batching.json", {credentials: "same-origin"})
    .then(function (r) { return r.ok ? r.json() : null; })
    .then(function (view) { if (view) render(view); }, function () {});
}

onEvent("generation.batching", function (payload) { render(payload.batching); });
onEvent("hello", load);
load();
