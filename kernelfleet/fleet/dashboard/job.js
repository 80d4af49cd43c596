// A job's page: report.py's rows as /api/report/{job} serves them (its GPUs, bottleneck mix,
// regressions, OFU over time) and the GPU-hours and dollars below the chosen OFU. Figures are the
// server's; this only draws them (with app.js's api, el, cell, gpuLink and renderChart).
"use strict";

async function refreshJob(start, now) {
  const query = new URLSearchParams({ below_ofu: state.below / 100 });
  if (state.price !== null) query.set("usd_per_gpu_hour", state.price);
  const page = await api(`api/report/${encodeURIComponent(state.job)}?${query}`);
  const r = page.report;
  const spent = page.spent;
  byId("job-title").textContent = `Job ${r.job}`;
  const when = (t) => new Date(t * 1000).toLocaleString();
  byId("job-when").textContent = `${r.kind} job of ${r.user || "an unknown user"} · ${when(r.first_seen)} → ${when(r.last_seen)}` +
    ` · ${r.gpus.length} GPUs`;
  byId("job-hours").textContent = `${spent.gpu_hours.toFixed(2)} h`;
  byId("job-usd").textContent = `$${spent.usd.toFixed(2)}`;
  const priced = Object.entries(page.prices).map(([name, p]) => (p ? `${name}: $${p.usd_per_hour}/h` : `${name}: no price`));
  const note = byId("job-price-note");
  note.textContent = priced.join(" · ") + (spent.unpriced_gpu_hours ? ` · ${spent.unpriced_gpu_hours.toFixed(2)} h unpriced` : "");
  note.title = Object.entries(page.prices).map(([name, p]) => `${name}: ${p ? p.source : "the catalog lists no price"}`).join("\n");
  const mix = byId("job-mix");
  const legend = byId("job-mix-list");
  mix.replaceChildren();
  legend.replaceChildren();
  const shares = Object.entries(r.bottleneck_shares);
  if (!shares.length) legend.append(el("li", "no bottleneck classes in this range yet", "muted"));
  for (const [name, share] of shares) {
    const part = el("div", null, `b-bg-${name.replace(/\W/g, "-")}`, `${name}: ${pct(share)} — ${(TERMS[name] || [])[1] || ""}`);
    part.style.width = `${100 * share}%`;
    mix.append(part);
    const item = el("li", null, null, (TERMS[name] || [])[1]);
    item.append(el("span", "", `swatch b-bg-${name.replace(/\W/g, "-")}`), ` ${name} ${pct(share)}`);
    legend.append(item);
  }
  const body = document.querySelector("#job-gpus tbody");
  body.replaceChildren();
  r.gpus.forEach((g, i) => {
    const s = spent.gpus[i];
    const label = `${g.host} / GPU ${g.gpu_index}` + (g.mig_instance === null ? "" : ` mig ${g.mig_instance}`);
    const row = el("tr");
    row.dataset.uuid = g.uuid;
    row.append(cell(gpuLink(label, g)), el("td", g.name, "wide"), el("td", pct(g.ofu_ratio), "num ofu"),
      el("td", (g.seconds / 3600).toFixed(2), "num"), el("td", g.mean_share.toFixed(2), "num wide"),
      el("td", s.gpu_hours.toFixed(2), "num"), el("td", s.usd === null ? "—" : s.usd.toFixed(2), "num"),
      el("td", g.approximate ? "shared: approximate" : "", "wide"));
    body.append(row);
  });
  const points = RANGES[state.range] <= 86400 ? page.timeline_1m : page.timeline_1h;
  renderChart("job-chart", `job:${r.job}`, [points.map((p) => p.ts), points.map((p) => p.ofu_ratio)], ["job OFU"], start, now);
  byId("job-chart-title").textContent = `OFU of the job (last ${RANGE_NAMES[state.range]}, per ${RANGES[state.range] <= 86400 ? "minute" : "hour"})`;
  renderEvents(byId("job-events"), r.events.map((e) => ({ ...e, uuid: null })));
}
