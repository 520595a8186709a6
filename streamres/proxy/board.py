"""The health board: one page that shows, model by model, whether it is healthy, degraded or
jammed, and why (seed §6), updated every second from ``/health``. (It polls rather than
holding ``/health/stream`` open: a page whose network never goes idle is never "loaded" for
tools that snapshot it, such as a headless browser's ``--dump-dom``.)"""

from __future__ import annotations

__all__ = ["BOARD_HTML"]

BOARD_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>streamres — model health</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem; color: #1d232a; }
  h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
  p.sub { color: #5b6570; margin: 0 0 1.2rem; }
  table { border-collapse: collapse; min-width: 60rem; }
  th, td { text-align: left; padding: .45rem .8rem; border-bottom: 1px solid #e3e7eb; }
  th { font-weight: 600; color: #5b6570; font-size: .85rem; text-transform: uppercase; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .status { font-weight: 700; padding: .1rem .5rem; border-radius: .3rem; }
  .healthy { background: #dff5e3; color: #145c24; }
  .degraded { background: #fff1cc; color: #7a5200; }
  .jammed { background: #fde0de; color: #8f1d15; }
  .why { color: #5b6570; }
  #state { color: #5b6570; font-size: .85rem; }
</style>
</head>
<body>
<h1>Model health</h1>
<p class="sub">Live from this proxy: which models are healthy, degraded or jammed, and why.
<span id="state">connecting…</span></p>
<table>
<thead><tr><th>model</th><th>status</th><th>why</th><th>requests</th><th>success</th>
<th>capacity errors</th><th>stalls</th><th>resumes</th><th>in flight</th><th>breaker</th>
<th>weight</th></tr></thead>
<tbody id="rows"></tbody>
</table>
<script>
const pct = x => x === null || x === undefined ? "–" : Math.round(x * 100) + " %";
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function render(health) {
  const rows = document.getElementById("rows");
  rows.replaceChildren();
  for (const [name, m] of Object.entries(health.models)) {
    const tr = document.createElement("tr");
    tr.dataset.model = name;
    tr.dataset.status = m.status;
    tr.append(cell(name));
    const st = document.createElement("td");
    const badge = document.createElement("span");
    badge.className = "status " + m.status;
    badge.textContent = m.status;
    st.append(badge);
    tr.append(st, cell(m.reasons.join("; ") || "–", "why"),
      cell(m.requests, "num"), cell(pct(m.success_rate), "num"),
      cell(m.capacity_errors, "num"), cell(m.stalls, "num"), cell(m.resumes, "num"),
      cell(m.in_flight, "num"), cell(m.breaker), cell(m.weight.toFixed(2), "num"));
    rows.append(tr);
  }
  document.getElementById("state").textContent =
    "updated " + new Date(health.time * 1000).toLocaleTimeString();
}
async function poll() {
  try {
    const r = await fetch("/health", { cache: "no-store" });
    render(await r.json());
  } catch (e) {
    document.getElementById("state").textContent = "reconnecting…";
  }
  setTimeout(poll, 1000);
}
poll();
</script>
</body>
</html>
"""
