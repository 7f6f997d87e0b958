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
