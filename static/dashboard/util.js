// Small helpers shared by the dashboard's page modules.

// A <tr> of text cells (never innerHTML: the values come from peers).
export function row(values, attrs) {
  const tr = document.createElement("tr");
  Object.entries(attrs || {}).forEach(function ([k, v]) { tr.dataset[k] = v; });
  values.forEach(function (v) {
    const cell = document.createElement("td");
    if (v instanceof Node) cell.appendChild(v); else cell.textContent = v === null || v === undefined ? "–" : v;
    tr.appendChild(cell);
  });
  return tr;
}

export function flash(element) {
  element.classList.remove("flash"); void element.offsetWidth; element.classList.add("flash");
}

// Prepend to a table body, dropping the "nothing yet" row and keeping at most `limit` rows.
export function prependRow(body, tr, limit) {
  body.querySelectorAll("tr.empty").forEach(function (e) { e.remove(); });
  body.prepend(tr);
  flash(tr);
  while (body.rows.length > limit) body.deleteRow(body.rows.length - 1);
}

// POST a form by fetch with its CSRF token; resolves to {ok, status, data}.
export function postForm(form) {
  return fetch(form.action, {method: "POST", body: new FormData(form), credentials: "same-origin",
                             headers: {"Accept": "application/json"}})
    .then(function (r) { return r.json().catch(function () { return {}; }).then(function (data) {
      return {ok: r.ok, status: r.status, data: data};
    }); });
}

// Copy text: the Clipboard API where the page is a secure context, else a selected textarea.
export function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed"; area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  let ok = false;
  try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
  area.remove();
  return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
}

// 115 -> "1 min 55 s", as the templates' `duration` filter (apps/dashboard/templatetags/readable.py).
export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}
