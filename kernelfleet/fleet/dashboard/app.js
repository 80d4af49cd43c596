// kernelfleet dashboard: a client of the agent's JSON API (fleet -> host -> GPU, and a job's page).
// Every figure comes from the API (kernelfleet/fleet/views.py and report.py compute them); this file
// only draws. What is shown (view, selection, time range, open hosts, sort) lives in the URL's hash,
// so a reload or a shared link shows the same. A bearer token, when the agent wants one, is asked
// for, kept in sessionStorage and sent as Authorization: Bearer.
"use strict";

const TOKEN_KEY = "kernelfleet-token";
const OLD_SECONDS = 10; // newer than this the page is live; older (or a failed fetch) greys it out
const OPEN_ALL_UP_TO = 16; // a fleet of this many GPUs or fewer shows every host open
const HISTORY_MS = 15000; // charts and the heatmap are fetched again this often (15 min range: each refresh)
const WORST_K = 10;

// -- the page ------------------------------------------------------------------------------------------
let state = readHash("");
const ui = { charts: {}, heat: null, heatKey: null, heatAt: 0, historyKey: null, historyAt: 0, names: {},
             lastGood: null, fleetGpus: 0 };

class NeedsToken extends Error {}
class HttpError extends Error {
  constructor(path, status) {
    super(`${path.split("?")[0]}: HTTP ${status}`);
    this.status = status;
    this.path = path;
  }
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(path, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  if (response.status === 401) throw new NeedsToken(token ? "that token was refused" : "this agent wants a bearer token");
  if (!response.ok) throw new HttpError(path, response.status);
  return response.json();
}

const byId = (id) => document.getElementById(id);
function el(tag, value, cls, title) {
  const e = document.createElement(tag);
  if (value !== undefined && value !== null) e.textContent = value;
  if (cls) e.className = cls;
  if (title) e.title = title;
  return e;
}
function link(value, s, title) {
  const a = el("a", value, null, title);
  a.href = writeHash({ ...state, ...s });
  a.addEventListener("click", (event) => event.stopPropagation());
  return a;
}
const gpuLink = (label, g) => link(label, { view: "gpu", host: g.host, gpu: g.uuid }, g.uuid);
const cell = (child, cls) => { const td = el("td", null, cls); td.append(child); return td; };

function go(s) {
  state = { ...state, ...s };
  const hash = writeHash(state);
  if (location.hash !== hash) history.pushState(null, "", hash);
  show();
  refresh();
}

function isOpen(host) {
  return state.open === null ? ui.fleetGpus <= OPEN_ALL_UP_TO : state.open.includes(host);
}

function toggle(host, hosts) {
  const open = hosts.filter((h) => isOpen(h.host)).map((h) => h.host);
  state.open = open.includes(host) ? open.filter((h) => h !== host) : [...open, host];
  history.replaceState(null, "", writeHash(state));
  refresh();
}

function renderFleet(fleet) {
  byId("fleet-gpus").textContent = `${fleet.gpus_with_ofu} / ${fleet.gpus}`;
  byId("fleet-ofu").textContent = pct(fleet.mean_ofu_ratio);
  byId("fleet-capacity").textContent = pct(fleet.capacity_weighted_ofu_ratio);
  byId("fleet-flops").textContent = fleet.achieved_flops === null ? "—" : (fleet.achieved_flops / 1e15).toFixed(2);
  byId("fleet-flops-note").textContent =
    fleet.peak_flops === null ? "" : `OFU × dense bf16 peak, of ${(fleet.peak_flops / 1e15).toFixed(2)} PFLOP/s`;
}

function gpuRows(body, gpus, withHost) {
  body.replaceChildren();
  for (const g of gpus) {
    const row = document.createElement("tr");
    row.dataset.uuid = g.uuid;
    if (g.uuid === state.gpu) row.classList.add("selected");
    if (g.stale) row.classList.add("stale-row");
    const name = withHost ? g.label : g.label.slice(g.host.length + 3);
    row.append(
      cell(gpuLink(name, g)), el("td", g.sku || g.name, "wide", g.name),
      g.stale ? el("td", `stale · last seen ${ago(g.timestamp_seconds)}`, "stale", g.stale_reason || TERMS.stale[1])
        : el("td", pct(g.ofu_ratio), "num ofu"),
      el("td", pct(g.tensor_active_ratio), "num wide"),
      el("td", g.sm_clock_hertz === null ? "—" : `${(g.sm_clock_hertz / 1e6).toFixed(0)} MHz`, "num wide"),
      el("td", pct(g.dram_bandwidth_ratio), "num wide"),
      el("td", g.power_watts === null ? "—" : `${g.power_watts.toFixed(0)} W`, "num wide"),
      el("td", g.bottleneck, `b-${g.bottleneck}`, (TERMS[g.bottleneck] || [])[1]),
    );
    const jobs = el("td");
    g.jobs.forEach((j, i) => {
      if (i) jobs.append(", ");
      jobs.append(link(j.job + (j.approximate ? " (shared)" : ""), { view: "job", job: j.job }, `${j.kind} job`));
    });
    row.append(jobs);
    row.addEventListener("click", () => go({ view: "gpu", host: g.host, gpu: g.uuid }));
    body.append(row);
  }
}

function gpuTable(gpus) {
  const table = el("table", null, "gpus");
  const head = el("tr");
  for (const [name, cls, term] of [["GPU"], ["model", "wide"], ["OFU", "num", "ofu"], ["tensor", "num wide", "tensor"],
    ["SM clock", "num wide"], ["DRAM bw", "num wide", "dram"], ["power", "num wide"], ["bottleneck", null, "bottleneck"],
    ["jobs"]]) head.append(el("th", name, cls, term && TERMS[term][1]));
  const thead = el("thead");
  thead.append(head);
  const body = el("tbody");
  gpuRows(body, gpus, false);
  table.append(thead, body);
  return table;
}

function renderHosts(overview) {
  const body = document.querySelector("#hosts tbody");
  body.replaceChildren();
  const gpus = {};
  for (const g of overview.gpus) (gpus[g.host] = gpus[g.host] || []).push(g);
  for (const h of sortHosts(overview.hosts, state.sort)) {
    const open = isOpen(h.host);
    const row = el("tr", null, open ? "host open" : "host");
    row.dataset.host = h.host;
    const name = el("td");
    const button = el("button", open ? "▾" : "▸", "toggle", open ? "close the host" : "open the host");
    button.setAttribute("aria-expanded", `${open}`);
    name.append(button, " ", link(h.host, { view: "host", host: h.host }, "the host's own view"));
    const worst = h.worst === null ? el("td", "—", "muted") : cell(gpuLink(`${h.worst.label.slice(h.host.length + 3)} · ${pct(h.worst.ofu_ratio)}`,
      { host: h.host, uuid: h.worst.uuid }));
    row.append(name, el("td", h.stale ? `${h.gpus} · ${h.stale} stale` : `${h.gpus}`, "num"),
      el("td", pct(h.mean_ofu_ratio), "num ofu"), worst);
    row.addEventListener("click", () => toggle(h.host, overview.hosts));
    body.append(row);
    if (open && gpus[h.host]) {
      const inner = el("tr", null, "host-gpus");
      const td = el("td");
      td.colSpan = 4;
      const box = el("div", null, "box");
      box.append(gpuTable(gpus[h.host]));
      td.append(box);
      inner.append(td);
      body.append(inner);
    }
  }
  document.querySelectorAll("#hosts th.sortable").forEach((th) => {
    const active = th.dataset.sort === "host" ? state.sort === "host" : state.sort !== "host";
    th.dataset.active = active ? (state.sort === "-ofu" ? "desc" : "asc") : "";
  });
}

function renderWorst(worst) {
  const body = document.querySelector("#worst tbody");
  body.replaceChildren();
  worst.forEach((g, i) => {
    const row = el("tr");
    row.dataset.uuid = g.uuid;
    const host = ui.names[g.uuid] ? ui.names[g.uuid].host : g.label.split(" / ")[0];
    row.append(el("td", `${i + 1}`, "num"), cell(gpuLink(g.label, { host, uuid: g.uuid })), el("td", pct(g.ofu_ratio), "num ofu"));
    row.addEventListener("click", () => go({ view: "gpu", host, gpu: g.uuid }));
    body.append(row);
  });
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  for (const j of jobs) {
    const row = el("tr");
    row.append(cell(link(j.job, { view: "job", job: j.job })), el("td", j.kind, "wide"), el("td", `${j.gpus}`, "num"),
      el("td", pct(j.ofu_ratio), "num ofu"));
    row.addEventListener("click", () => go({ view: "job", job: j.job }));
    body.append(row);
  }
}

function renderEvents(list, events) {
  list.replaceChildren();
  if (!events.length) list.append(el("li", "none", "muted"));
  for (const e of events.slice(-10).reverse()) {
    list.append(el("li", `${new Date(e.ts * 1000).toLocaleTimeString()} ${eventText(e, ui.names)}`, e.kind, e.uuid));
  }
}

function renderChart(id, key, data, labels, start, end) {
  const box = byId(id);
  data = withGaps(data);
  const chart = ui.charts[id];
  if (chart && chart.key === key) {
    chart.window = [start, end];
    chart.plot.setData(data);
    return;
  }
  if (chart) chart.plot.destroy();
  const colours = ["#1a56db", "#9aa5b8"];
  const made = { key, window: [start, end] };
  const width = Math.max(200, box.clientWidth || document.body.clientWidth - 40);
  const opts = {
    width, height: width < 500 ? 200 : 280,
    scales: { x: { time: true, range: (u, min, max) => xRange(min, max, ...made.window) }, y: { range: [0, 1.05] } },
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colours[i], width: i ? 1 : 2 }))],
    axes: [{}, { values: (u, ticks) => ticks.map((t) => `${Math.round(t * 100)}%`) }],
  };
  made.plot = new uPlot(opts, data, box);
  ui.charts[id] = made;
}

function renderHeatmap() {
  const map = ui.heat;
  if (!map) return;
  const rows = state.view === "host" ? map.all.filter((r) => r.host === state.host) : map.all;
  map.rows = rows;
  const box = byId("heatmap-box");
  drawHeatmap(byId("heatmap"), map, Math.max(240, box.clientWidth - 2));
  const minutes = map.step_seconds / 60;
  const scale = byId("heatmap-scale");
  scale.replaceChildren(`${rows.length} GPU${rows.length === 1 ? "" : "s"} · a column is ${minutes >= 60 ? `${minutes / 60} h` : `${minutes} min`} · OFU 0 % `,
    el("span", null, "heat-legend"), " 100 % · ", el("span", null, "heat-none"), " no OFU");
}

function heatTip(event) {
  const map = ui.heat;
  const tip = byId("heatmap-tip");
  const hit = map && map.rows && heatCell(map, event.offsetX, event.offsetY);
  if (!hit) { tip.hidden = true; return null; }
  const row = map.rows[hit.row];
  const v = row.ofu_permille[hit.column];
  const at = new Date((map.start_seconds + hit.column * map.step_seconds) * 1000).toLocaleTimeString();
  tip.textContent = `${row.label} · ${at} · ${v === null ? "no OFU" : `${(v / 10).toFixed(1)}%`}`;
  tip.title = row.uuid;
  tip.style.left = `${Math.min(event.offsetX + 12, map.cssWidth - 220)}px`;
  tip.style.top = `${event.offsetY + 12}px`;
  tip.hidden = false;
  return row;
}

async function refreshHeatmap(now) {
  const seconds = RANGES[state.range];
  const key = state.range;
  if (ui.heatKey === key && Date.now() - ui.heatAt < HISTORY_MS) return;
  const map = await api(`api/heatmap?${new URLSearchParams({ start: now - seconds, end: now })}`);
  map.all = map.rows;
  for (const r of map.all) ui.names[r.uuid] = { label: r.label, host: r.host };
  ui.heat = map;
  ui.heatKey = key;
  ui.heatAt = Date.now();
}

async function refreshHistory(now) {
  const seconds = RANGES[state.range];
  const key = [state.view, state.gpu, state.job, state.range, state.below, state.price].join("|");
  if (ui.historyKey === key && state.range !== "15m" && Date.now() - ui.historyAt < HISTORY_MS) return;
  const start = now - seconds;
  if (state.view === "fleet") {
    const series = await api(`api/fleet/series?${new URLSearchParams({ start, end: now })}`);
    const points = series.points;
    renderChart("chart", "fleet", [points.map((p) => p.ts), points.map((p) => p.ofu)], ["fleet OFU"], start, now);
    byId("chart-title").textContent = `Fleet OFU (last ${RANGE_NAMES[state.range]}, per minute)`;
  } else if (state.view === "gpu" && state.gpu) {
    const query = new URLSearchParams({ uuid: state.gpu, start, end: now, resolution: seriesResolution(seconds) });
    query.append("metric", "ofu");
    query.append("metric", "tensor_active");
    const points = (await api(`api/series?${query}`)).points;
    renderChart("gpu-chart", `gpu:${state.gpu}`,
      [points.map((p) => p.ts), points.map((p) => p.ofu), points.map((p) => p.tensor_active)], ["OFU", "tensor active"], start, now);
  } else if (state.view === "job" && state.job) {
    await refreshJob(start, now);
  }
  ui.historyKey = key;
  ui.historyAt = Date.now();
}

function renderGpuDetail(overview) {
  const g = overview.gpus.find((row) => row.uuid === state.gpu);
  const label = g ? g.label : ui.names[state.gpu] ? ui.names[state.gpu].label : state.gpu;
  const title = byId("gpu-title");
  title.textContent = `OFU of ${label} (last ${RANGE_NAMES[state.range]})`;
  title.title = state.gpu;
  const body = document.querySelector("#gpu-detail tbody");
  body.replaceChildren();
  if (!g) return;
  const rows = [["GPU", g.label], ["uuid", g.uuid], ["model", `${g.name} (${g.sku || "not in the catalog"})`],
    ["OFU", g.stale ? `stale: ${g.stale_reason || "no fresh window"}` : pct(g.ofu_ratio)], ["tensor", pct(g.tensor_active_ratio)],
    ["SM clock", g.sm_clock_hertz === null ? "—" : `${(g.sm_clock_hertz / 1e6).toFixed(0)} MHz`],
    ["DRAM bw", pct(g.dram_bandwidth_ratio)], ["power", g.power_watts === null ? "—" : `${g.power_watts.toFixed(0)} W`],
    ["bottleneck", g.bottleneck]];
  for (const [k, v] of rows) {
    const row = el("tr");
    row.append(el("th", k, null, (TERMS[k.toLowerCase()] || [])[1]), el("td", v));
    body.append(row);
  }
  const jobs = el("tr");
  const td = el("td");
  g.jobs.forEach((j, i) => { if (i) td.append(", "); td.append(link(j.job, { view: "job", job: j.job })); });
  jobs.append(el("th", "jobs"), td);
  body.append(jobs);
}

function renderCrumbs() {
  const nav = byId("crumbs");
  nav.replaceChildren(link("fleet", { view: "fleet" }));
  const add = (node) => nav.append(el("span", " › ", "muted"), node);
  if (state.view === "host" || state.view === "gpu") add(link(state.host || "?", { view: "host", host: state.host }));
  if (state.view === "gpu") {
    const known = ui.names[state.gpu];
    add(el("span", known ? known.label.slice(known.host.length + 3) : state.gpu, null, state.gpu));
  }
  if (state.view === "job") add(el("span", `job ${state.job}`));
  document.querySelectorAll("#ranges button").forEach((b) => b.setAttribute("aria-pressed", `${b.dataset.range === state.range}`));
}

// Which sections a view shows.
function show() {
  for (const v of VIEWS) {
    const section = byId(`view-${v}`);
    if (section) section.hidden = v !== state.view;
  }
  byId("heat").hidden = !(state.view === "fleet" || state.view === "host");
  byId("host-gpus").hidden = state.view !== "host";
  byId("events").closest("section").hidden = state.view === "job";
  byId("below").value = state.below;
  byId("price").value = state.price === null ? "" : state.price;
  renderCrumbs();
}

function viewedHosts(hosts) {
  const wanted = new Set(hosts.filter((h) => isOpen(h)));
  if (state.host && (state.view === "host" || state.view === "gpu")) wanted.add(state.host);
  return [...wanted];
}

async function refresh() {
  const now = Date.now() / 1000;
  try {
    const fleet = await api("api/fleet"); // first and alone: a dead agent is named by this request
    ui.fleetGpus = fleet.gpus;
    renderFleet(fleet);
    const query = new URLSearchParams({ k: WORST_K });
    for (const h of viewedHosts(fleet.hosts || [])) query.append("host", h);
    const minutes = Math.min(1440, RANGES[state.range] / 60);
    const [overview, jobs, events] = await Promise.all([
      api(`api/overview?${query}`), api(`api/jobs/summary?${new URLSearchParams({ minutes, limit: 10 })}`),
      api("api/events?limit=100"),
    ]);
    for (const g of overview.gpus) ui.names[g.uuid] = { label: g.label, host: g.host };
    renderHosts(overview);
    renderWorst(overview.worst);
    renderJobs(jobs);
    byId("jobs-span").textContent = minutes * 60 < RANGES[state.range] ? "over the last 24 h" : "over the range";
    const note = byId("ofu-note");
    note.hidden = !overview.ofu_note;
    note.textContent = overview.ofu_note || "";
    document.querySelectorAll('[data-term="ofu"]').forEach((e) => { e.title = TERMS.ofu[1] + (overview.ofu_note ? `\n${overview.ofu_note}` : ""); });
    if (state.view === "host") {
      gpuRows(document.querySelector("#gpus tbody"), overview.gpus.filter((g) => g.host === state.host), false);
      byId("host-title").textContent = `GPUs of ${state.host}`;
    }
    if (state.view === "gpu") renderGpuDetail(overview);
    const shown = state.view === "gpu" ? events.filter((e) => e.uuid === state.gpu)
      : state.view === "host" ? events.filter((e) => e.uuid && ui.names[e.uuid] && ui.names[e.uuid].host === state.host) : events;
    if (state.view === "fleet" || state.view === "host") await refreshHeatmap(now);
    renderEvents(byId("events"), shown);
    if (state.view === "fleet" || state.view === "host") renderHeatmap();
    await refreshHistory(now);
    renderCrumbs();
    const age = overview.newest_seconds === null ? 0 : Date.now() / 1000 - overview.newest_seconds;
    ui.lastGood = Date.now();
    setLive(age <= OLD_SECONDS, age > OLD_SECONDS ? `data is ${Math.round(age)} s old: the agent samples no more`
      : `updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error instanceof NeedsToken) {
      askToken(error.message);
      setLive(false, `${error.message}: enter it to see the data`);
      return;
    }
    const since = ui.lastGood ? `; what is shown is from ${new Date(ui.lastGood).toLocaleTimeString()}` : "";
    // a link to a job or GPU the agent does not know is a wrong link, not a dead agent
    const unknown = error.status === 404 && (error.path.startsWith("api/report/") || error.path.startsWith("api/series"));
    setLive(false, unknown ? `no ${state.view === "job" ? `job ${state.job}` : `GPU ${state.gpu}`} here (${error.message})`
      : `agent unreachable (${error.message})${since}`);
  }
}

function askToken(why) {
  const dialog = byId("token-dialog");
  byId("token-why").textContent = `${why[0].toUpperCase()}${why.slice(1)}.`;
  if (!dialog.open) dialog.showModal();
}

// Live, or greyed out with why: a dashboard that kept showing its last figures after the agent
// died looked like a healthy fleet.
function setLive(live, message) {
  document.body.classList.toggle("offline", !live);
  const status = byId("status");
  status.textContent = message;
  status.className = live ? "muted" : "alert";
}

function explainTerms() {
  const list = byId("terms-list");
  for (const [, [name, text]] of Object.entries(TERMS)) list.append(el("dt", name), el("dd", text));
  document.querySelectorAll("[data-term]").forEach((e) => { e.title = TERMS[e.dataset.term][1]; });
}

function start() {
  const given = readHash(location.hash);
  if (given.token) sessionStorage.setItem(TOKEN_KEY, given.token); // an old #token= link: kept, out of the URL
  state = given;
  history.replaceState(null, "", writeHash(state));
  explainTerms();
  byId("token-form").addEventListener("submit", () => {
    sessionStorage.setItem(TOKEN_KEY, byId("token-input").value.trim());
    refresh();
  });
  document.querySelectorAll("#ranges button").forEach((b) => b.addEventListener("click", () => go({ range: b.dataset.range })));
  document.querySelectorAll("#hosts th.sortable").forEach((th) => th.addEventListener("click", () => {
    state.sort = th.dataset.sort === "host" ? "host" : state.sort === "ofu" ? "-ofu" : "ofu";
    history.replaceState(null, "", writeHash(state));
    refresh();
  }));
  byId("below").addEventListener("change", (e) => go({ below: Math.min(100, Math.max(0, Number(e.target.value) || 0)) }));
  byId("price").addEventListener("change", (e) => go({ price: Number(e.target.value) > 0 ? Number(e.target.value) : null }));
  const canvas = byId("heatmap");
  canvas.addEventListener("mousemove", heatTip);
  canvas.addEventListener("mouseleave", () => { byId("heatmap-tip").hidden = true; });
  canvas.addEventListener("click", (event) => {
    const row = heatTip(event);
    if (row) go({ view: "gpu", host: row.host, gpu: row.uuid });
  });
  window.addEventListener("hashchange", () => { state = readHash(location.hash); show(); refresh(); });
  window.addEventListener("popstate", () => { state = readHash(location.hash); show(); refresh(); });
  window.addEventListener("resize", () => { renderHeatmap(); });
  show();
  refresh();
  setInterval(refresh, 2000);
}

if (typeof window !== "undefined") start();
