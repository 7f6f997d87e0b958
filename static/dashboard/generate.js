// Generate page: a prompt is started by POSTing the form (CSRF token inside); steps arrive over the
// websocket as `generation.progress` (the record without steps, plus the steps written since the
// last push). The page merges events into the selected generation by step index, so the order in which the POST's answer,
// /generate/data.json and the events arrive does not matter. No polling: the record is read once
// when a generation is selected and again when the socket (re)connects.
import { onEvent, providerLabel } from "./live.js";
import { flash, postForm, prependRow, row } from "./util.js";

const panel = document.getElementById("generation");
const list = document.querySelector("#generations tbody");
const BUFFERED = 20;  // generations whose events are kept before the page knows it wants them
const STEPS_SHOWN = 200;
const seen = new Map();  // generation_id -> {view, steps: Map(index -> step)}
let current = JSON.parse(document.getElementById("generation-data").textContent);  // null or a record

function remember(view, steps) {
  let entry = seen.get(view.generation_id);
  if (!entry) {
    entry = {view: view, steps: new Map()};
    seen.set(view.generation_id, entry);
    if (seen.size > BUFFERED) seen.delete(seen.keys().next().value);
  }
  if (newer(view, entry.view)) entry.view = view;
  steps.forEach(function (s) { entry.steps.set(s.index, s); });
  return entry;
}

// A record only grows: more tokens, or running -> done/failed. Ties keep the later copy.
function newer(a, b) {
  if (a.tokens.length !== b.tokens.length) return a.tokens.length > b.tokens.length;
  return !(a.state === "running" && b.state !== "running");
}

const text = function (id, value) { document.getElementById(id).textContent = value; };
const ms = function (v) { return v === null || v === undefined ? "–" : v.toFixed(1) + " ms"; };

function layerRows(layer) {
  const lost = (layer.lost_gate_mass === null ? "–" : layer.lost_gate_mass.toFixed(3))
    + (layer.missing ? " · " + layer.missing + " missing" : "") + (layer.failures ? " · " + layer.failures + " failed" : "");
  if (!layer.holders.length) {
    const tr = row([layer.layer, layer.ms.toFixed(1), lost, "no holder answered"], {layer: layer.layer});
    tr.className = "nobody"; tr.cells[3].colSpan = 3;
    return [tr];
  }
  return layer.holders.map(function (h, i) {
    const code = providerLabel(h.provider);
    const tr = row(i === 0 ? [layer.layer, layer.ms.toFixed(1), lost, code, h.rows, h.transport]
                           : [code, h.rows, h.transport], {layer: layer.layer});
    tr.className = "holder";
    if (i === 0) for (let c = 0; c < 3; c++) tr.cells[c].rowSpan = layer.holders.length;
    return tr;
  });
}

function stepElement(step) {
  const details = document.createElement("details");
  details.className = "step"; details.dataset.index = step.index;
  const summary = document.createElement("summary");
  const token = document.createElement("code"); token.textContent = step.token;
  summary.append("step " + step.index + " · " + step.phase + " · " + step.tokens_in + " in → ", token,
                 " · " + step.ms.toFixed(1) + " ms");
  const table = document.createElement("table"); table.className = "fanout";
  const head = table.createTHead().insertRow();
  ["Layer", "Layer ms", "Lost gate mass", "Holder", "Rows", "Transport"].forEach(function (label) {
    const th = document.createElement("th"); th.textContent = label; head.appendChild(th);
  });
  const body = table.createTBody();
  step.layers.forEach(function (layer) { layerRows(layer).forEach(function (tr) { body.appendChild(tr); }); });
  const scroll = document.createElement("div"); scroll.className = "scroll"; scroll.appendChild(table);
  details.append(summary, scroll);
  return details;
}

function showSteps(steps) {
  const box = document.getElementById("gen-steps");
  const sorted = Array.from(steps.values()).sort(function (a, b) { return a.index - b.index; });
  sorted.forEach(function (step) {
    if (box.querySelector('details[data-index="' + step.index + '"]')) return;
    const after = Array.from(box.children).find(function (d) { return Number(d.dataset.index) > step.index; });
    const element = stepElement(step);
    box.insertBefore(element, after || null);
  });
  while (box.children.length > STEPS_SHOWN) box.firstElementChild.remove();
  const last = box.lastElementChild;
  box.querySelectorAll("details[open]").forEach(function (d) { if (d !== last) d.open = false; });
  if (last) last.open = true;
}

function show() {
  if (!current) return;
  const entry = remember(current, current.steps || []);
  const view = entry.view;
  panel.hidden = false; panel.dataset.generation = view.generation_id;
  text("gen-id", view.generation_id.slice(0, 12)); document.getElementById("gen-id").title = view.generation_id;
  const state = document.getElementById("gen-state");
  state.textContent = view.state; state.className = "state-" + view.state;
  text("gen-model", view.model_id);
  text("gen-prompt", view.prompt_ids.join(", "));
  const tokens = document.getElementById("gen-tokens");
  const shown = tokens.querySelectorAll("code.tok").length;
  if (shown > view.tokens.length) tokens.replaceChildren();
  view.tokens.slice(tokens.querySelectorAll("code.tok").length).forEach(function (t) {
    const code = document.createElement("code"); code.className = "tok"; code.textContent = t;
    tokens.append(code, " "); flash(code);
  });
  text("gen-count", view.tokens.length + " / " + view.max_new_tokens);
  text("gen-text", view.text || "");  // the record's text grows with each batch of steps
  text("gen-finish", view.finish_reason || "");
  text("gen-ttft", ms(view.ttft_ms));
  text("gen-rate", view.decode_tokens_per_s === null ? "–" : view.decode_tokens_per_s.toFixed(1) + " tokens/s");
  text("gen-options", "wire " + (view.options.wire || "default") + ", "
       + (view.options.allow_partial ? "partial allowed" : "no partial layers"));
  const error = document.getElementById("gen-error");
  error.hidden = !view.error; error.textContent = view.error ? view.error.reason + ": " + view.error.message : "";
  showSteps(entry.steps);
}

// The whole record (steps included), merged with whatever the events already brought.
function load(generationId) {
  return fetch("/generate/data.json?id=" + encodeURIComponent(generationId), {credentials: "same-origin"})
    .then(function (r) { return r.ok ? r.json() : null; })
    .then(function (record) {
      if (!record || !current || current.generation_id !== record.generation_id) return;
      remember(record, record.steps);
      current = Object.assign({}, seen.get(record.generation_id).view, {steps: []});
      show();
    });
}

// A generation the page just started: events may have come before the POST's answer did.
function select(generationId) {
  document.getElementById("gen-tokens").replaceChildren();
  document.getElementById("gen-steps").replaceChildren();
  list.querySelectorAll("tr").forEach(function (tr) {
    tr.classList.toggle("self", tr.dataset.generation === generationId);
  });
  const known = seen.get(generationId);
  current = known ? Object.assign({}, known.view, {steps: []}) : {generation_id: generationId};  // until loaded
  if (known) show();
  return load(generationId);
}

function listRow(view) {
  const link = document.createElement("a");
  link.href = "?id=" + view.generation_id;
  const code = document.createElement("code"); code.textContent = view.generation_id.slice(0, 12); link.appendChild(code);
  const tr = row([view.created_at.slice(0, 19).replace("T", " "), link, view.model_id, view.state, view.prompt_ids.length,
                  view.tokens.length + " / " + view.max_new_tokens, ms(view.ttft_ms),
                  view.decode_tokens_per_s === null ? "–" : view.decode_tokens_per_s.toFixed(1) + " tokens/s"],
                 {generation: view.generation_id});
  tr.cells[3].className = "state-" + view.state;
  if (current && current.generation_id === view.generation_id) tr.classList.add("self");
  return tr;
}

onEvent("generation.progress", function (payload) {
  const view = payload.generation;
  // a push carries the steps written since the last one (the worker writes them in batches)
  const entry = remember(view, view.steps || (view.step ? [view.step] : []));
  const old = list.querySelector('tr[data-generation="' + view.generation_id + '"]');
  if (old) old.replaceWith(listRow(entry.view)); else prependRow(list, listRow(entry.view), 30);
  if (current && current.generation_id === view.generation_id) {
    current = Object.assign({}, entry.view, {steps: []});
    show();
  }
});

// (Re)connected: events sent while the socket was down are gone; the record has them.
onEvent("hello", function () { if (current) load(current.generation_id); });

const form = document.getElementById("generate-form");
if (form) {
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const error = document.getElementById("generate-error");
    error.hidden = true;
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    postForm(form).then(function (answer) {
      button.disabled = false;
      if (!answer.ok) {
        error.textContent = answer.data.message || "refused (" + answer.status + ")";
        error.hidden = false;
        return;
      }
      history.pushState(null, "", "?id=" + answer.data.generation_id);
      select(answer.data.generation_id);
    }, function () { button.disabled = false; error.textContent = "the node did not answer"; error.hidden = false; });
  });
}

if (current) show();
