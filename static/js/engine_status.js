// The admin's engine status page: polls the live JSON and updates the numbers and the
// small plots in place (no reload). A static ES module: the CSP forbids inline scripts.

const root = document.querySelector("[data-live-url]");
const HISTORY_SECONDS = 300; // the plots show the last five minutes
const TIER_COLOURS = { pool: "#417690", host: "#e5a100", disk: "#a0522d" };
const samples = [];

function format(key, value) {
  if (value === null || value === undefined) return "—";
  if (key === "prefix_hit_rate") return `${(value * 100).toFixed(1)} %`;
  if (typeof value === "number" && !Number.isInteger(value)) return value.toFixed(1);
  return String(value);
}

function polyline(svg, points, max, colour) {
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  const now = Date.now() / 1000;
  const coords = points.map(([t, v]) => {
    const x = 300 - ((now - t) / HISTORY_SECONDS) * 300;
    const y = 58 - (max > 0 ? (v / max) * 56 : 0);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  line.setAttribute("points", coords.join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", colour);
  line.setAttribute("stroke-width", "1.5");
  line.setAttribute("vector-effect", "non-scaling-stroke");
  svg.append(line);
}

function plot(name, series, max) {
  const svg = root.querySelector(`[data-plot="${name}"]`);
  if (!svg) return;
  svg.replaceChildren();
  for (const [colour, points] of series) polyline(svg, points, max, colour);
}

function render(data) {
  for (const row of root.querySelectorAll("tr[data-key]")) {
    const key = row.dataset.key;
    const value = key in data.stats ? data.stats[key] : data[key];
    if (value !== undefined) row.querySelector("td").textContent = format(key, value);
  }
  const body = root.querySelector("[data-tiers]");
  body.replaceChildren(
    ...Object.entries(data.tiers).map(([name, t]) => {
      const tr = document.createElement("tr");
      for (const cell of [name, t.blocks, t.capacity_blocks, t.hit_tokens, t.bytes_written, t.bytes_read]) {
        const td = document.createElement("td");
        td.textContent = String(cell);
        tr.append(td);
      }
      return tr;
    }),
  );

  const now = Date.now() / 1000;
  samples.push({ t: now, data });
  while (samples.length && samples[0].t < now - HISTORY_SECONDS) samples.shift();

  const rate = samples.map((s) => [s.t, s.data.tokens_per_s]);
  plot("tokens_per_s", [["#417690", rate]], Math.max(1, ...rate.map(([, v]) => v)));
  root.querySelector('[data-latest="tokens_per_s"]').textContent = data.tokens_per_s.toFixed(1);

  const tiers = Object.keys(data.tiers);
  plot(
    "kv_use",
    tiers.map((name) => [TIER_COLOURS[name] || "#666", samples.map((s) => [s.t, s.data.tiers[name]?.use ?? 0])]),
    1,
  );
  const legend = root.querySelector('[data-legend="kv_use"]');
  legend.replaceChildren(
    ...tiers.map((name) => {
      const span = document.createElement("span");
      span.style.color = TIER_COLOURS[name] || "#666";
      span.textContent = ` ${name} ${(data.tiers[name].use * 100).toFixed(0)}%`;
      return span;
    }),
  );

  // Hit rate between consecutive samples (the cumulative rate hides recent changes).
  const hits = [];
  for (let i = 1; i < samples.length; i += 1) {
    const a = samples[i - 1].data;
    const b = samples[i].data;
    const queried = b.queried_tokens - a.queried_tokens;
    if (queried > 0) hits.push([samples[i].t, (b.hit_tokens - a.hit_tokens) / queried]);
  }
  plot("hit_rate", [["#2e7d32", hits]], 1);
  root.querySelector('[data-latest="hit_rate"]').textContent = `${(data.hit_rate * 100).toFixed(1)} % overall`;
}

async function poll() {
  try {
    const response = await fetch(root.dataset.liveUrl, { credentials: "same-origin" });
    if (response.ok) render(await response.json());
  } catch (error) {
    console.warn("engine status poll failed", error);
  }
}

if (root) {
  poll();
  setInterval(poll, Number(root.dataset.pollSeconds || 2) * 1000);
}
