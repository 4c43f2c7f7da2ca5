// The live page: fed by server-sent events (/api/events), charts drawn by Plotly.
"use strict";

const state = { stages: [], history: [], frame: null, last: {}, comparison: null };
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"];
const LAYOUT = { margin: { l: 50, r: 10, t: 30, b: 35 }, legend: { orientation: "h", y: -0.2 }, font: { size: 11 } };
const CONFIG = { displayModeBar: false, responsive: true };

function colour(key) {
  let h = 0;
  for (const c of String(key)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function jobLink(jobId) {
  const a = el("a", { class: "job", "data-job": jobId, text: jobId, href: "#explain" });
  a.addEventListener("click", ev => { ev.preventDefault(); explain(jobId); });
  return a;
}

// A job row's links: its explain (in the panel) and its driver log (the server's /api/logs route, a new tab).
function jobLinks(jobId) {
  const ex = el("a", { class: "explain-link", "data-job": jobId, text: "explain", href: "#explain" });
  ex.addEventListener("click", ev => { ev.preventDefault(); explain(jobId); });
  const logs = el("a", { class: "logs-link", "data-job": jobId, text: "logs", target: "_blank", rel: "noopener",
    href: "/api/logs/" + encodeURIComponent(jobId) });
  return el("span", { class: "links" }, ex, " · ", logs);
}

// ---- pipeline -------------------------------------------------------------------------------------
function drawPipeline(pipeline) {
  const root = document.getElementById("pipeline");
  if (!root.children.length) {
    for (const [key, label] of state.stages) {
      root.append(el("div", { class: "stage", id: "stage-" + key, "data-stage": key },
        el("div", { class: "label", text: label }), el("div", { class: "now", text: "0" }),
        el("div", { class: "total", text: "" })));
    }
  }
  for (const [key] of state.stages) {
    const s = pipeline[key] || { now: 0, total: null };
    const box = document.getElementById("stage-" + key);
    const now = box.querySelector(".now");
    box.classList.toggle("changed", now.textContent !== String(s.now));
    now.textContent = String(s.now);
    box.querySelector(".total").textContent = s.total === null || s.total === undefined ? "" : "(" + s.total + ")";
  }
}

// ---- decisions and jobs ----------------------------------------------------------------------------
function when(at) {
  return new Date(at * 1000).toLocaleTimeString();
}

function drawDecisions(decisions) {
  const body = document.querySelector("#decisions tbody");
  body.replaceChildren(...decisions.map(d => el("tr", {}, el("td", { text: when(d.at) }),
    el("td", {}, jobLink(d.job_id)), el("td", { text: d.state }), el("td", { text: d.reason }))));
}

function drawJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren(...jobs.map(j => el("tr", {}, el("td", {}, jobLink(j.job_id)), el("td", { text: j.state }),
    el("td", { text: j.gpu }), el("td", { text: j.priority_class }), el("td", { text: String(j.attempt) }),
    el("td", {}, jobLinks(j.job_id)))));
}

async function explain(jobId) {
  document.getElementById("explain-job").textContent = jobId;
  const box = document.getElementById("explain");
  box.textContent = "asking the head…";
  const r = await fetch("/api/explain/" + encodeURIComponent(jobId));
  const body = await r.json();
  if (!r.ok) { box.textContent = body.message || JSON.stringify(body); return; }
  const lines = [body.summary || "", ""];
  if (body.placement) lines.push("placement: " + JSON.stringify(body.placement, null, 1));
  if (body.pending) lines.push("pending: " + JSON.stringify(body.pending, null, 1));
  for (const p of body.preemptions || []) lines.push("preempted by " + p.by + ": " + p.reason);
  lines.push("", JSON.stringify(body, null, 1));
  box.textContent = lines.join("\n");
  box.setAttribute("data-job", jobId);
}

// ---- cluster map -----------------------------------------------------------------------------------
function drawCluster(nodes) {
  const root = document.getElementById("cluster");
  root.replaceChildren(...nodes.map(n => el("div", { class: "node", "data-node": n.name },
    el("div", { class: "title", text: n.name + " · " + (n.model || "") + " · " + n.state }),
    el("div", { class: "gpus" }, ...n.gpus.map(g => drawGpu(n, g))))));
}

function drawGpu(node, g) {
  const box = el("div", { class: "gpu" + (g.healthy ? "" : " unhealthy"), "data-gpu": node.name + "/" + g.index },
    el("div", { class: "gname", text: "GPU " + g.index + (g.mig_enabled ? " MIG" : "") }));
  const parts = g.mig_enabled
    ? g.mig.map(m => ({ text: m.profile + (m.holder ? " " + m.holder : ""), holder: m.holder, weight: 1 }))
    : g.shares.map(s => ({ text: (s.kind === "whole" ? "" : s.kind + " ") + s.holder, holder: s.holder,
      weight: Math.max(0.15, s.share || 0) }));
  let used = 0;
  for (const p of parts) {
    const d = el("div", { class: "share" + (p.holder ? "" : " free"), title: p.text, text: p.text });
    if (p.holder) d.style.background = colour(p.holder);
    d.style.flex = String(p.weight);
    box.append(d);
    used += p.weight;
  }
  if (!g.mig_enabled && used < 1) {
    const free = el("div", { class: "share free", text: "free" });
    free.style.flex = String(1 - used);
    box.append(free);
  }
  return box;
}

// ---- curves ----------------------------------------------------------------------------------------
function series(key) {
  return { x: state.history.map(p => p.t), y: state.history.map(p => p[key] ?? null) };
}

function drawCharts() {
  const line = (key, name) => ({ ...series(key), name, mode: "lines+markers", type: "scatter", marker: { size: 3 } });
  Plotly.react("chart-throughput", [line("grants_per_s", "leases granted / s"), line("inference_rps", "inference requests / s")],
    { ...LAYOUT, title: { text: "Throughput" }, xaxis: { title: { text: "s since the head started" } } }, CONFIG);
  Plotly.react("chart-latency", [line("wait_p50_s", "time pending p50"), line("wait_p99_s", "time pending p99"),
    line("inference_p50_s", "inference p50"), line("inference_p99_s", "inference p99")],
    { ...LAYOUT, title: { text: "Latency (s, log scale)" }, xaxis: { title: { text: "s since the head started" } }, yaxis: { type: "log" } },
    CONFIG);
  const nodes = [...new Set(state.history.flatMap(p => Object.keys(p.util || {})))].sort();
  Plotly.react("chart-util", nodes.map(n => ({ x: state.history.map(p => p.t), y: state.history.map(p => (p.util || {})[n] ?? null),
    name: n, mode: "lines", type: "scatter" })),
  { ...LAYOUT, title: { text: "GPU utilisation per node" }, yaxis: { range: [0, 1.05], tickformat: ".0%" } }, CONFIG);
  Plotly.react("chart-queue", [line("queue", "pending leases")], { ...LAYOUT, title: { text: "Queue depth" } }, CONFIG);
  Plotly.react("chart-preemptions", [{ ...line("preemptions", "preemptions"), line: { shape: "hv" } }],
    { ...LAYOUT, title: { text: "Preemptions (cumulative)" } }, CONFIG);
}

function drawComparison(c) {
  state.comparison = c;
  const note = document.getElementById("comparison-note");
  const chart = document.getElementById("chart-comparison");
  if (!c || !c.ready) {
    note.textContent = c && c.error ? "comparison unavailable: " + c.error : "computing (an openb replay per scheme)…";
    chart.style.display = "none";
    return;
  }
  chart.style.display = "";
  document.getElementById("comparison-source").textContent = c.source || "";
  note.textContent = (c.notes || []).join(" ");
  const schemes = c.schemes || [];
  const bar = (key, name) => ({ x: schemes.map(s => s.label), y: schemes.map(s => s[key]), name, type: "bar" });
  Plotly.react("chart-comparison", [bar("served_pct", "GPU demand served (% of capacity)"),
    bar("occupied_pct", "GPU capacity occupied (%)"), bar("placed_pct", "pods placed (%)")],
  { ...LAYOUT, barmode: "group", title: { text: c.title || "Sharing schemes" }, yaxis: { title: { text: "%" } } }, CONFIG);
}

// Charts redraw at most once a second: on a busy machine a redraw per frame starves the page.
let chartsPending = false;
function scheduleCharts() {
  if (chartsPending) return;
  chartsPending = true;
  setTimeout(() => { chartsPending = false; drawCharts(); }, 1000);
}

// ---- the stream ------------------------------------------------------------------------------------
function apply(frame) {
  if (!frame) return;
  state.frame = frame;
  drawPipeline(frame.pipeline);
  drawDecisions(frame.decisions);
  drawJobs(frame.jobs);
  drawCluster(frame.cluster);
  document.getElementById("head").textContent = "policy " + (frame.head.policy || "?") + " · frame " + frame.version;
  document.body.setAttribute("data-version", String(frame.version));
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("/api/events");
  es.addEventListener("init", ev => {
    const d = JSON.parse(ev.data);
    state.stages = d.stages;
    state.history = d.history;
    apply(d.frame);
    drawCharts();
    drawComparison(d.comparison);
    conn.textContent = "live";
    conn.className = "conn live";
  });
  es.addEventListener("frame", ev => {
    const frame = JSON.parse(ev.data);
    if (frame.restarted) state.history = [];  // a new head: its history starts again
    for (const p of frame.points || []) {
      const last = state.history.length ? state.history[state.history.length - 1].t : -1;
      if (p.t > last) state.history.push(p);
    }
    apply(frame);
    scheduleCharts();
  });
  es.addEventListener("comparison", ev => drawComparison(JSON.parse(ev.data)));
  es.onerror = () => { conn.textContent = "reconnecting"; conn.className = "conn down"; };
}

connect();
