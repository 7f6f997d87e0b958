// The dispatch page: an uploaded routings file fills the textarea (so it can be edited before
// planning), and the plan's tokens per holder are drawn as an inline-SVG bar chart.
import { providerText } from "./live.js";

function escapeXml(text) {
  return text.replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; });
}
const file = document.getElementById("routings_file");
file.addEventListener("change", function () {
  if (!file.files.length) return;
  file.files[0].text().then(function (text) { document.getElementById("routings").value = text; });
});

function drawBars(bars) {
  const chart = document.getElementById("chart");
  if (!chart) return;
  const row = 22, label = 160, width = 650, max = Math.max(1, ...bars.map(function (b) { return b.tokens; }));
  const parts = bars.map(function (b, i) {
    const w = Math.max(1, Math.round((width - label - 60) * b.tokens / max));
    const y = i * row;
    return '<g class="bar" data-provider="' + b.provider + '"><text x="' + (label - 6) + '" y="' + (y + 15) +
      '" text-anchor="end" font-size="11" font-family="monospace">' + escapeXml(providerText(b.provider).slice(0, 24)) + "</text>" +
      '<rect x="' + label + '" y="' + (y + 3) + '" width="' + w + '" height="' + (row - 6) + '" fill="#2b6cb0"><title>' +
      b.provider + ": " + b.tokens + " tokens in " + b.batches + " batches</title></rect>" +
      '<text x="' + (label + w + 4) + '" y="' + (y + 15) + '" font-size="11">' + b.tokens + "</text></g>";
  });
  const height = Math.max(row, bars.length * row);
  chart.innerHTML = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ' + width + " " + height + '" width="' + width +
    '" height="' + height + '">' + parts.join("") + "</svg>";
}

const data = document.getElementById("plan-bars");
if (data) drawBars(JSON.parse(data.textContent));
