// trainyard dashboard charts, drawn with plotly.js (served from the installed plotly wheel).
// Each function takes the data as the server sends it and redraws its chart with
// Plotly.react, which only updates what changed.
//
// plotly.js is 4.8 MB: the page does not load it up front (the tables would wait for it to be
// fetched and run). The first chart drawn fetches it without blocking; until it has run, each
// chart keeps only its latest data, drawn once the library is there. Nothing here throws
// while it is missing.
"use strict";

const Charts = (() => {
  const COLORS = ["#58a6ff", "#3fb950", "#d29922", "#f85149", "#bc8cff", "#39c5cf", "#ff7b72"];
  const CONFIG = { displayModeBar: false, responsive: true };
  const LIBRARY = "/vendor/plotly.min.js";
  const RETRY_MS = 10000;  // after a failed fetch: not one request per event

  let library = "absent";  // "loading", "ready" (every waiting chart drawn), "failed"
  let failedAt = 0;
  const waiting = new Map();  // element -> [traces, layout]: its latest data, not yet drawn

  function fetchLibrary() {
    library = "loading";
    const script = document.createElement("script");
    script.src = LIBRARY;
    script.async = true;
    script.onload = () => {
      if (typeof Plotly === "undefined") { script.onerror(); return; }
      library = "ready";
      waiting.forEach(([traces, chartLayout], element) => Plotly.react(element, traces, chartLayout, CONFIG));
      waiting.clear();
    };
    script.onerror = () => {
      library = "failed";
      failedAt = Date.now();
      script.remove();
      console.warn(`charts not drawn: ${LIBRARY} did not load (tried again on a later update)`);
    };
    document.head.appendChild(script);
  }

  function draw(element, traces, chartLayout) {
    if (library === "ready") {
      Plotly.react(element, traces, chartLayout, CONFIG);
      return;
    }
    waiting.set(element, [traces, chartLayout]);
    if (library === "absent" || (library === "failed" && Date.now() - failedAt >= RETRY_MS)) fetchLibrary();
  }

  // True once plotly.js has run and every chart drawn so far is on the page.
  const drawn = () => library === "ready";

  function layout(extra) {
    return Object.assign({
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: "#d7dde4", size: 11 }, margin: { l: 48, r: 48, t: 8, b: 32 },
      showlegend: true, legend: { orientation: "h", y: -0.18 },
      xaxis: { type: "date", gridcolor: "#26303b", zeroline: false },
      yaxis: { gridcolor: "#26303b", zeroline: false, rangemode: "tozero" },
    }, extra);
  }

  const when = (seconds) => new Date(seconds * 1000);

  // One TrainJob: a line per reported metric (left axis) and the progress in % (right axis).
  // points: [{rv, at, progress, eta, metrics: {name: number|null}}], oldest first.
  function trainjob(element, points) {
    const names = [];
    points.forEach((p) => Object.keys(p.metrics || {}).forEach((n) => { if (!names.includes(n)) names.push(n); }));
    const traces = names.map((name, i) => {
      const shown = points.filter((p) => p.metrics && p.metrics[name] !== null && p.metrics[name] !== undefined);
      return { name, type: "scatter", mode: "lines+markers", x: shown.map((p) => when(p.at)),
               y: shown.map((p) => p.metrics[name]), line: { color: COLORS[i % COLORS.length] },
               marker: { size: 6 } };
    });
    const progressed = points.filter((p) => p.progress !== null && p.progress !== undefined);
    traces.push({ name: "progress %", type: "scatter", mode: "lines+markers", yaxis: "y2",
                  x: progressed.map((p) => when(p.at)), y: progressed.map((p) => p.progress),
                  line: { color: "#7d8a97", dash: "dot" }, marker: { size: 4 } });
    draw(element, traces, layout({
      yaxis2: { overlaying: "y", side: "right", range: [0, 105], tickvals: [0, 25, 50, 75, 100], showgrid: false,
                ticksuffix: "%" },
    }));
  }

  // The stack: created/finished per second (buckets) and create → running latency (points).
  function throughput(element, stack) {
    const x = stack.t.map(when);
    draw(element, [
      { name: "created/s", type: "scatter", mode: "lines", x, y: stack.created_per_s, line: { color: COLORS[0], shape: "hv" } },
      { name: "finished/s", type: "scatter", mode: "lines", x, y: stack.finished_per_s, line: { color: COLORS[1], shape: "hv" } },
    ], layout({}));
  }

  function latency(element, stack) {
    draw(element, [
      { name: "create → running", type: "scatter", mode: "markers", x: stack.latency.at.map(when),
        y: stack.latency.seconds, marker: { color: COLORS[2], size: 7 } },
    ], layout({ xaxis: { type: "date", gridcolor: "#26303b", range: [when(stack.t[0] - stack.bucket_s), when(stack.t[stack.t.length - 1])] },
                yaxis: { gridcolor: "#26303b", rangemode: "tozero", ticksuffix: " s" } }));
  }

  // Workers: CPU used and free per worker, stacked.
  function workers(element, list) {
    const shown = list.filter((w) => w.capacity && w.capacity.cpu);
    const names = shown.map((w) => w.name);
    draw(element, [
      { name: "used", type: "bar", x: names, y: shown.map((w) => w.capacity.cpu.used), marker: { color: COLORS[0] } },
      { name: "free", type: "bar", x: names, y: shown.map((w) => w.capacity.cpu.free), marker: { color: "#3d4a58" } },
    ], layout({ barmode: "stack", xaxis: { type: "category" } }));
  }

  return { trainjob, throughput, latency, workers, drawn };
})();
