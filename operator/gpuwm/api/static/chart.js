// gpuwm's line chart: a canvas that fills its panel and redraws on resize, time ticks, a legend, a hover
// read-out, gaps where a point is null, and drag-to-zoom. Plain JS; exposed as window.gpuwmChart.
"use strict";

(function () {
  const COLORS = ["#2f6fde", "#c2410c", "#15803d", "#7c3aed", "#0e7490", "#be185d", "#a16207", "#4b5563"];
  const TICK_STEPS = [60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];

  // Tick times (epoch seconds) at a round UTC step, at most `most` of them between t0 and t1.
  function timeTicks(t0, t1, most) {
    const span = Math.max(1, t1 - t0);
    const step = TICK_STEPS.find((s) => span / s <= most) || Math.ceil(span / most / 86400) * 86400;
    const ticks = [];
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push(t);
    return { step, ticks };
  }
  function tickLabel(t, step) {
    const iso = new Date(t * 1000).toISOString();
    return step >= 86400 ? iso.slice(5, 10) : iso.slice(11, 16);
  }
  // A round upper bound for the y axis and its ticks.
  function valueTicks(max) {
    const raw = max / 4, power = 10 ** Math.floor(Math.log10(raw || 1));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const ticks = [];
    for (let v = 0; v <= max + step * 0.999; v += step) ticks.push(v);
    return ticks;
  }
  const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));

  // `series`: [{label, points: [[t, v|null]]}]; options: {scale, unit, max, onZoom(t0, t1), tooltip}
  function lineChart(figure, series, options) {
    const canvas = document.createElement("canvas");
    figure.appendChild(canvas);
    const legend = document.createElement("div");
    legend.className = "chart-legend";
    if (series.length > 1) {
      series.forEach((one, index) => {
        const item = document.createElement("span");
        const swatch = document.createElement("i");
        swatch.style.background = COLORS[index % COLORS.length]; // a style property: the page's CSP allows no style attribute
        item.append(swatch, document.createTextNode(one.label));
        legend.appendChild(item);
      });
      figure.appendChild(legend);
    }
    const scale = options.scale || 1, unit = options.unit || "";
    const values = series.map((one) => one.points.map(([, v]) => (v === null ? null : v * scale)));
    const present = values.flat().filter((v) => v !== null);
    canvas.dataset.points = String(series.length ? values[0].filter((v) => v !== null).length : 0);
    canvas.dataset.series = String(series.length);
    const times = series.length ? series[0].points.map(([t]) => t) : [];
    const t0 = times.length ? times[0] : 0, t1 = times.length ? times[times.length - 1] : 1;
    const max = valueTicks(Math.max(options.max || 0, ...present, 0) || 1);
    const top = max[max.length - 1];
    const box = { left: 52, right: 10, top: 8, bottom: 24 };
    let drag = null, hover = null;

    function geometry() {
      const width = canvas.width / devicePixelRatio, height = canvas.height / devicePixelRatio;
      const x = (t) => box.left + ((t - t0) / Math.max(1, t1 - t0)) * (width - box.left - box.right);
      const y = (v) => height - box.bottom - (v / top) * (height - box.top - box.bottom);
      const time = (px) => t0 + ((px - box.left) / (width - box.left - box.right)) * (t1 - t0);
      return { width, height, x, y, time };
    }
    function draw() {
      const cssWidth = Math.max(240, figure.clientWidth - 16);
      const cssHeight = cssWidth < 600 ? 160 : 200;
      canvas.style.width = cssWidth + "px";
      canvas.style.height = cssHeight + "px";
      canvas.width = Math.round(cssWidth * devicePixelRatio);
      canvas.height = Math.round(cssHeight * devicePixelRatio);
      const ctx = canvas.getContext("2d");
      ctx.setTransform(devicePixelRatio, 0, 0, devicePixelRatio, 0, 0);
      const { width, height, x, y } = geometry();
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, width, height);
      ctx.font = "11px sans-serif";
      ctx.fillStyle = "#6b7385";
      if (!present.length) {
        ctx.strokeStyle = "#dde1ea";
        ctx.strokeRect(box.left, box.top, width - box.left - box.right, height - box.top - box.bottom);
        ctx.fillText("no data in this range", box.left + 10, box.top + 20);
        return;
      }
      ctx.strokeStyle = "#eef0f5";
      for (const v of max) {
        ctx.beginPath(); ctx.moveTo(box.left, y(v)); ctx.lineTo(width - box.right, y(v)); ctx.stroke();
        ctx.fillText(fmt(v) + (v === top ? " " + unit : ""), 2, y(v) + 4);
      }
      const { step, ticks } = timeTicks(t0, t1, Math.max(2, Math.floor((width - box.left) / 80)));
      canvas.dataset.ticks = String(ticks.length);
      for (const t of ticks) {
        ctx.strokeStyle = "#eef0f5";
        ctx.beginPath(); ctx.moveTo(x(t), box.top); ctx.lineTo(x(t), height - box.bottom + 4); ctx.stroke();
        const label = tickLabel(t, step);
        ctx.fillText(label, x(t) - ctx.measureText(label).width / 2, height - 8);
      }
      ctx.strokeStyle = "#dde1ea";
      ctx.strokeRect(box.left, box.top, width - box.left - box.right, height - box.top - box.bottom);
      values.forEach((line, index) => {
        ctx.strokeStyle = ctx.fillStyle = COLORS[index % COLORS.length];
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        let drawing = false;
        line.forEach((v, k) => {
          if (v === null) { drawing = false; return; }
          if (drawing) ctx.lineTo(x(times[k]), y(v)); else ctx.moveTo(x(times[k]), y(v));
          drawing = true;
        });
        ctx.stroke();
        if (line.filter((v) => v !== null).length === 1) {
          const k = line.findIndex((v) => v !== null);
          ctx.fillRect(x(times[k]) - 2, y(line[k]) - 2, 4, 4);
        }
      });
      if (drag && Math.abs(drag.to - drag.from) > 2) {
        ctx.fillStyle = "rgba(47,111,222,0.15)";
        ctx.fillRect(Math.min(drag.from, drag.to), box.top, Math.abs(drag.to - drag.from), height - box.top - box.bottom);
      }
      if (hover !== null) {
        ctx.strokeStyle = "#9aa3b5";
        ctx.beginPath(); ctx.moveTo(x(times[hover]), box.top); ctx.lineTo(x(times[hover]), height - box.bottom); ctx.stroke();
      }
    }
    function nearest(px) {
      const { time } = geometry();
      const t = time(px);
      let best = 0;
      times.forEach((one, k) => { if (Math.abs(one - t) < Math.abs(times[best] - t)) best = k; });
      return best;
    }
    canvas.addEventListener("mousemove", (event) => {
      if (!times.length) return;
      const px = event.offsetX;
      if (drag) drag.to = px;
      hover = nearest(px);
      draw();
      const tip = options.tooltip;
      if (tip) {
        const lines = [new Date(times[hover] * 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC"];
        series.forEach((one, index) => {
          const v = values[index][hover];
          lines.push((series.length > 1 ? one.label + ": " : "") + (v === null ? "no data" : fmt(v) + " " + unit));
        });
        tip.textContent = lines.join("\n");
        tip.hidden = false;
        tip.style.left = event.pageX + 12 + "px";
        tip.style.top = event.pageY + 12 + "px";
      }
    });
    canvas.addEventListener("mouseleave", () => {
      hover = null; drag = null; draw();
      if (options.tooltip) options.tooltip.hidden = true;
    });
    canvas.addEventListener("mousedown", (event) => { drag = { from: event.offsetX, to: event.offsetX }; });
    canvas.addEventListener("mouseup", (event) => {
      if (!drag) return;
      const { time } = geometry();
      const from = drag.from;
      drag = null;
      const a = time(Math.min(from, event.offsetX)), b = time(Math.max(from, event.offsetX));
      // a click (under 4 px of travel) is not a zoom
      if (options.onZoom && Math.abs(event.offsetX - from) >= 4 && b - a >= 1) {
        options.onZoom(Math.max(t0, a), Math.min(t1, b));
      } else draw();
    });
    const observer = new ResizeObserver(() => draw());
    observer.observe(figure);
    draw();
    return { canvas, redraw: draw };
  }

  window.gpuwmChart = { lineChart, timeTicks, valueTicks, COLORS };
})();
