// The dashboard's pure helpers: the URL's state, formatting, sorting, names and axes (no DOM, no
// fetch: tests/unit/test_dashboard_js.py runs them in Node).
"use strict";

const RANGES = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
const RANGE_NAMES = { "15m": "15 min", "1h": "1 h", "6h": "6 h", "24h": "24 h", "7d": "7 d" };
const VIEWS = ["fleet", "host", "gpu", "job"];
const SORTS = ["host", "ofu", "-ofu"];

// -- the URL -----------------------------------------------------------------------------------------
function readHash(hash) {
  const p = new URLSearchParams(hash.replace(/^#/, ""));
  const pick = (value, allowed, fallback) => (allowed.includes(value) ? value : fallback);
  const below = Number(p.get("below"));
  const price = Number(p.get("price"));
  return {
    view: pick(p.get("view"), VIEWS, "fleet"),
    host: p.get("host"), gpu: p.get("gpu"), job: p.get("job"),
    range: pick(p.get("range"), Object.keys(RANGES), "1h"),
    sort: pick(p.get("sort"), SORTS, "host"),
    open: p.has("open") ? p.get("open").split(",").filter(Boolean) : null,
    below: p.has("below") && below >= 0 && below <= 100 ? below : 30,
    price: p.has("price") && price > 0 ? price : null,
    token: p.get("token"),
  };
}

function writeHash(s) {
  const p = new URLSearchParams({ view: s.view });
  if (s.view !== "fleet" && s.view !== "job" && s.host) p.set("host", s.host);
  if (s.view === "gpu" && s.gpu) p.set("gpu", s.gpu);
  if (s.view === "job" && s.job) p.set("job", s.job);
  p.set("range", s.range);
  if (s.sort !== "host") p.set("sort", s.sort);
  if (s.open !== null) p.set("open", s.open.join(","));
  if (s.view === "job") p.set("below", `${s.below}`);
  if (s.view === "job" && s.price !== null) p.set("price", `${s.price}`);
  return `#${p}`;
}

// -- pure helpers --------------------------------------------------------------------------------------
const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);
const ago = (ts) => `${Math.max(0, Math.round(Date.now() / 1000 - ts))} s ago`;

function sortHosts(hosts, sort) {
  const rows = hosts.slice();
  if (sort === "host") return rows.sort((a, b) => a.host.localeCompare(b.host));
  const sign = sort === "ofu" ? 1 : -1;
  // a host without an OFU goes last either way: missing is neither low nor high
  return rows.sort((a, b) => (a.mean_ofu_ratio === null) - (b.mean_ofu_ratio === null)
    || sign * (a.mean_ofu_ratio - b.mean_ofu_ratio) || a.host.localeCompare(b.host));
}

// An event's text with "GPU <uuid>" named as "host / GPU n" where the page knows the GPU.
function eventText(e, names) {
  const known = e.uuid && names[e.uuid];
  if (!known) return e.detail;
  return e.detail.split(`GPU ${e.uuid}`).join(known.label).split(e.uuid).join(known.label);
}

// The x axis of a chart: the chosen range; with no range, a single point gets a minute either side
// (uPlot would otherwise stretch one instant over years).
function xRange(min, max, start, end) {
  if (start !== undefined && end !== undefined) return [start, end];
  if (min === null || max === null) return [0, 1];
  return min === max ? [min - 60, max + 60] : [min, max];
}

// A gap in the data (windows missing, the agent down) becomes a null, so uPlot breaks the line
// there instead of drawing a flat line across it, as it would for an idle GPU.
function withGaps(columns) {
  const ts = columns[0];
  if (ts.length < 3) return columns;
  const steps = ts.slice(1).map((t, i) => t - ts[i]).sort((a, b) => a - b);
  const limit = 2.5 * steps[Math.floor(steps.length / 2)];
  const out = columns.map(() => []);
  ts.forEach((t, i) => {
    if (i && t - ts[i - 1] > limit) out.forEach((col, c) => col.push(c ? null : (t + ts[i - 1]) / 2));
    out.forEach((col, c) => col.push(columns[c][i]));
  });
  return out;
}

function seriesResolution(seconds) {
  return seconds <= 3600 ? "raw" : seconds <= 86400 ? "1m" : "1h";
}
