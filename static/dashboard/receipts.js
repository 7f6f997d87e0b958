// Receipts page: newly kept receipts and dispute verdicts arrive over the websocket (live.js);
// a dispute is opened by POSTing the row's form (CSRF token inside) without leaving the page.
import { onEvent, providerLabel } from "./live.js";
import { flash, postForm, prependRow, row } from "./util.js";

const body = document.querySelector("#receipts tbody");

function setDispute(receiptId, state, title) {
  const tr = body.querySelector('tr[data-receipt="' + receiptId + '"]');
  if (!tr) return;
  const cell = tr.querySelector("td.dispute");
  // A verdict may arrive before the POST's own answer: never go back from decided to pending.
  if (state === "pending" && cell.textContent !== "–" && cell.textContent !== "pending") return;
  cell.textContent = state;
  cell.className = "dispute state-" + state;
  if (title) cell.title = title;
  const form = tr.querySelector("form.dispute-form");
  if (form) form.remove();
  flash(cell);
}

body.addEventListener("submit", function (event) {
  const form = event.target.closest("form.dispute-form");
  if (!form) return;
  event.preventDefault();
  const receiptId = form.closest("tr").dataset.receipt;
  form.querySelector("button").disabled = true;
  postForm(form).then(function (answer) {
    if (answer.ok) setDispute(receiptId, answer.data.state);
    else { form.querySelector("button").disabled = false; alert(answer.data.message || "refused (" + answer.status + ")"); }
  });
});

onEvent("receipts.dispute", function (p) {
  const detail = p.difference === null ? "" : "difference " + p.difference.toPrecision(3) + " (tolerance " +
    (p.tolerance === null ? "–" : p.tolerance.toPrecision(3)) + ")";
  setDispute(p.receipt_id, p.state, detail);
});

onEvent("receipts.kept", function (payload) {
  const params = new URLSearchParams(location.search);
  payload.receipts.slice().reverse().forEach(function (r) {
    if ((params.get("model") && params.get("model") !== r.model_id) ||
        (params.get("holder") && params.get("holder") !== r.provider_id) ||
        (params.get("expert") && Number(params.get("expert")) !== r.expert)) return;
    const holder = providerLabel(r.provider_id);
    const tr = row([r.created_at.slice(0, 19).replace("T", " "), r.model_id, r.layer, r.expert, holder, r.tokens,
                    r.dispute || "–", ""], {receipt: r.id});
    tr.cells[6].className = "dispute state-" + (r.dispute || "none");
    prependRow(body, tr, 100);
  });
});
