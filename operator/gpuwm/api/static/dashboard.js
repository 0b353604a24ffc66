// gpuwm dashboard: plain JS, no libraries, no network beyond this API. Pages: #/ (projects and workloads),
// #/workload/NS/NAME, #/fleet (nodes), #/node/NAME, #/queue (workloads waiting for GPUs). The range bar drives
// start/end/step of every chart.
"use strict";

const $ = (selector) => document.querySelector(selector);
const tokenInput = $("#token");
// the token lives as long as the tab: sessionStorage, never localStorage (kept on disk, shared by every tab)
tokenInput.value = sessionStorage.getItem("gpuwm-token") || "";
tokenInput.addEventListener("change", () => { sessionStorage.setItem("gpuwm-token", tokenInput.value); route(); });
const PAGE_ROWS = 25;
const STATES = { active: "#15803d", "idle-held": "#c2410c", "allocated-empty": "#d97706", free: "#2f6fde",
  unhealthy: "#b91c1c", unmonitored: "#6b7385" };

function headers() { return tokenInput.value ? { Authorization: "Bearer " + tokenInput.value } : {}; }
async function api(path) {
  const response = await fetch(path, { headers: headers() });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.message || response.statusText);
  return body;
}
function showError(error) {
  const box = $("#error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

const fmt = (value, digits = 1) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const pct = (value) => (value === null || value === undefined ? "–" : fmt(value, 1) + " %");
const when = (t) => (t ? new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ") : "–");
function duration(seconds) {
  if (!seconds) return "–";
  if (seconds < 120) return Math.round(seconds) + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}
// an ended workload has no idle time: it holds nothing
const idleFor = (w) => (w.endTime !== null && w.endTime !== undefined ? "ended" : duration(w.idleSeconds));
function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}
// a table's one row saying why it has no rows, across its `columns`
function emptyRow(text, columns) {
  const tr = document.createElement("tr");
  const td = cell(text, "empty");
  td.colSpan = columns;
  tr.appendChild(td);
  return tr;
}
function bar(value, max, className) {
  const td = document.createElement("td");
  const span = document.createElement("span");
  span.className = "bar" + (className ? " " + className : "");
  span.style.width = Math.max(0, Math.min(120, max > 0 ? (120 * value) / max : 0)) + "px";
  td.appendChild(span);
  return td;
}
function link(text, href) {
  const td = document.createElement("td");
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  td.appendChild(a);
  return td;
}
const workloadHref = (w) => "#/workload/" + encodeURIComponent(w.namespace) + "/" + encodeURIComponent(w.name);
function show(id) {
  for (const section of ["overview", "workload", "fleet", "node", "queue"]) $("#" + section).hidden = section !== id;
}

// ---- the time range: a preset (seconds before the latest data), or custom start/end (zoom sets these)
const range = { preset: "", start: null, end: null };
function rangeQuery() {
  const now = Date.now() / 1000;
  let start = null, end = null;
  if (range.preset === "custom" && range.start !== null) { start = range.start; end = range.end; }
  else if (range.preset) { end = now; start = now - Number(range.preset); }
  if (start === null) { $("#range-text").textContent = ""; return ""; }
  const step = Math.max(15, Math.ceil((end - start) / 600 / 15) * 15);  // ~600 points, whole status intervals
  $("#range-text").textContent = `${when(start)} – ${when(end)}, one point per ${duration(step)}`;
  return `&start=${start.toFixed(0)}&end=${end.toFixed(0)}&step=${step}`;
}
const toLocalInput = (t) => new Date(t * 1000).toISOString().slice(0, 16);
const fromLocalInput = (text) => Date.parse(text + ":00Z") / 1000;
function setRange(preset, start = null, end = null) {
  range.preset = preset; range.start = start; range.end = end;
  $("#range").value = preset;
  $("#custom-range").hidden = preset !== "custom";
  if (start !== null) { $("#range-start").value = toLocalInput(start); $("#range-end").value = toLocalInput(end); }
  route();
}
$("#range").addEventListener("change", (event) => {
  const value = event.target.value;
  if (value === "custom") {
    const end = Date.now() / 1000;
    setRange("custom", range.start ?? end - 3600, range.end ?? end);
  } else setRange(value);
});
$("#range-apply").addEventListener("click", () => {
  const start = fromLocalInput($("#range-start").value), end = fromLocalInput($("#range-end").value);
  if (!(end > start)) { showError("the range's end must be after its start"); return; }
  setRange("custom", start, end);
});
const zoom = (start, end) => setRange("custom", start, end);

// ---- tables: sort by a header, filter, page
const tableState = { workloads: { key: "name", descending: false, page: 0 }, nodes: { key: "name", descending: false, page: 0 } };
function sortable(tableId, redraw) {
  for (const th of document.querySelectorAll(`#${tableId} th[data-key]`)) {
    th.addEventListener("click", () => {
      const state = tableState[tableId];
      state.descending = state.key === th.dataset.key ? !state.descending : false;
      state.key = th.dataset.key;
      state.page = 0;
      redraw();
    });
  }
}
function sortRows(rows, tableId, value) {
  const state = tableState[tableId];
  for (const th of document.querySelectorAll(`#${tableId} th[data-key]`)) {
    th.dataset.sorted = th.dataset.key === state.key ? (state.descending ? "descending" : "ascending") : "";
  }
  const direction = state.descending ? -1 : 1;
  return rows.slice().sort((a, b) => {
    const x = value(a, state.key), y = value(b, state.key);
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * direction;
  });
}
function fillSelect(select, values) {
  const chosen = select.value;
  const first = select.options[0];
  select.replaceChildren(first, ...values.map((v) => new Option(v, v)));
  select.value = values.includes(chosen) ? chosen : "";
}

let allWorkloads = [];
const workloadValue = (w, key) => ({ name: w.namespace + "/" + w.name, utilization: w.utilization.current,
  memory: w.memoryUtilization.current, idleSeconds: w.endTime !== null ? null : w.idleSeconds }[key] ?? w[key]);
function drawWorkloads() {
  const text = $("#filter-text").value.trim().toLowerCase();
  const project = $("#filter-project").value, namespace = $("#filter-namespace").value, phase = $("#filter-phase").value;
  const idleOnly = $("#filter-idle").checked;
  const chosen = allWorkloads.filter((w) => (!text || (w.namespace + "/" + w.name).toLowerCase().includes(text))
    && (!project || w.project === project) && (!namespace || w.namespace === namespace) && (!phase || w.phase === phase)
    && (!idleOnly || (w.allocatedGpus > 0 && w.idleSeconds > 0 && w.endTime === null)));
  const sorted = sortRows(chosen, "workloads", workloadValue);
  const state = tableState.workloads;
  const pages = Math.max(1, Math.ceil(sorted.length / PAGE_ROWS));
  state.page = Math.min(state.page, pages - 1);
  const rows = $("#workloads tbody");
  rows.replaceChildren();
  for (const w of sorted.slice(state.page * PAGE_ROWS, (state.page + 1) * PAGE_ROWS)) {
    const tr = document.createElement("tr");
    tr.dataset.workload = w.namespace + "/" + w.name;
    tr.append(link(w.namespace + "/" + w.name, workloadHref(w)), cell(w.project), cell(w.phase),
      cell(fmt(w.allocatedGpus, 2), "num"), cell(pct(w.utilization.current), "num"),
      cell(pct(w.memoryUtilization.current), "num"), cell(idleFor(w), "num"));
    rows.appendChild(tr);
  }
  if (!sorted.length) {
    rows.appendChild(emptyRow(allWorkloads.length ? "no workload matches these filters" : "no workloads yet", 7));
  }
  $("#page-text").textContent = `${sorted.length} workloads · page ${state.page + 1} of ${pages}`;
  $("#page-prev").disabled = state.page === 0;
  $("#page-next").disabled = state.page >= pages - 1;
}
for (const id of ["#filter-text", "#filter-project", "#filter-namespace", "#filter-phase", "#filter-idle"]) {
  for (const kind of ["input", "change"]) $(id).addEventListener(kind, () => { tableState.workloads.page = 0; drawWorkloads(); });
}
$("#page-prev").addEventListener("click", () => { tableState.workloads.page--; drawWorkloads(); });
$("#page-next").addEventListener("click", () => { tableState.workloads.page++; drawWorkloads(); });
sortable("workloads", drawWorkloads);

async function showOverview() {
  show("overview");
  const [projects, workloads] = await Promise.all([api("/api/v1/projects"), api("/api/v1/workloads")]);
  const maxAllocated = Math.max(0, ...projects.projects.map((p) => p.allocatedGpus));
  const projectRows = $("#projects tbody");
  projectRows.replaceChildren();
  for (const p of projects.projects) {
    const tr = document.createElement("tr");
    tr.dataset.project = p.name;
    tr.append(cell(p.name), cell(String(p.workloads), "num"), cell(fmt(p.allocatedGpus, 2), "num"),
      cell(fmt(p.idleGpus, 2), "num"), cell(pct(p.utilization.current ?? p.utilization.avg1h), "num"),
      cell(fmt(p.idleGpuSeconds / 3600, 2), "num"), bar(p.allocatedGpus, maxAllocated, p.idleGpus > 0 ? "idle" : ""));
    projectRows.appendChild(tr);
  }
  const idle = workloads.workloads
    .filter((w) => w.allocatedGpus > 0 && w.idleSeconds > 0 && w.endTime === null)
    .sort((a, b) => b.idleGpuSeconds - a.idleGpuSeconds);
  const idleRows = $("#idle tbody");
  idleRows.replaceChildren();
  for (const w of idle) {
    const tr = document.createElement("tr");
    tr.dataset.workload = w.namespace + "/" + w.name;
    tr.append(link(w.namespace + "/" + w.name, workloadHref(w)), cell(w.project), cell(fmt(w.allocatedGpus, 2), "num"),
      cell(duration(w.idleSeconds), "num"), cell(fmt(w.idleGpuSeconds / 3600, 2), "num"), cell(pct(w.utilization.avg1h), "num"));
    idleRows.appendChild(tr);
  }
  allWorkloads = workloads.workloads;
  const distinct = (field) => [...new Set(allWorkloads.map((w) => w[field]))].sort();
  fillSelect($("#filter-project"), distinct("project"));
  fillSelect($("#filter-namespace"), distinct("namespace"));
  fillSelect($("#filter-phase"), distinct("phase"));
  drawWorkloads();
  const allocated = projects.projects.reduce((sum, p) => sum + p.allocatedGpus, 0);
  const idleGpus = projects.projects.reduce((sum, p) => sum + p.idleGpus, 0);
  $("#summary").textContent = `${workloads.workloads.length} workloads · ${fmt(allocated, 2)} GPUs allocated · ${fmt(idleGpus, 2)} idle`;
  await showReportCost();
  await showTruth();
}

// ---- the period report: the range bar's period (default: the last 24 h of data), as a CSV or FOCUS file
const reportQuery = () => rangeQuery().replace(/&step=\d+/, "");
$("#report-download").addEventListener("click", async () => {
  const status = $("#report-status");
  const by = $("#report-by").value, format = $("#report-format").value;
  status.textContent = "preparing…";
  try {
    const response = await fetch(`/api/v1/report?format=${format}&by=${by}${reportQuery()}`, { headers: headers() });
    const text = await response.text();
    if (!response.ok) throw new Error((JSON.parse(text || "{}").message) || response.statusText);
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
    a.download = format === "focus" ? "gpuwm-focus.csv" : `gpuwm-report-${by}.csv`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    // less the header, and the report's total line (a FOCUS file has none: its charges add up to it)
    const rows = text.trim().split("\n").length - (format === "focus" ? 1 : 2);
    status.textContent = format === "focus" ? `${rows} charges downloaded` : `${rows} rows downloaded`;
    status.dataset.rows = String(rows);
  } catch (error) {
    status.textContent = "";
    showError(error);
  }
});

// ---- what the period cost (with pricing): the report's costliest rows and its total; hidden where unpriced
const COST_ROWS = 10;
const reportKey = { project: (r) => r.project, namespace: (r) => r.namespace,
  workload: (r) => r.namespace + "/" + r.workload };
async function showReportCost() {
  const by = $("#report-by").value;
  const report = await api(`/api/v1/report?by=${by}${reportQuery()}`);
  const priced = Boolean(report.currency);
  $("#report-cost").hidden = !priced;
  $("#report-format-focus").hidden = !priced;  // FOCUS lists charges: only with prices
  if (!priced) { $("#report-format").value = "csv"; return; }
  $("#report-cost-key").textContent = by;
  const ranked = report.rows.slice().sort((a, b) => (b.cost ?? 0) - (a.cost ?? 0));
  const rows = $("#report-cost tbody");
  rows.replaceChildren();
  for (const r of [...ranked.slice(0, COST_ROWS), report.total]) {
    const tr = document.createElement("tr");
    const name = r === report.total ? "total" : reportKey[by](r);
    tr.dataset.row = name;
    tr.append(cell((r.exact ? "" : "~") + name), cell(fmt(r.allocatedGpuHours, 2), "num"),
      cell(fmt(r.idleGpuHours, 2), "num"), cell(fmt(r.cost, 2), "num"), cell(fmt(r.idleCost, 2), "num"),
      cell(fmt(r.unpricedGpuHours, 2), "num"));
    rows.appendChild(tr);
  }
  const shown = ranked.length > COST_ROWS ? `the ${COST_ROWS} costliest of ${ranked.length} rows` : "every row";
  $("#report-cost-caption").textContent = `Cost of the period in ${report.currency} (${shown}; idle cost: GPUs ` +
    `held and not used, a part of the cost${report.exact ? "" : "; ~: partly apportioned by time"})`;
}
$("#report-by").addEventListener("change", () => showReportCost().catch(showError));

// `gpuwm demo` only: the simulator's exact figures (/demo/truth) against what the API says. The workloads
// are read between two answers of the same status interval, the second not `recording` (the next one being
// stored). `gpuwm api` and the controller answer 404: then the dashboard stops asking.
let demoTruth = true;
async function showTruth() {
  const box = $("#truth");
  for (let attempt = 0; demoTruth && attempt < 10; attempt++) {
    if (attempt) await new Promise((resolve) => setTimeout(resolve, 50));  // between two stored intervals
    const probe = await fetch("/demo/truth");
    if (probe.status === 404) demoTruth = false;
    if (!probe.ok) break;
    const before = await probe.json();
    const listed = await api("/api/v1/workloads");
    const after = await api("/demo/truth");
    if (before.at !== after.at || after.recording) continue;  // an interval was being stored meanwhile: again
    const shown = new Map(listed.workloads.map((w) => [w.namespace + "/" + w.name, w]));
    let largest = 0, compared = 0, allocated = 0;
    for (const truth of before.workloads) {
      const w = shown.get(truth.namespace + "/" + truth.name);
      if (!w) continue;
      compared += 1;
      allocated += truth.allocatedGpuSeconds;
      for (const field of ["allocatedGpuSeconds", "activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds"]) {
        largest = Math.max(largest, Math.abs(truth[field] - w[field]));
      }
    }
    box.textContent = `Simulated fleet: ${compared} workloads, ${fmt(allocated / 3600, 2)} GPU-h allocated; ` +
      `against the simulator's ground truth the largest gap in a workload's GPU-seconds is ${fmt(largest, 3)}.`;
    box.hidden = false;
    return;
  }
  box.hidden = true;
}

// ---- charts
const CHARTS = [
  ["gpu_utilization_percent", "GPU utilization (%)", 1, "%", 100],
  ["gpu_memory_used_bytes", "GPU memory used (GiB)", 1 / 1024 ** 3, "GiB", 0],
  ["gpu_power_watts", "GPU power (W)", 1, "W", 0],
];
function seriesLabel(labels) {
  if (labels.uuid) return `${labels.node || ""} GPU ${labels.gpu ?? ""} ${labels.pod ? "(" + labels.pod + ")" : ""}`.trim();
  return labels.node || labels.pod || "";
}
function drawCharts(container, body) {
  container.replaceChildren();
  for (const [metric, title, scale, unit, max] of CHARTS) {
    const series = body.series.filter((s) => s.metric === metric);
    if (!series.length) continue;
    const figure = document.createElement("figure");
    figure.innerHTML = `<figcaption>${title}</figcaption>`;
    container.appendChild(figure);
    const chart = window.gpuwmChart.lineChart(figure, series.map((s) => ({ label: seriesLabel(s.labels), points: s.points })),
      { scale, unit, max, onZoom: zoom, tooltip: $("#tooltip") });
    chart.canvas.id = "chart-" + metric;
  }
}
const METRICS = CHARTS.map(([metric]) => "metric=" + metric).join("&");

async function showWorkload(namespace, name) {
  show("workload");
  const charts = $("#workload-charts");
  $("#workload-title").textContent = "";
  $("#workload-facts").replaceChildren();
  charts.replaceChildren();
  const base = "/api/v1/namespaces/" + encodeURIComponent(namespace) + "/workloads/" + encodeURIComponent(name);
  const w = await api(base);  // an unknown workload stops here: its error alone, no empty charts
  const by = $("#breakdown").value;
  const metrics = await api(`${base}/metrics?${METRICS}${by ? "&by=" + by : ""}${rangeQuery()}`);
  $("#workload-title").textContent = `${w.kind} ${w.namespace}/${w.name}`;
  const ended = w.endTime !== null && w.endTime !== undefined;
  const pairs = [["project", w.project], ["phase", w.phase], ["GPUs", fmt(w.allocatedGpus, 2)],
    ["utilization (1h)", pct(w.utilization.avg1h)], ...(ended ? [["ended", when(w.endTime)]] : [["idle for", duration(w.idleSeconds)]]),
    ["wasted GPU-h", fmt(w.idleGpuSeconds / 3600, 2)], ["energy", fmt(w.energyJoules / 3.6e6, 3) + " kWh"],
    ["nodes", w.nodes.join(", ") || "–"],
    // from the workload object itself, where gpuwm watches it (issue 35)
    ...(w.requestedGpus !== null && w.requestedGpus !== undefined ? [["requested GPUs", fmt(w.requestedGpus, 2)]] : []),
    ["waited", duration(w.waitSeconds)], ...(w.queuedSeconds ? [["queued", duration(w.queuedSeconds)]] : []),
    ...(w.localQueue || w.clusterQueue ? [["Kueue queues", `${w.localQueue || "–"} → ${w.clusterQueue || "–"}`]] : [])];
  for (const [key, value] of pairs) {
    const dt = document.createElement("dt"); dt.textContent = key;
    const dd = document.createElement("dd"); dd.textContent = value;
    $("#workload-facts").append(dt, dd);
  }
  drawCharts(charts, metrics);
}
$("#breakdown").addEventListener("change", () => route());

// ---- fleet
function statesText(states) {
  return Object.entries(states).map(([state, count]) => `${count} ${state}`).join(", ");
}
let allNodes = [];
const nodeValue = (n, key) => n[key];
function drawNodes() {
  const rows = $("#nodes tbody");
  rows.replaceChildren();
  for (const n of sortRows(allNodes, "nodes", nodeValue)) {
    const tr = document.createElement("tr");
    tr.dataset.node = n.name;
    const states = document.createElement("td");
    for (const [state, count] of Object.entries(n.states)) {
      const chip = document.createElement("span");
      chip.className = "state";
      chip.style.background = STATES[state] || "#6b7385";
      chip.textContent = `${count} ${state}`;
      states.appendChild(chip);
    }
    tr.append(link(n.name, "#/node/" + encodeURIComponent(n.name)), cell(String(n.gpus), "num"),
      cell(fmt(n.allocatedUnits, 2) + (n.unnamedUnits ? ` (+${fmt(n.unnamedUnits, 2)} unnamed)` : ""), "num"),
      cell(fmt(n.totalUnits, 2), "num"), states, cell(pct(n.utilizationPercent), "num"), cell(n.models.join(", ")),
      cell(when(n.lastSampleTime)));
    rows.appendChild(tr);
  }
  if (!allNodes.length) {
    rows.appendChild(emptyRow("no GPU node has reported yet", 8));
  }
}
sortable("nodes", drawNodes);
const legend = $("#state-legend");
for (const [state, color] of Object.entries(STATES)) {
  const chip = document.createElement("span");
  chip.className = "state";
  chip.style.background = color;
  chip.textContent = state;
  legend.appendChild(chip);
}

async function showFleet() {
  show("fleet");
  const nodes = await api("/api/v1/nodes");
  allNodes = nodes.nodes;
  drawNodes();
  const gpus = allNodes.reduce((sum, n) => sum + n.gpus, 0);
  const free = allNodes.reduce((sum, n) => sum + (n.states.free || 0), 0);
  $("#summary").textContent = `${allNodes.length} nodes · ${gpus} GPUs · ${free} free · as of ${when(nodes.at)}`;
}

async function showNode(name) {
  show("node");
  $("#node-title").textContent = "";
  const body = $("#node-gpus tbody");
  body.replaceChildren();
  $("#node-charts").replaceChildren();
  const gpus = await api("/api/v1/gpus?node=" + encodeURIComponent(name));
  if (!gpus.gpus.length) throw new Error(`no GPU node ${JSON.stringify(name)} in the store's latest intervals`);
  $("#node-title").textContent = `Node ${name}`;
  for (const g of gpus.gpus) {
    const tr = document.createElement("tr");
    tr.dataset.uuid = g.uuid;
    tr.dataset.state = g.state;
    const state = cell(g.state);
    state.innerHTML = "";
    const chip = document.createElement("span");
    chip.className = "state";
    chip.style.background = STATES[g.state] || "#6b7385";
    chip.textContent = g.state;
    state.appendChild(chip);
    const holders = g.holders.map((h) => `${h.namespace}/${h.workload} (${fmt(h.units, 2)})`).join(", ");
    tr.append(cell((g.parentUuid ? "  └ " : "") + g.uuid + (g.index !== null ? ` #${g.index}` : "")), cell(g.model || "–"),
      cell(g.migParent ? "MIG parent" : g.migProfile || "–"), cell(fmt(g.deviceUnits, 2), "num"), state,
      cell(holders || "–"), cell(fmt(g.utilizationPercent, 1), "num"),
      cell(g.memoryUsedBytes === null ? "–" : fmt(g.memoryUsedBytes / 1024 ** 3, 1) + " GiB", "num"), cell(when(g.lastSampleTime)));
    body.appendChild(tr);
  }
  const metrics = await api(`/api/v1/nodes/${encodeURIComponent(name)}/metrics?${METRICS}${rangeQuery()}`);
  drawCharts($("#node-charts"), metrics);
}

// ---- the queue: who waits for GPUs, for how long, for how many (GET /api/v1/queue)
let queueView = { workloads: [] };
function drawQueue() {
  const project = $("#queue-project").value, namespace = $("#queue-namespace").value;
  const chosen = queueView.workloads.filter((w) => (!project || w.project === project) && (!namespace || w.namespace === namespace));
  const longest = Math.max(0, ...chosen.map((w) => w.waitSeconds));
  const rows = $("#queue-workloads tbody");
  rows.replaceChildren();
  for (const w of chosen) {  // the API's order: longest wait first
    const tr = document.createElement("tr");
    tr.dataset.workload = w.namespace + "/" + w.name;
    tr.dataset.phase = w.phase;
    tr.append(link(w.namespace + "/" + w.name, workloadHref(w)), cell(w.project), cell(w.phase),
      cell(w.requestedGpus === null ? "–" : fmt(w.requestedGpus, 2), "num"), cell(duration(w.waitSeconds), "num"),
      bar(w.waitSeconds, longest, w.phase === "Queued" ? "queued" : "pending"), cell(duration(w.queuedSeconds), "num"),
      cell(w.localQueue || "–"), cell(w.clusterQueue || "–"), cell(when(w.createdTime)));
    rows.appendChild(tr);
  }
  if (!chosen.length) {
    rows.appendChild(emptyRow(queueView.workloads.length ? "no waiting workload matches these filters" : "no workload is waiting for GPUs", 10));
  }
}
for (const id of ["#queue-project", "#queue-namespace"]) $(id).addEventListener("change", drawQueue);

async function showQueue() {
  show("queue");
  const [view, projects] = await Promise.all([api("/api/v1/queue"), api("/api/v1/projects")]);
  queueView = view;
  const distinct = (field) => [...new Set(view.workloads.map((w) => w[field]))].sort();
  fillSelect($("#queue-project"), distinct("project"));
  fillSelect($("#queue-namespace"), distinct("namespace"));
  drawQueue();
  const rows = $("#queue-projects tbody");
  rows.replaceChildren();
  const demand = projects.projects.filter((p) => p.requestedGpus > 0 || p.queuedWorkloads > 0)
    .sort((a, b) => b.requestedGpus - a.requestedGpus || a.name.localeCompare(b.name));
  for (const p of demand) {
    const tr = document.createElement("tr");
    tr.dataset.project = p.name;
    tr.append(cell(p.name), cell(String(p.queuedWorkloads), "num"), cell(fmt(p.requestedGpus, 2), "num"),
      cell(duration(p.longestQueuedSeconds), "num"), cell(fmt(p.allocatedGpus, 2), "num"),
      cell(p.quota === null ? "–" : fmt(p.quota, 2), "num"));
    rows.appendChild(tr);
  }
  if (!demand.length) {
    rows.appendChild(emptyRow("no project waits for GPUs", 6));
  }
  $("#summary").textContent = `${view.workloads.length} waiting · ${view.queued} queued · ${view.pending} pending · `
    + `${fmt(view.requestedGpus, 2)} GPUs requested · longest wait ${duration(view.longestWaitSeconds)}`;
}

async function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  document.body.dataset.ready = "false";
  showError(null);
  $("#tooltip").hidden = true;
  try {
    if (parts[0] === "workload" && parts.length === 3) await showWorkload(parts[1], parts[2]);
    else if (parts[0] === "fleet") await showFleet();
    else if (parts[0] === "node" && parts.length === 2) await showNode(parts[1]);
    else if (parts[0] === "queue") await showQueue();
    else await showOverview();
  } catch (error) {
    showError(error);
  }
  document.body.dataset.ready = "true";
}

window.addEventListener("hashchange", route);
route();
