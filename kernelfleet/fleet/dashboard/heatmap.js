// The OFU heatmap: one row per GPU (by host, as /api/heatmap orders them), one column per step,
// drawn on a canvas so that 800 GPUs are 800 rows of pixels, not 800 SVG lines.
"use strict";

const HEAT_GUTTER = 96; // px left of the cells, for host names
const HEAT_AXIS = 18; // px under the cells, for times
// OFU 0 → 1 through five stops (a sequential scale readable by the colour-blind); no OFU is grey.
const HEAT_STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const HEAT_NONE = "#e3e6ec";

function heatColour(permille) {
  if (permille === null || permille === undefined) return HEAT_NONE;
  const x = Math.min(1, Math.max(0, permille / 1000)) * (HEAT_STOPS.length - 1);
  const i = Math.min(HEAT_STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const c = HEAT_STOPS[i].map((v, k) => Math.round(v + f * (HEAT_STOPS[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// Pixels per row: tall enough to hover on a small fleet, one pixel at 800 GPUs and more.
function heatRowHeight(rows) {
  return Math.max(1, Math.min(16, Math.floor(720 / Math.max(1, rows))));
}

// Which cell a point of the canvas (CSS pixels) falls in, or null outside the cells.
function heatCell(map, x, y) {
  const height = heatRowHeight(map.rows.length);
  const width = (map.cssWidth - HEAT_GUTTER) / map.columns;
  const row = Math.floor(y / height);
  const column = Math.floor((x - HEAT_GUTTER) / width);
  if (x < HEAT_GUTTER || row < 0 || row >= map.rows.length || column < 0 || column >= map.columns) return null;
  return { row, column };
}

function drawHeatmap(canvas, map, cssWidth) {
  const height = heatRowHeight(map.rows.length);
  const cssHeight = map.rows.length * height + HEAT_AXIS;
  const scale = window.devicePixelRatio || 1;
  canvas.width = Math.round(cssWidth * scale);
  canvas.height = Math.round(cssHeight * scale);
  canvas.style.width = `${cssWidth}px`;
  canvas.style.height = `${cssHeight}px`;
  canvas.dataset.rows = map.rows.length;
  canvas.dataset.columns = map.columns;
  map.cssWidth = cssWidth;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(scale, 0, 0, scale, 0, 0);
  ctx.clearRect(0, 0, cssWidth, cssHeight);
  const width = (cssWidth - HEAT_GUTTER) / map.columns;
  map.rows.forEach((row, r) => {
    row.ofu_permille.forEach((v, c) => {
      ctx.fillStyle = heatColour(v);
      ctx.fillRect(HEAT_GUTTER + c * width, r * height, Math.ceil(width), height);
    });
  });
  // Host names where a host starts, if there is room since the last one drawn; a line between hosts.
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "top";
  let lastLabel = -Infinity;
  map.rows.forEach((row, r) => {
    if (r && row.host === map.rows[r - 1].host) return;
    const y = r * height;
    if (r) {
      ctx.fillStyle = "#ffffff";
      ctx.fillRect(HEAT_GUTTER, y, cssWidth - HEAT_GUTTER, height > 3 ? 1 : 0);
    }
    if (y - lastLabel >= 13) {
      ctx.fillStyle = "#4a5263";
      ctx.fillText(row.host.length > 14 ? `${row.host.slice(0, 13)}…` : row.host, 2, y);
      lastLabel = y;
    }
  });
  ctx.fillStyle = "#4a5263";
  const y = map.rows.length * height + 4;
  const at = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const end = map.start_seconds + map.columns * map.step_seconds;
  ctx.fillText(at(map.start_seconds), HEAT_GUTTER, y);
  const last = at(end);
  ctx.fillText(last, cssWidth - ctx.measureText(last).width - 2, y);
}
