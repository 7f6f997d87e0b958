// Repair page: each pass arrives as `repair.pass` when it ends.
import { onEvent } from "./live.js";
import { prependRow, row } from "./util.js";

const body = document.querySelector("#repair-passes tbody");

onEvent("repair.pass", function (payload) {
  const p = payload.pass;
  const did = p.rows.map(function (r) {
    return r.action + " " + r.model_id + " " + r.layer + "/" + r.expert + ": " + r.outcome + (r.why ? " (" + r.why + ")" : "");
  }).join("; ") || "nothing";
  prependRow(body, row(["just now", p.trigger, "–", p.considered, p.fetched, p.dropped,
                        p.unrepairable + (p.unrepairable_why ? " (" + p.unrepairable_why + ")" : ""),
                        did + (p.error ? " " + p.error : "")], {pass: p.id}), 50);
});
