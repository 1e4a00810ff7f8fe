// trainyard dashboard: one EventSource, no polling. The server sends a snapshot on connect,
// then "trainjob", "deleted", "services", "progress", "stack" and "workers" events; the page
// re-renders what changed. The selected TrainJob is kept in the address (#trainjob=...), so a
// reload shows it again, with its progress history read back from the server.
"use strict";

const rows = new Map();
let selected = null;
let services = { services: [], consumers: [] };
// The selected TrainJob's progress reports by resourceVersion (a report delivered twice, or
// both in the history and as a live event, is one point). "source"/"sourceUid": whose reports
// they are (a manager's delegated TrainJob shows its worker copy's).
let reports = { key: null, uid: null, source: null, sourceUid: null, points: new Map() };

const $ = (sel) => document.querySelector(sel);
const esc = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => ({
  "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

function age(created) {
  if (!created) return "";
  const seconds = Math.max(0, Math.floor((Date.now() - Date.parse(created)) / 1000));
  if (seconds < 90) return `${seconds}s`;
  if (seconds < 5400) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

function progress(row) {
  if (row.progress === null || row.progress === undefined) return '<span class="muted">—</span>';
  const pct = Math.max(0, Math.min(100, Number(row.progress)));
  return `<span class="bar"><span style="width:${pct}%"></span></span> ${pct}%`;
}

function renderTrainJobs() {
  const body = $("#trainjobs tbody");
  const list = [...rows.values()].sort((a, b) => (b.created || "").localeCompare(a.created || ""));
  body.innerHTML = list.map((row) => `
    <tr data-key="${esc(row.key)}" data-name="${esc(row.name)}" class="${row.key === selected ? "selected" : ""}">
      <td>${esc(row.name)}</td><td>${esc(row.namespace)}</td><td>${esc(row.cluster)}</td>
      <td>${esc(row.runtime)}</td><td class="state ${esc(row.state)}" data-state="${esc(row.state)}">${esc(row.state)}</td>
      <td>${esc(row.nodes ?? "")}</td>
      <td>${row.active} active · ${row.succeeded} done${row.failed ? ` · ${row.failed} failed` : ""}</td>
      <td>${progress(row)}</td><td data-created="${esc(row.created)}">${age(row.created)}</td>
    </tr>`).join("");
  $("#empty").hidden = list.length > 0;
  const counts = {};
  list.forEach((row) => { counts[row.state] = (counts[row.state] || 0) + 1; });
  $("#counts").textContent = Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(" · ");
}

function renderServices() {
  $("#services tbody").innerHTML = services.services.map((s) => `
    <tr><td>${esc(s.name)}</td><td>${s.replicas}</td>
      <td class="${s.ready ? "yes" : "no"}">${s.ready ? "ready" : "not ready"}</td><td>${s.restarts}</td></tr>`).join("")
    || '<tr><td colspan="4" class="muted">not a local stack (no stack.json)</td></tr>';
  $("#consumers tbody").innerHTML = services.consumers.map((c) => `
    <tr><td>${esc(c.consumer)}</td><td>${esc(c.cluster)}</td><td>${c.pending}</td>
      <td>${c.ack_pending}</td><td>${c.redelivered}</td></tr>`).join("");
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  return value < 1 ? `+${Math.round(value * 1000)} ms` : `+${value.toFixed(1)} s`;
}

// One timeline entry: a stage (with the hop from the one before) or a note (suspended,
// resumed, ...: "detail" says more, e.g. the step training resumed from).
function timelineEntry(t) {
  const note = t.detail !== undefined;
  return `<li data-stage="${esc(t.stage)}" class="${note ? "note" : ""}"><span>${esc(t.stage)}${
    t.detail ? `<span class="detail">${esc(t.detail)}</span>` : ""}</span>
    <span class="hop">${new Date(t.at * 1000).toLocaleTimeString()} ${seconds(t.hop_s)}</span></li>`;
}

function apiPath(key) {
  return key.split("/").map(encodeURIComponent).join("/");
}

function renderProgress() {
  const points = [...reports.points.values()].sort((a, b) => a.at - b.at);
  $("#progress-empty").hidden = points.length > 0;
  $("#chart-trainjob").hidden = points.length === 0;
  $("#progress-count").textContent = points.length ? `${points.length} reports` : "";
  if (points.length) Charts.trainjob($("#chart-trainjob"), points);
}

async function loadProgress(row) {
  const copy = row.worker ? rows.get(`${row.worker}/${row.namespace}/${row.name}`) : null;
  reports = { key: row.key, uid: row.uid, source: (copy || row).key, sourceUid: (copy || row).uid, points: new Map() };
  renderProgress();
  try {
    const answer = await fetch(`/api/trainjobs/${apiPath(row.key)}/progress`);
    if (!answer.ok || reports.key !== row.key) return;
    const stored = await answer.json();
    if (stored.uid !== reports.uid) return;
    reports.source = stored.source; reports.sourceUid = stored.source_uid;
    stored.points.forEach((point) => reports.points.set(point.rv, point));
    renderProgress();
  } catch (err) {
    // shown again on the next selection or reload
  }
}

function select(key) {
  selected = key;
  history.replaceState(null, "", key ? `#trainjob=${encodeURIComponent(key)}` : "#");
  renderTrainJobs();
  renderDetail();
}

async function renderDetail() {
  const row = rows.get(selected);
  if (!row) { $("#detail").hidden = true; return; }
  $("#detail").hidden = false;
  $("#detail-name").textContent = `${row.namespace}/${row.name}`;
  $("#detail-state").textContent = row.state;
  $("#detail-state").className = `state ${row.state}`;
  $("#timeline").innerHTML = (row.timeline || []).map(timelineEntry).join("");
  if (reports.key !== row.key || reports.uid !== row.uid) loadProgress(row);
  try {
    const answer = await fetch(`/api/trainjobs/${apiPath(row.key)}`);
    if (!answer.ok || selected !== row.key) return;
    const detail = await answer.json();
    $("#pods").innerHTML = detail.pods.map((pod) => `
      <div class="pod"><strong>${esc(pod.name)}</strong> <span class="muted">${esc(pod.phase)}</span>
        <pre>${esc(pod.log.join("\n")) || '<span class="muted">no output yet</span>'}</pre></div>`).join("")
      || '<p class="muted">no pods yet</p>';
  } catch (err) {
    // the next event retries
  }
}

function renderStack(stack) {
  Charts.throughput($("#chart-throughput"), stack);
  Charts.latency($("#chart-latency"), stack);
}

const shortNumber = (value) => Number(value.toFixed(value >= 10 ? 1 : 2));

function capacityText(capacity) {
  if (!capacity) return '<span class="muted">unknown</span>';
  const unit = { cpu: " cores", memory: " GiB" };
  return Object.entries(capacity).map(([name, c]) =>
    `<span class="capacity" data-resource="${esc(name)}">${esc(name)} ${shortNumber(c.used)} / ${shortNumber(c.total)}${
      unit[name] || ""}</span>`).join("");
}

function renderWorkers(workers) {
  $("#workers").hidden = workers.length === 0;
  if (!workers.length) return;
  $("#worker-table tbody").innerHTML = workers.map((w) => `
    <tr data-worker="${esc(w.name)}"><td>${esc(w.name)}</td>
      <td class="${w.active ? "yes" : "no"}" title="${esc(w.message)}">${w.active ? "Active" : esc(w.reason || "inactive")}</td>
      <td>${capacityText(w.capacity)}</td>
      <td class="worker-trainjobs">${w.total_trainjobs}${w.total_trainjobs ? ` <span class="muted">(${
        Object.entries(w.trainjobs).map(([s, n]) => `${n} ${esc(s)}`).join(", ")})</span>` : ""}</td></tr>`).join("");
  Charts.workers($("#chart-workers"), workers);
}

function connect() {
  const source = new EventSource("/api/events");
  source.onopen = () => { $("#connection").textContent = "live"; $("#connection").className = "badge on"; };
  source.onerror = () => { $("#connection").textContent = "reconnecting"; $("#connection").className = "badge off"; };
  source.addEventListener("snapshot", (event) => {
    const data = JSON.parse(event.data);
    rows.clear();
    data.trainjobs.forEach((row) => rows.set(row.key, row));
    services = { services: data.services, consumers: data.consumers };
    $("#clusters").textContent = `clusters: ${data.clusters.join(", ")}`;
    if (!selected) {
      const wanted = decodeURIComponent((location.hash.match(/^#trainjob=(.+)$/) || [])[1] || "");
      if (rows.has(wanted)) selected = wanted;
    }
    // The tables first: the charts may wait for their library (charts.js), the rows never do.
    renderTrainJobs(); renderServices(); renderWorkers(data.workers); if (selected) renderDetail();
    renderStack(data.stack);
  });
  source.addEventListener("progress", (event) => {
    const data = JSON.parse(event.data);
    if (data.key !== reports.source || data.uid !== reports.sourceUid) return;
    reports.points.set(data.point.rv, data.point);
    renderProgress();
  });
  source.addEventListener("stack", (event) => renderStack(JSON.parse(event.data)));
  source.addEventListener("workers", (event) => renderWorkers(JSON.parse(event.data)));
  source.addEventListener("trainjob", (event) => {
    const row = JSON.parse(event.data);
    rows.set(row.key, row);
    renderTrainJobs();
    if (row.key === selected) renderDetail();
  });
  source.addEventListener("deleted", (event) => {
    rows.delete(JSON.parse(event.data).key);
    renderTrainJobs();
    if (!rows.has(selected)) renderDetail();
  });
  source.addEventListener("services", (event) => { services = JSON.parse(event.data); renderServices(); });
}

$("#trainjobs tbody").addEventListener("click", (event) => {
  const tr = event.target.closest("tr");
  if (!tr) return;
  select(tr.dataset.key);
});
setInterval(() => document.querySelectorAll("[data-created]").forEach((cell) => {
  cell.textContent = age(cell.dataset.created);
}), 1000);
connect();
