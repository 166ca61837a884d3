"use strict";
// The VIZ page: a list of realizes -> kernels -> stages, a graph of any rewrite step, a kernel's source and UOps,
// the profile timeline and a roofline of the kernels against the host's measured peaks. Data comes from the server's /api endpoints; d3 draws, dagre lays graphs out.

const state = { index: null, rewrite: null, step: 0, kernel: null, trace: null, peaks: null, timelineDrawn: false };

async function api(path) {
  const res = await fetch("/api/" + path);
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function setStatus(text) { document.getElementById("status").textContent = text; }

function show(view) {
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.view === view);
  for (const v of document.querySelectorAll(".view")) v.classList.toggle("active", v.id === "view-" + view);
  if (view === "timeline") drawTimeline();
  if (view === "roofline") drawRoofline();
}

// ---------------------------------------------------------------- the list
function item(text, onclick, id) {
  const div = document.createElement("div");
  div.className = "item";
  div.textContent = text;
  div.id = id;
  div.onclick = onclick;
  return div;
}

function stageItems(parent, stages) {
  for (const s of stages) {
    parent.appendChild(item(`${s.name} (${s.steps})`, () => openRewrite(s.id, 0), "stage-" + s.id));
  }
}

function buildList(index) {
  const list = document.getElementById("list");
  list.textContent = "";
  for (const r of index.realizes) {
    if (!r.kernels.length && !r.rewrites.length) continue;
    const d = document.createElement("details");
    d.open = true;
    d.innerHTML = `<summary>realize ${r.id} (${r.kernels.length} kernels)</summary>`;
    stageItems(d, r.rewrites);
    for (const k of r.kernels) {
      const kd = document.createElement("details");
      kd.innerHTML = `<summary></summary>`;
      kd.firstChild.textContent = `${k.name} ${k.device}`;
      kd.appendChild(item("source and UOps", () => openKernel(k.id), "kernel-" + k.id));
      kd.addEventListener("toggle", async () => {
        if (!kd.open || kd.dataset.loaded) return;
        kd.dataset.loaded = "1";
        stageItems(kd, (await api("kernel/" + k.id)).stages);
      });
      d.appendChild(kd);
    }
    list.appendChild(d);
  }
  if (index.loose.length) {
    const d = document.createElement("details");
    d.innerHTML = `<summary>outside realizes</summary>`;
    stageItems(d, index.loose);
    list.appendChild(d);
  }
  const note = document.createElement("p");
  note.textContent = `${index.unchanged} rewrites changed nothing (not listed)`;
  list.appendChild(note);
}

function select(id) {
  for (const e of document.querySelectorAll("aside .item.selected")) e.classList.remove("selected");
  const e = document.getElementById(id);
  if (e) e.classList.add("selected");
}

// ---------------------------------------------------------------- graphs
const palette = {};
function colour(op) {
  if (!(op in palette)) {
    const fixed = { CONST: "#e9ecef", DEFINE_GLOBAL: "#ffd8a8", LOAD: "#a5d8ff", STORE: "#ffc9c9", RANGE: "#d0bfff",
      ENDRANGE: "#d0bfff", SINK: "#ced4da", REDUCE: "#b2f2bb", REDUCE_AXIS: "#b2f2bb", INDEX: "#99e9f2" };
    const n = Object.keys(palette).length;
    palette[op] = fixed[op] || d3.interpolateRainbow((n * 0.618) % 1).replace("rgb", "rgba").replace(")", ", 0.35)");
  }
  return palette[op];
}

async function openRewrite(id, step) {
  show("graph");
  select("stage-" + id);
  state.rewrite = await api("rewrite/" + id);
  await openStep(step);
}

async function openStep(k) {
  const rw = state.rewrite;
  if (!rw) return;
  k = Math.max(0, Math.min(k, rw.steps.length));
  const g = await api(`rewrite/${rw.id}/step/${k}`);
  state.step = k;
  const slider = document.getElementById("step-slider");
  slider.max = rw.steps.length;
  slider.value = k;
  document.getElementById("step-label").textContent =
    `${rw.name} — step ${k} of ${rw.steps.length} — ${g.nodes.length} nodes${g.truncated ? " (truncated)" : ""}`;
  const rule = document.getElementById("rule");
  rule.textContent = g.change
    ? `rule ${g.change.rule.loc}: ${g.change.rule.code}\n${nodeLine(g, g.change.matched)}  ->  ${nodeLine(g, g.change.replacement)}`
    : `${rw.loc}: the input graph (${rw.steps.length} steps follow)`;
  const byId = new Map(g.nodes.map((n) => [n.id, n]));
  document.getElementById("diff").textContent = k
    ? `added ${g.added.length}: ${g.added.map((i) => (byId.get(i) || { op: "?" }).op + "#" + i).join(" ")}\n` +
      `removed ${g.removed.length}: ${g.removed.map((i) => "#" + i).join(" ")}`
    : "(the input)";
  location.hash = `rewrite/${rw.id}/${k}`;
  drawGraph(g);
}

function nodeLine(g, id) {
  const n = g.nodes.find((x) => x.id === id);
  return n ? `#${id} ${n.op} ${n.dtype} ${n.arg}` : `#${id}`;
}

function drawGraph(g) {
  const svg = d3.select("#graph");
  svg.selectAll("*").remove();
  const layout = new dagre.graphlib.Graph();
  layout.setGraph({ rankdir: "BT", nodesep: 12, ranksep: 28 });
  layout.setDefaultEdgeLabel(() => ({}));
  for (const n of g.nodes) {
    const label = n.op + (n.arg ? " " + n.arg.slice(0, 24) : "");
    layout.setNode(String(n.id), { label, width: Math.max(40, label.length * 6.8 + 10), height: 22, node: n });
  }
  for (const [s, d] of g.edges) layout.setEdge(String(s), String(d));
  dagre.layout(layout);
  const root = svg.append("g");
  const zoom = d3.zoom().scaleExtent([0.02, 4]).on("zoom", (e) => root.attr("transform", e.transform));
  svg.call(zoom);
  const added = new Set(g.added);
  const line = d3.line().x((p) => p.x).y((p) => p.y).curve(d3.curveBasis);
  root.append("g").selectAll("path").data(layout.edges()).join("path")
    .attr("class", (e) => "edge" + (added.has(+e.w) ? " added" : ""))
    .attr("d", (e) => line(layout.edge(e).points));
  const nodes = root.append("g").selectAll("g").data(layout.nodes().map((v) => layout.node(v))).join("g")
    .attr("class", (d) => "node" + (added.has(d.node.id) ? " added" : "") +
      (g.change && d.node.id === g.change.replacement ? " replacement" : ""))
    .attr("data-id", (d) => d.node.id)
    .attr("transform", (d) => `translate(${d.x - d.width / 2},${d.y - d.height / 2})`)
    .on("click", (e, d) => {
      nodes.classed("clicked", (x) => x === d);
      const n = d.node;
      document.getElementById("node-info").textContent =
        `#${n.id} ${n.op}\ndtype: ${n.dtype}\nshape: ${n.shape || "(none)"}\narg: ${n.arg || "(none)"}\n` +
        `sources: ${n.src.map((s) => "#" + s).join(" ") || "(none)"}`;
    });
  nodes.append("rect").attr("width", (d) => d.width).attr("height", (d) => d.height)
    .attr("fill", (d) => colour(d.node.op));
  nodes.append("text").attr("x", 5).attr("y", 15).text((d) => d.label);
  // fit the whole graph into the view
  const box = svg.node().getBoundingClientRect();
  const gw = layout.graph().width || 1, gh = layout.graph().height || 1;
  const scale = Math.min(box.width / gw, box.height / gh, 1) * 0.95;
  svg.call(zoom.transform, d3.zoomIdentity.translate((box.width - gw * scale) / 2, 10).scale(scale));
}

// ---------------------------------------------------------------- kernels
const C_KEYWORDS = /^(if|else|for|while|return|static|inline|const|void|struct|typedef|unsigned|signed|sizeof|__attribute__|restrict|break|continue|switch|case|default|__global|__kernel|extern)$/;
const C_TYPES = /^(float|double|int|long|short|char|bool|half|size_t|u?int(8|16|32|64)_t|float\d+|int\d+)$/;

function highlight(src) {
  const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const token = /(\/\*[\s\S]*?\*\/|\/\/[^\n]*)|(^[ \t]*#[^\n]*)|("(?:[^"\\\n]|\\.)*")|(\b\d[\w.]*\b)|([A-Za-z_]\w*)/gm;
  let out = "", last = 0, m;
  while ((m = token.exec(src)) !== null) {
    out += esc(src.slice(last, m.index));
    const t = esc(m[0]);
    if (m[1]) out += `<span class="com">${t}</span>`;
    else if (m[2]) out += `<span class="pp">${t}</span>`;
    else if (m[3]) out += `<span class="str">${t}</span>`;
    else if (m[4]) out += `<span class="num">${t}</span>`;
    else if (C_KEYWORDS.test(m[5])) out += `<span class="kw">${t}</span>`;
    else if (C_TYPES.test(m[5])) out += `<span class="ty">${t}</span>`;
    else out += t;
    last = token.lastIndex;
  }
  return out + esc(src.slice(last));
}

async function openKernel(id) {
  show("kernel");
  select("kernel-" + id);
  const k = (state.kernel = await api("kernel/" + id));
  document.getElementById("kernel-title").textContent = `${k.name} on ${k.device}`;
  const launches = (state.trace || { traceEvents: [] }).traceEvents.filter((e) => e.ph === "X" && e.cat === "kernel" && e.name === k.name);
  const perf = launches.length
    ? ` — ${launches.length} launches, best ${d3.max(launches, (e) => e.args.GFLOPS)} GFLOPS, ${d3.max(launches, (e) => e.args["GB/s"])} GB/s`
    : "";
  document.getElementById("kernel-meta").textContent =
    `opts: ${k.opts.join(", ") || "(none)"} — ${k.ops} ops, outer loop ${k.outer_size}${perf}`;
  document.getElementById("source").innerHTML = highlight(k.source);
  const lin = k.lin.map(([i, op, dtype, src, arg]) =>
    `${String(i).padStart(4)} <span class="op">${op.padEnd(14)}</span> ${dtype.padEnd(16)} [${src.join(", ")}] ${arg.replace(/&/g, "&amp;").replace(/</g, "&lt;")}`);
  document.getElementById("lin").innerHTML = lin.join("\n");
  document.getElementById("asm").textContent = k.asm || "";
  document.getElementById("asm-pane").style.display = k.asm ? "" : "none";  // devices without host machine code
  location.hash = `kernel/${id}`;
}

// ---------------------------------------------------------------- the timeline
function drawTimeline() {
  if (state.timelineDrawn || !state.trace) return;
  state.timelineDrawn = true;
  const events = state.trace.traceEvents;
  const names = {};
  for (const e of events) if (e.ph === "M" && (e.name === "process_name" || e.name === "thread_name")) names[e.name + e.pid + "/" + e.tid] = e.args.name;
  const slices = events.filter((e) => e.ph === "X");
  const counters = events.filter((e) => e.ph === "C");
  // one row per (pid, tid) and nesting depth
  const tracks = new Map();
  for (const s of slices.slice().sort((a, b) => a.ts - b.ts || b.dur - a.dur)) {
    const key = s.pid + "/" + s.tid;
    if (!tracks.has(key)) tracks.set(key, { key, pid: s.pid, ends: [], depth: 0 });
    const t = tracks.get(key);
    let d = 0;
    while (d < t.ends.length && t.ends[d] > s.ts + 1e-6) d++;
    t.ends.length = d;
    t.ends.push(s.ts + s.dur);
    s._depth = d;
    s._track = t;
    t.depth = Math.max(t.depth, d + 1);
  }
  const rowH = 18;
  let y = 10;
  const trackList = [...tracks.values()].sort((a, b) => a.pid - b.pid);
  for (const t of trackList) { t.y = y; y += t.depth * rowH + 14; }
  const memY = y + 10, memH = 60;
  const svg = d3.select("#timeline");
  svg.selectAll("*").remove();
  const width = svg.node().getBoundingClientRect().width || 1000;
  const left = 110;
  const t0 = d3.min(events, (e) => e.ts) || 0, t1 = d3.max(slices, (e) => e.ts + e.dur) || 1;
  const x0 = d3.scaleLinear().domain([t0, t1]).range([left, width - 10]);
  let x = x0;
  svg.attr("height", memY + memH + 30);
  const labels = svg.append("g");
  for (const t of trackList) {
    const [pid, tid] = t.key.split("/");
    labels.append("text").attr("class", "track").attr("x", 4).attr("y", t.y + 12)
      .text(`${names["process_name" + pid + "/0"] || pid} ${names["thread_name" + pid + "/" + tid] || tid}`);
  }
  labels.append("text").attr("class", "track").attr("x", 4).attr("y", memY + 12).text("memory in use");
  const body = svg.append("g");
  const cat = d3.scaleOrdinal(d3.schemeTableau10);
  const rects = body.selectAll("rect").data(slices).join("rect").attr("class", "slice").attr("data-cat", (s) => s.cat)
    .attr("y", (s) => s._track.y + s._depth * rowH).attr("height", rowH - 2)
    .attr("fill", (s) => cat(s.cat))
    .on("click", (e, s) => {
      rects.classed("selected", (r) => r === s);
      let text = `${s.name} [${s.cat}] ${s.dur.toFixed(1)} us at ${s.ts.toFixed(1)} us\n${JSON.stringify(s.args)}`;
      if (s.cat === "kernel") {
        const comp = slices.find((c) => c.cat === "compile" && c.args.kernel === s.name);
        text += comp ? `\ncompiled: ${comp.dur.toFixed(0)} us, cache ${comp.args.cache} (${comp.args.compiler})` : "\ncompiled before recording began";
      }
      const info = document.getElementById("slice-info");
      info.textContent = text;
      const kernel = s.cat === "kernel" && kernelByName(s.name);
      if (kernel) {
        const link = document.createElement("button");
        link.id = "open-kernel";
        link.textContent = `open ${s.name}'s source and stages`;
        link.onclick = () => openKernel(kernel.id);
        info.append("\n", link);
      }
    });
  const memPath = body.append("path").attr("class", "memory");
  const memMax = d3.max(counters, (c) => c.args.bytes) || 1;
  const ym = d3.scaleLinear().domain([0, memMax]).range([memY + memH, memY]);
  function redraw() {
    rects.attr("x", (s) => x(s.ts)).attr("width", (s) => Math.max(0.5, x(s.ts + s.dur) - x(s.ts)));
    memPath.attr("d", d3.area().curve(d3.curveStepAfter).x((c) => x(c.ts)).y0(memY + memH).y1((c) => ym(c.args.bytes))(counters));
  }
  redraw();
  svg.call(d3.zoom().scaleExtent([1, 1e6]).on("zoom", (e) => { x = e.transform.rescaleX(x0); redraw(); }));
}

// ---------------------------------------------------------------- the roofline
// each kernel's best launch as a point: x its arithmetic intensity (FLOP per byte moved), y its GFLOPS; the roof is
// min(peak GFLOPS, intensity x peak GB/s), both measured on this machine when the recording was saved
function kernelPoints() {
  const best = new Map();
  for (const e of state.trace.traceEvents) {
    if (e.ph !== "X" || e.cat !== "kernel" || !(e.args.GFLOPS > 0) || !(e.args["GB/s"] > 0)) continue;
    const p = best.get(e.name);
    if (!p || e.args.GFLOPS > p.gflops) best.set(e.name, { name: e.name, gflops: e.args.GFLOPS, gbs: e.args["GB/s"] });
  }
  return [...best.values()].map((p) => ({ ...p, intensity: p.gflops / p.gbs }));
}

function drawRoofline() {
  const svg = d3.select("#roofline");
  svg.selectAll("*").remove();
  const peaks = state.peaks || {};
  const points = kernelPoints();
  const meta = document.getElementById("roofline-meta");
  if (!(peaks.GFLOPS > 0) || !(peaks["GB/s"] > 0)) {
    meta.textContent = "no measured peaks in this recording (saved by an older version)";
    return;
  }
  meta.textContent = `roof: ${peaks.GFLOPS} GFLOPS, ${peaks["GB/s"]} GB/s (${peaks.how}); ${points.length} kernels with launches`;
  const width = svg.node().getBoundingClientRect().width || 900, height = 480, m = { l: 60, r: 20, t: 10, b: 40 };
  svg.attr("height", height);
  const ridge = peaks.GFLOPS / peaks["GB/s"];
  const xs = points.map((p) => p.intensity).concat([ridge]);
  const x = d3.scaleLog().domain([d3.min(xs) / 4, d3.max(xs) * 4]).range([m.l, width - m.r]);
  const ys = points.map((p) => p.gflops).concat([peaks.GFLOPS]);
  const y = d3.scaleLog().domain([Math.min(d3.min(ys), x.domain()[0] * peaks["GB/s"]) / 2, peaks.GFLOPS * 2]).range([height - m.b, m.t]);
  svg.append("g").attr("transform", `translate(0,${height - m.b})`).call(d3.axisBottom(x).ticks(6, "~g"));
  svg.append("g").attr("transform", `translate(${m.l},0)`).call(d3.axisLeft(y).ticks(6, "~g"));
  svg.append("text").attr("class", "track").attr("x", width / 2).attr("y", height - 6).text("FLOP per byte");
  svg.append("text").attr("class", "track").attr("x", m.l + 8).attr("y", m.t + 12).text("GFLOPS");
  const [lo, hi] = x.domain();
  const roof = [[lo, lo * peaks["GB/s"]], [ridge, peaks.GFLOPS], [hi, peaks.GFLOPS]];
  svg.append("path").attr("id", "roof").attr("class", "roof").attr("d", d3.line().x((d) => x(d[0])).y((d) => y(d[1]))(roof));
  const dots = svg.append("g").selectAll("circle").data(points).join("circle").attr("class", "kernel-point")
    .attr("cx", (p) => x(p.intensity)).attr("cy", (p) => y(p.gflops)).attr("r", 5)
    .on("click", (e, p) => { const k = kernelByName(p.name); if (k) openKernel(k.id); });
  dots.append("title").text((p) => {
    const bound = Math.min(peaks.GFLOPS, p.intensity * peaks["GB/s"]);
    return `${p.name}: ${p.gflops} GFLOPS, ${p.gbs} GB/s, ${(100 * p.gflops / bound).toFixed(0)}% of its roof`;
  });
}

function kernelByName(name) {
  for (const r of state.index.realizes) for (const k of r.kernels) if (k.name === name) return k;
  return null;
}

// ---------------------------------------------------------------- start
async function main() {
  for (const b of document.querySelectorAll(".tab")) b.onclick = () => show(b.dataset.view);
  document.getElementById("step-prev").onclick = () => openStep(state.step - 1);
  document.getElementById("step-next").onclick = () => openStep(state.step + 1);
  document.getElementById("step-slider").oninput = (e) => openStep(+e.target.value);
  document.addEventListener("keydown", (e) => {
    if (e.key === "ArrowLeft") openStep(state.step - 1);
    if (e.key === "ArrowRight") openStep(state.step + 1);
  });
  state.index = await api("index");
  state.trace = await api("trace");
  state.peaks = await api("peaks");
  buildList(state.index);
  const kernels = state.index.realizes.reduce((n, r) => n + r.kernels.length, 0);
  setStatus(`${state.index.realizes.length} realizes, ${kernels} kernels, ${state.trace.traceEvents.length} trace events`);
  const [kind, a, b] = location.hash.slice(1).split("/");
  if (kind === "rewrite") await openRewrite(+a, +(b || 0));
  else if (kind === "kernel") await openKernel(+a);
  else if (kind === "timeline") show("timeline");
  else if (kind === "roofline") show("roofline");
  document.body.dataset.ready = "1";
}

main().catch((e) => { setStatus("error: " + e.message); console.error(e); });
