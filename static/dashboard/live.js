// The dashboard's one websocket (/ws/dashboard/): every page imports `onEvent` and renders the
// events it cares about; the badge in the header says whether the page is live. No polling.
const handlers = new Map();
let retryMs = 500;

export function onEvent(name, handler) {
  if (!handlers.has(name)) handlers.set(name, []);
  handlers.get(name).push(handler);
}

function setBadge(state, text) {
  const badge = document.getElementById("live-status");
  if (!badge) return;
  badge.dataset.state = state;
  badge.textContent = text;
  badge.className = "badge badge-" + (state === "live" ? "live" : state === "down" ? "down" : "wait");
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const socket = new WebSocket(scheme + location.host + "/ws/dashboard/");
  socket.onopen = function () { retryMs = 500; setBadge("live", "live"); };
  socket.onmessage = function (message) {
    const data = JSON.parse(message.data);
    (handlers.get(data.event) || []).forEach(function (handler) { handler(data.payload); });
  };
  socket.onclose = function () {
    setBadge("down", "disconnected, retrying");
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 10000);
  };
}

// Modules of the page register their handlers synchronously on import; connect once they have.
queueMicrotask(connect);

// Provider id -> name from the page's "provider-names" JSON (apps/dashboard/context.py); a provider is
// shown as its name and the first hex digits of its id, the whole id on hover, as the templates'
// `provider` filter (apps/dashboard/templatetags/readable.py) renders it.
let providerNames = null;

function nameOf(pid) {
  if (providerNames === null) {
    const script = document.getElementById("provider-names");
    providerNames = script ? JSON.parse(script.textContent) : {};
  }
  return providerNames[pid];
}

// Plain text, for SVG labels and titles: "name 1a2b3c", or the id's first 12 hex digits.
export function providerText(pid) {
  const name = nameOf(pid);
  if (!name) return pid.slice(0, 12) + "…";
  return name.endsWith(pid.slice(0, 6)) ? name : name + " " + pid.slice(0, 6);
}

export function providerLabel(pid) {
  const span = document.createElement("span");
  span.className = "provider";
  span.title = pid;
  span.dataset.providerId = pid;
  const code = document.createElement("code");
  const name = nameOf(pid);
  if (name && name.endsWith(pid.slice(0, 6))) {
    span.append(name);  // the default name already ends with the id's digits
  } else if (name) {
    code.className = "pid";
    code.textContent = pid.slice(0, 6);
    span.append(name + " ", code);
  } else {
    code.textContent = pid.slice(0, 12) + "…";
    span.append(code);
  }
  return span;
}
