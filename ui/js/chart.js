// Line charts in SVG from RabbitMQ's samples: a length's `samples` are its
// values, a message counter's are running totals whose slope is its rate.

import { h } from "./dom.js";

const COLOURS = ["#b3471d", "#2f6db5", "#2c7a3f", "#8a4fb3", "#c29100", "#5d6b7a"];
const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

// [[t, value]] from a details object's samples (newest first in the API).
export function points(details) {
  const s = (details && details.samples) || [];
  return s.map((p) => [p.timestamp, p.sample]).sort((a, b) => a[0] - b[0]);
}

// [[t, per second]] from a counter's running totals.
export function ratePoints(details) {
  const p = points(details);
  const out = [];
  for (let i = 1; i < p.length; i++) {
    const dt = (p[i][0] - p[i - 1][0]) / 1000;
    if (dt > 0) out.push([p[i][0], Math.max(0, (p[i][1] - p[i - 1][1]) / dt)]);
  }
  return out;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * e) return m * e;
  return 10 * e;
}

// A chart titled `title` of `series` = [{label, points, now?}] (`now`:
// the value the legend shows, else the last point's), from the oldest
// point (a minute back at least) to now, at most `ageMs`; `unit` follows
// the y axis' values.
export function chart(title, series, ageMs, unit = "") {
  const W = 600, H = 160, L = 48, B = 18;
  // The server's clock: its newest sample is now (the browser's clock may
  // differ from the broker's).
  const stamps = series.flatMap((s) => s.points.map((p) => p[0]));
  const now = stamps.length ? Math.max(...stamps) : Date.now();
  // From the oldest sample (at least a minute back), at most `ageMs`.
  const oldest = Math.min(now - 60000, ...stamps);
  const from = Math.max(now - ageMs, oldest);
  const span = now - from;
  const all = series.flatMap((s) => s.points.map((p) => p[1]));
  const top = niceMax(Math.max(0, ...all));
  const x = (t) => L + ((t - from) / span) * (W - L - 4);
  const y = (v) => 4 + (1 - v / top) * (H - B - 8);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": title });
  for (const f of [0, 0.5, 1]) {
    root.append(svg("line", { x1: L, x2: W - 4, y1: y(top * f), y2: y(top * f), stroke: "#e3e8ee" }));
    const t = svg("text", { x: L - 6, y: y(top * f) + 4, "text-anchor": "end", "font-size": 11, fill: "#5d6b7a" });
    t.textContent = (top * f).toLocaleString("en-US", { maximumFractionDigits: 1 }) + unit;
    root.append(t);
  }
  const back = span >= 120000 ? `-${Math.round(span / 60000)} min` : `-${Math.round(span / 1000)} s`;
  for (const [label, at, anchor] of [[back, from, "start"], ["now", now, "end"]]) {
    const t = svg("text", { x: x(at), y: H - 4, "text-anchor": anchor, "font-size": 11, fill: "#5d6b7a" });
    t.textContent = label;
    root.append(t);
  }
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => p[0] >= from);
    if (pts.length === 0) return;
    const d = pts.map((p, k) => `${k ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    root.append(svg("path", { d, fill: "none", stroke: COLOURS[i % COLOURS.length], "stroke-width": 2, "vector-effect": "non-scaling-stroke" }));
  });
  const legend = h("div", { class: "legend" }, series.map((s, i) => {
    const last = s.now !== undefined ? s.now : (s.points.length ? s.points[s.points.length - 1][1] : 0);
    const shown = last.toLocaleString("en-US", { maximumFractionDigits: 1 }) + unit;
    return h("span", {}, h("i", { style: `background:${COLOURS[i % COLOURS.length]}` }), `${s.label} ${shown}`);
  }));
  const box = h("div", { class: "chart" }, h("h3", {}, title));
  box.append(root, legend);
  return box;
}
