// kernelfleet dashboard: a client of the agent's JSON API (fleet -> host -> GPU -> job).
// A bearer token, when the agent wants one, is read from the page's #token=... fragment.
"use strict";

const token = new URLSearchParams(location.hash.slice(1)).get("token");
const state = { selected: null, job: null, chart: null, lastGood: null };
const OLD_SECONDS = 10; // newer than this the page is live; older (or a failed fetch) greys it out

async function api(path) {
  const response = await fetch(path, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

const ago = (ts) => `${Math.max(0, Math.round(Date.now() / 1000 - ts))} s ago`;
const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);
const text = (tag, value, cls) => {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
};

function renderFleet(fleet) {
  document.getElementById("fleet-gpus").textContent = `${fleet.gpus_with_ofu} / ${fleet.gpus}`;
  document.getElementById("fleet-ofu").textContent = pct(fleet.mean_ofu_ratio);
  document.getElementById("fleet-capacity").textContent = pct(fleet.capacity_weighted_ofu_ratio);
  document.getElementById("fleet-flops").textContent =
    fleet.achieved_flops === null ? "—" : (fleet.achieved_flops / 1e15).toFixed(2);
  document.getElementById("fleet-flops-note").textContent =
    fleet.peak_flops === null ? "" : `OFU × dense bf16 peak, of ${(fleet.peak_flops / 1e15).toFixed(2)} PFLOP/s`;
}

function renderGpus(gpus) {
  const body = document.querySelector("#gpus tbody");
  body.replaceChildren();
  let host = null;
  for (const g of gpus) {
    if (g.host !== host) {
      host = g.host;
      const row = document.createElement("tr");
      row.className = "host";
      const cell = text("td", host);
      cell.colSpan = 10;
      row.append(cell);
      body.append(row);
    }
    const row = document.createElement("tr");
    row.dataset.uuid = g.uuid;
    if (state.selected === null) state.selected = g.uuid;
    if (g.uuid === state.selected) row.classList.add("selected");
    const gpu = g.mig_instance === null ? `${g.gpu}` : `${g.gpu}/mig${g.mig_instance}`;
    if (g.stale) row.classList.add("stale-row");
    row.append(
      text("td", ""), text("td", gpu), text("td", g.sku || g.name),
      g.stale ? text("td", `stale · last seen ${ago(g.timestamp_seconds)}`, "stale") : text("td", pct(g.ofu_ratio), "num ofu"),
      text("td", pct(g.tensor_active_ratio), "num"),
      text("td", g.sm_clock_hertz === null ? "—" : `${(g.sm_clock_hertz / 1e6).toFixed(0)} MHz`, "num"),
      text("td", pct(g.dram_bandwidth_ratio), "num"),
      text("td", g.power_watts === null ? "—" : `${g.power_watts.toFixed(0)} W`, "num"),
      text("td", g.bottleneck, `b-${g.bottleneck}`),
      text("td", g.jobs.map((j) => j.job + (j.approximate ? " (shared)" : "")).join(", ")),
    );
    row.addEventListener("click", () => { state.selected = g.uuid; state.job = null; refresh(); });
    body.append(row);
  }
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  for (const j of jobs.slice(0, 10)) {
    const row = document.createElement("tr");
    if (j.job === state.job) row.classList.add("selected");
    row.append(text("td", j.job), text("td", j.kind), text("td", `${j.gpus}`, "num"), text("td", pct(j.ofu_ratio), "num ofu"));
    row.addEventListener("click", () => { state.job = j.job; refresh(); });
    body.append(row);
  }
}

function renderEvents(events) {
  const list = document.getElementById("events");
  list.replaceChildren();
  if (!events.length) list.append(text("li", "none", "muted"));
  for (const e of events.slice(-10).reverse()) {
    list.append(text("li", `${new Date(e.ts * 1000).toLocaleTimeString()} ${e.detail}`, e.kind));
  }
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

// One chart: a GPU's OFU and tensor activity, or a job's per-minute OFU.
function renderChart(key, title, data, labels) {
  const el = document.getElementById("chart");
  data = withGaps(data);
  if (state.chart && state.chart.key === key) {
    state.chart.plot.setData(data);
    return;
  }
  if (state.chart) state.chart.plot.destroy();
  const colours = ["#1a56db", "#9aa5b8"];
  const opts = {
    width: Math.max(400, el.clientWidth - 10), height: 300,
    scales: { y: { range: [0, 1.05] } },
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colours[i], width: i ? 1 : 2 }))],
    axes: [{}, { values: (u, ticks) => ticks.map((t) => `${Math.round(t * 100)}%`) }],
  };
  state.chart = { key, plot: new uPlot(opts, data, el) };
  document.getElementById("chart-title").textContent = title;
}

async function refreshChart() {
  if (state.job) {
    const report = await api(`api/jobs/${encodeURIComponent(state.job)}`);
    const points = report.timeline_1m;
    renderChart(`job:${state.job}`, `OFU of job ${state.job} (per minute)`,
      [points.map((p) => p.ts), points.map((p) => p.ofu_ratio)], ["OFU"]);
  } else if (state.selected) {
    const now = Date.now() / 1000;
    const query = new URLSearchParams({ uuid: state.selected, start: now - 900, end: now + 60 });
    query.append("metric", "ofu");
    query.append("metric", "tensor_active");
    const series = await api(`api/series?${query}`);
    const points = series.points;
    renderChart(`gpu:${state.selected}`, `OFU of ${state.selected} (last 15 min)`,
      [points.map((p) => p.ts), points.map((p) => p.ofu), points.map((p) => p.tensor_active)], ["OFU", "tensor active"]);
  }
}

async function refresh() {
  try {
    const [fleet, gpus, jobs, events] = await Promise.all([
      api("api/fleet"), api("api/gpus"), api("api/jobs/summary"), api("api/events"),
    ]);
    renderFleet(fleet);
    renderGpus(gpus);
    renderJobs(jobs);
    renderEvents(events);
    await refreshChart();
    const newest = Math.max(0, ...gpus.map((g) => g.timestamp_seconds));
    const age = Date.now() / 1000 - newest;
    state.lastGood = Date.now();
    setLive(gpus.length === 0 || age <= OLD_SECONDS,
      gpus.length && age > OLD_SECONDS ? `data is ${Math.round(age)} s old: the agent samples no more`
        : `updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    const since = state.lastGood ? `; what is shown is from ${new Date(state.lastGood).toLocaleTimeString()}` : "";
    setLive(false, `agent unreachable (${error.message})${since}`);
  }
}

// Live, or greyed out with why: a dashboard that kept showing its last figures after the agent
// died looked like a healthy fleet.
function setLive(live, message) {
  document.body.classList.toggle("offline", !live);
  const status = document.getElementById("status");
  status.textContent = message;
  status.className = live ? "muted" : "alert";
}

refresh();
setInterval(refresh, 2000);
