"""The health board: one page that shows, model by model, whether it is healthy, degraded,
degrading or jammed, and why (seed §6), with the last five minutes of its three signals —
success rate, time to first token, capacity errors — as small charts, and when its breaker
opened and closed. Updated every second from ``/health``; a page a team keeps on a screen,
readable at a phone's width. (It polls rather than holding ``/health/stream`` open: a page
whose network never goes idle is never "loaded" for tools that snapshot it, such as a
headless browser's ``--dump-dom``.)"""

from __future__ import annotations

__all__ = ["BOARD_HTML"]

BOARD_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>streamres — model health</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5rem; color: #1d232a; }
  h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
  p.sub { color: #5b6570; margin: 0 0 1.2rem; }
  #cards { display: grid; gap: 1rem; grid-template-columns: repeat(auto-fill, minmax(20rem, 1fr)); }
  .card { border: 1px solid #e3e7eb; border-radius: .5rem; padding: .8rem 1rem; }
  .card h2 { font-size: 1.05rem; margin: 0; display: flex; justify-content: space-between;
    align-items: center; gap: .5rem; overflow-wrap: anywhere; }
  .status { font-weight: 700; font-size: .85rem; padding: .1rem .5rem; border-radius: .3rem; }
  .healthy { background: #dff5e3; color: #145c24; }
  .degraded { background: #fff1cc; color: #7a5200; }
  .degrading { background: #ffe2c2; color: #8a3b00; }
  .jammed { background: #fde0de; color: #8f1d15; }
  .why { color: #5b6570; font-size: .9rem; margin: .3rem 0 .5rem; min-height: 1.3em; }
  .chart { display: grid; grid-template-columns: 7.5rem 1fr 4rem; align-items: center;
    gap: .4rem; font-size: .8rem; color: #5b6570; }
  .chart svg { width: 100%; height: 2.2rem; background: #f7f9fa; border-radius: .2rem; }
  .chart .now { text-align: right; color: #1d232a; font-variant-numeric: tabular-nums; }
  .figures { font-size: .8rem; color: #5b6570; margin-top: .5rem; }
  .figures b { color: #1d232a; font-weight: 600; }
  #state { color: #5b6570; font-size: .85rem; }
</style>
</head>
<body>
<h1>Model health</h1>
<p class="sub">Live from this proxy: which models are healthy, degraded, degrading or jammed,
and why — a model's status and the line under its name judge its last requests; each chart is
the last five minutes in 10 s steps, the figure at its right the last 10 s (red: breaker
opened, green: closed).
<span id="state">connecting…</span></p>
<div id="cards"></div>
<script>
const SPAN = 300, NS = "http://www.w3.org/2000/svg";
const pct = x => x === null || x === undefined ? "–" : Math.round(x * 100) + " %";
const ms = x => x === null || x === undefined ? "–" : Math.round(x * 1000) + " ms";
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function chart(label, points, key, max, fmt, color, changes) {
  const row = el("div", "chart");
  row.dataset.signal = key;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 300 40");
  svg.setAttribute("preserveAspectRatio", "none");
  for (const c of changes) {
    const line = document.createElementNS(NS, "line");
    const x = SPAN - c.ago;
    line.setAttribute("x1", x); line.setAttribute("x2", x);
    line.setAttribute("y1", 0); line.setAttribute("y2", 40);
    const tone = c.state === "open" ? "#d33" : c.state === "closed" ? "#2a2" : "#d90";
    line.setAttribute("stroke", tone);
    line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  const known = points.filter(p => p[key] !== null && p[key] !== undefined);
  const top = max || Math.max(0.001, ...known.map(p => p[key]));
  const xy = known.map(p => [Math.min(297, Math.max(3, SPAN - p.ago + 5)),
    38 - 36 * Math.min(1, p[key] / top)]);
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", xy.map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", color);
  line.setAttribute("stroke-width", "2");
  svg.append(line);
  for (const [x, y] of xy) {
    const dot = document.createElementNS(NS, "circle");
    dot.setAttribute("cx", x); dot.setAttribute("cy", y); dot.setAttribute("r", 1.8);
    dot.setAttribute("fill", color);
    svg.append(dot);
  }
  const last = known.length ? known[known.length - 1][key] : null;
  row.append(el("span", "", label), svg, el("span", "now", fmt(last)));
  return row;
}
function render(health) {
  const cards = document.getElementById("cards");
  cards.replaceChildren();
  for (const [name, m] of Object.entries(health.models)) {
    const card = el("div", "card");
    card.dataset.model = name;
    card.dataset.status = m.status;
    const h = el("h2");
    h.append(el("span", "", name), el("span", "status " + m.status, m.status));
    card.append(h, el("div", "why", m.reasons.join("; ") || "–"));
    const t = m.trend || [], ch = m.breaker_changes || [];
    card.append(
      chart("success", t, "success_rate", 1, pct, "#2a7d3a", ch),
      chart("first token", t, "ttft_p50", 0, ms, "#2f5ea8", ch),
      chart("capacity errors", t, "capacity_error_rate", 1, pct, "#c0392b", ch));
    const f = el("div", "figures");
    f.innerHTML = "";
    for (const [k, v] of [["requests", m.requests], ["in flight", m.in_flight],
        ["breaker", m.breaker], ["weight", m.weight.toFixed(2)],
        ["traffic share", (m.trend_share ?? 1).toFixed(2)]]) {
      f.append(k + " ", el("b", "", String(v)), " · ");
    }
    f.lastChild.remove();
    card.append(f);
    cards.append(card);
  }
  const shared = health.shared;
  document.getElementById("state").textContent =
    "updated " + new Date(health.time * 1000).toLocaleTimeString() +
    (shared ? (shared.connected ? " · shared state " + shared.url
      : " · shared state " + shared.url + " NOT REACHABLE: limits are this proxy's own") : "");
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
