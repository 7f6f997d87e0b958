// Prepare page: a job is started by POSTing the form (CSRF token inside); its progress arrives
// over the websocket as `prepare.progress` (coalesced by the node), blob URIs get copy buttons.
import { onEvent } from "./live.js";
import { copyText, flash, postForm } from "./util.js";

const jobs = document.getElementById("jobs");

function blobItem(label, uri) {
  const li = document.createElement("li");
  const name = document.createElement("span"); name.textContent = label;
  const code = document.createElement("code"); code.textContent = uri;
  const button = document.createElement("button");
  button.type = "button"; button.className = "copy"; button.dataset.copy = uri; button.textContent = "copy";
  li.append(name, " ", code, " ", button);
  return li;
}

function showJob(job, onlyIfNew) {
  let card = jobs.querySelector('article[data-job="' + job.job_id + '"]');
  if (card && onlyIfNew) return;
  if (!card) {
    card = document.createElement("article");
    card.className = "job"; card.dataset.job = job.job_id;
    const h3 = document.createElement("h3");
    const state = document.createElement("span"); state.className = "job-state";
    const meta = document.createElement("span"); meta.className = "muted job-meta";
    const id = document.createElement("code"); id.textContent = job.job_id.slice(0, 8); id.title = job.job_id;
    const quant = job.quant && typeof job.quant === "object"
      ? Object.entries(job.quant).map(function ([k, v]) { return k + ": " + (v || "f32"); }).join(", ")
      : (job.quant || "f32");
    meta.append(quant + " · job ", id);
    h3.append(job.model_id + " layer " + job.layer + " ", state, " ", meta);
    const bar = document.createElement("progress");
    const count = document.createElement("span"); count.className = "job-count";
    const list = document.createElement("ul"); list.className = "blobs";
    card.append(h3, bar, " ", count, list);
    jobs.querySelectorAll(".empty").forEach(function (e) { e.remove(); });
    jobs.prepend(card);
  }
  const state = card.querySelector(".job-state");
  state.textContent = job.state; state.className = "job-state state-" + job.state;
  const bar = card.querySelector("progress");
  bar.max = job.progress.total; bar.value = job.progress.done;
  card.querySelector(".job-count").textContent = job.progress.done + " / " + job.progress.total;
  card.querySelectorAll(".job-error").forEach(function (e) { e.remove(); });
  if (job.error) {
    const p = document.createElement("p"); p.className = "warn job-error";
    p.textContent = job.error.reason + ": " + job.error.message;
    card.querySelector("ul.blobs").before(p);
  }
  const items = [];
  if (job.gate) items.push(blobItem("gate", job.gate.blob_uri));
  job.experts.forEach(function (e) { if (e.blob_uri) items.push(blobItem("expert " + e.expert, e.blob_uri)); });
  card.querySelector("ul.blobs").replaceChildren(...items);
  if (job.state === "done") addPlaceForm(card, job.job_id);
  flash(bar);
}

// A card drawn here for a job that finished gets the Place button the server draws for done jobs,
// with the CSRF token of the page's own form (operators only: others have no form, hence no token).
function addPlaceForm(card, jobId) {
  const csrf = document.querySelector('#prepare-form input[name="csrfmiddlewaretoken"]');
  if (!csrf || card.querySelector("form.place-form")) return;
  const form = document.createElement("form");
  form.method = "post"; form.className = "place-form";
  form.action = "/prepare/" + jobId + "/place/";
  const token = csrf.cloneNode();
  const button = document.createElement("button"); button.type = "submit"; button.textContent = "Place";
  const result = document.createElement("span"); result.className = "muted place-result";
  form.append(token, button, " ", result);
  card.append(form);
}

// "Place": this node loads its share of a finished job (tenzro_moePlace); the answer is summarized.
jobs.addEventListener("submit", function (event) {
  const form = event.target.closest("form.place-form");
  if (!form) return;
  event.preventDefault();
  const result = form.querySelector(".place-result");
  result.textContent = "placing…";
  postForm(form).then(function (answer) {
    if (!answer.ok) { result.textContent = answer.data.message || "refused (" + answer.status + ")"; return; }
    const count = {};
    answer.data.rows.concat(answer.data.gates).forEach(function (r) {
      if (r.provider && r.provider !== answer.data.provider_id) return;
      count[r.outcome] = (count[r.outcome] || 0) + 1;
    });
    result.textContent = "replication " + answer.data.replication + " over " + answer.data.providers.length +
      " providers; here: " + Object.entries(count).map(function ([k, v]) { return v + " " + k; }).join(", ") +
      // providers left without any expert of a model are no candidates of its repair (docs/operations.md, "Repair")
      (answer.data.idle || []).map(function (i) {
        return "; " + i.providers.length + " provider(s) hold nothing of " + i.model_id + " (repair will not use them)";
      }).join("");
    result.dataset.outcome = count.failed || count.skipped ? "failed" : "ok";
  });
});

jobs.addEventListener("click", function (event) {
  const button = event.target.closest("button.copy");
  if (!button) return;
  copyText(button.dataset.copy).then(function () { button.textContent = "copied"; },
                                     function () { button.textContent = "select and copy"; });
  setTimeout(function () { button.textContent = "copy"; }, 1500);
});

const form = document.getElementById("prepare-form");
if (form) {
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const error = document.getElementById("prepare-error");
    error.hidden = true;
    postForm(form).then(function (answer) {
      if (answer.ok) { showJob(answer.data, true); return; }
      const errors = answer.data.errors
        ? Object.entries(answer.data.errors).map(function ([k, v]) { return k + ": " + v.map(function (e) { return e.message; }).join(" "); }).join("; ")
        : (answer.data.message || "refused (" + answer.status + ")");
      error.textContent = errors; error.hidden = false;
    });
  });
}

onEvent("prepare.progress", function (payload) { showJob(payload.job, false); });
