// gpuwm dashboard: plain JS, no libraries, no network beyond this API.
"use strict";

const $ = (selector) => document.querySelector(selector);
const tokenInput = $("#token");
tokenInput.value = localStorage.getItem("gpuwm-token") || "";
tokenInput.addEventListener("change", () => { localStorage.setItem("gpuwm-token", tokenInput.value); route(); });

async function api(path) {
  const headers = tokenInput.value ? { Authorization: "Bearer " + tokenInput.value } : {};
  const response = await fetch(path, { headers });
  const body = await response.json();
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
function duration(seconds) {
  if (!seconds) return "–";
  if (seconds < 120) return Math.round(seconds) + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}
function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}
function bar(value, max, className) {
  const td = document.createElement("td");
  const span = document.createElement("span");
  span.className = "bar" + (className ? " " + className : "");
  span.style.width = Math.max(0, Math.min(120, max > 0 ? (120 * value) / max : 0)) + "px";
  td.appendChild(span);
  return td;
}
function workloadLink(w) {
  const td = document.createElement("td");
  const a = document.createElement("a");
  a.href = "#/workload/" + encodeURIComponent(w.namespace) + "/" + encodeURIComponent(w.name);
  a.textContent = w.namespace + "/" + w.name;
  td.appendChild(a);
  return td;
}

async function showOverview() {
  $("#overview").hidden = false;
  $("#workload").hidden = true;
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
    tr.append(workloadLink(w), cell(w.project), cell(fmt(w.allocatedGpus, 2), "num"), cell(duration(w.idleSeconds), "num"),
      cell(fmt(w.idleGpuSeconds / 3600, 2), "num"), cell(pct(w.utilization.avg1h), "num"));
    idleRows.appendChild(tr);
  }
  const allRows = $("#workloads tbody");
  allRows.replaceChildren();
  for (const w of workloads.workloads) {
    const tr = document.createElement("tr");
    tr.dataset.workload = w.namespace + "/" + w.name;
    tr.append(workloadLink(w), cell(w.project), cell(w.phase), cell(fmt(w.allocatedGpus, 2), "num"),
      cell(pct(w.utilization.current), "num"), cell(pct(w.memoryUtilization.current), "num"), cell(duration(w.idleSeconds), "num"));
    allRows.appendChild(tr);
  }
  const allocated = projects.projects.reduce((sum, p) => sum + p.allocatedGpus, 0);
  const idleGpus = projects.projects.reduce((sum, p) => sum + p.idleGpus, 0);
  $("#summary").textContent = `${workloads.workloads.length} workloads · ${fmt(allocated, 2)} GPUs allocated · ${fmt(idleGpus, 2)} idle`;
  await showTruth();
}

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

// A line chart on a canvas: axes, min/max labels, gaps where points are null.
function drawChart(canvas, points, scale, unit) {
  const ctx = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height, left = 56, bottom = 22, top = 8, right = 8;
  ctx.clearRect(0, 0, width, height);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  const values = points.map(([, v]) => (v === null ? null : v * scale));
  const present = values.filter((v) => v !== null);
  canvas.dataset.points = String(present.length);
  ctx.strokeStyle = "#dde1ea";
  ctx.strokeRect(left, top, width - left - right, height - top - bottom);
  ctx.fillStyle = "#6b7385";
  ctx.font = "11px sans-serif";
  if (!present.length || points.length < 1) {
    ctx.fillText("no data in this range", left + 10, top + 20);
    return;
  }
  const maxValue = Math.max(...present, unit === "%" ? 100 : 0) || 1;
  const t0 = points[0][0], t1 = points[points.length - 1][0] || t0 + 1;
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (width - left - right);
  const y = (v) => height - bottom - (v / maxValue) * (height - top - bottom);
  ctx.fillText(fmt(maxValue, 0) + " " + unit, 2, top + 10);
  ctx.fillText("0", 2, height - bottom);
  ctx.fillText(new Date(t0 * 1000).toISOString().slice(0, 16).replace("T", " "), left, height - 6);
  const endLabel = new Date(t1 * 1000).toISOString().slice(11, 16);
  ctx.fillText(endLabel, width - right - ctx.measureText(endLabel).width, height - 6);
  ctx.strokeStyle = "#2f6fde";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let drawing = false;
  points.forEach(([t], index) => {
    const v = values[index];
    if (v === null) { drawing = false; return; }
    if (drawing) ctx.lineTo(x(t), y(v)); else ctx.moveTo(x(t), y(v));
    drawing = true;
  });
  ctx.stroke();
  if (present.length === 1) {
    const index = values.findIndex((v) => v !== null);
    ctx.fillStyle = "#2f6fde";
    ctx.fillRect(x(points[index][0]) - 2, y(values[index]) - 2, 4, 4);
  }
}

async function showWorkload(namespace, name) {
  $("#overview").hidden = true;
  $("#workload").hidden = false;
  const base = "/api/v1/namespaces/" + encodeURIComponent(namespace) + "/workloads/" + encodeURIComponent(name);
  const [w, metrics] = await Promise.all([
    api(base),
    api(base + "/metrics?metric=gpu_utilization_percent&metric=gpu_memory_used_bytes&metric=gpu_power_watts"),
  ]);
  $("#workload-title").textContent = `${w.kind} ${w.namespace}/${w.name}`;
  const facts = $("#workload-facts");
  facts.replaceChildren();
  const pairs = [["project", w.project], ["phase", w.phase], ["GPUs", fmt(w.allocatedGpus, 2)],
    ["utilization (1h)", pct(w.utilization.avg1h)], ["idle for", duration(w.idleSeconds)],
    ["wasted GPU-h", fmt(w.idleGpuSeconds / 3600, 2)], ["energy", fmt(w.energyJoules / 3.6e6, 3) + " kWh"],
    ["nodes", w.nodes.join(", ") || "–"]];
  for (const [key, value] of pairs) {
    const dt = document.createElement("dt"); dt.textContent = key;
    const dd = document.createElement("dd"); dd.textContent = value;
    facts.append(dt, dd);
  }
  const scales = { gpu_utilization_percent: [1, "%"], gpu_memory_used_bytes: [1 / 1024 ** 3, "GiB"], gpu_power_watts: [1, "W"] };
  for (const series of metrics.series) {
    const [scale, unit] = scales[series.metric];
    drawChart($("#chart-" + series.metric), series.points, scale, unit);
  }
}

async function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  document.body.dataset.ready = "false";
  try {
    if (parts[0] === "workload" && parts.length === 3) await showWorkload(parts[1], parts[2]);
    else await showOverview();
    showError(null);
  } catch (error) {
    showError(error);
  }
  document.body.dataset.ready = "true";
}

window.addEventListener("hashchange", route);
route();
