// -- the timeline: spans and messages per actor (or proc), zoomable --------------------
// The wheel zooms around the pointer, a drag pans, a double click (or "whole window")
// shows everything again; a click on a bar shows what it was. "Perfetto trace"
// downloads the same events in Chrome's trace format.
const LABEL_W = 190, ROW_H = 16, AXIS_H = 22, MAX_ROWS = 8;
function hue(name) { let h = 0; for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0; return h % 360; }
function niceStep(span, n) {
  const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (raw <= m * mag) return m * mag;
  return 10 * mag;
}
function timelinePage(params) {
  const g = generation;
  const p = {seconds: params.seconds || "300", actor: params.actor || "", proc: params.proc || ""};
  const windows = windowSelect("tl-window", [["10", "last 10 s"], ["60", "last minute"], ["300", "last 5 minutes"], ["900", "last 15 minutes"], ["3600", "last hour"]], p.seconds);
  windows.addEventListener("change", () => { location.hash = hashOf("timeline", Object.assign({}, p, {seconds: windows.value})); });
  const tl = {view: null, whole: null, lanes: [], events: []};
  const wrap = el("div", {id: "tl-wrap"});
  const detail = el("div", {id: "tl-detail", class: "muted", text: "Click a bar for its details. Wheel: zoom; drag: pan; double click: the whole window."});
  const summary = el("span", {class: "muted", id: "tl-summary"});
  const filter = p.actor || p.proc ? el("span", {id: "tl-filter"}, (p.actor ? "actor " + p.actor : "proc " + p.proc) + " ", link(hashOf("timeline", {seconds: p.seconds}), "(everything)")) : null;
  const trace = el("a", {class: "button", id: "tl-export", href: api("/api/ui/trace.json", p), download: "danaus-trace.json", text: "Perfetto trace (JSON)"});
  const zoom = f => () => { if (tl.view) { const [a, b] = tl.view, m = (a + b) / 2, h = (b - a) * f / 2; setView(tl, m - h, m + h); } };
  show(g, box(["Timeline ", el("span", {class: "muted", text: "spans and messages, one row per actor"})],
    el("div", {class: "controls"}, el("label", {}, "window", windows), filter,
      el("button", {id: "tl-zoom-in", text: "zoom in", onclick: zoom(0.5)}), el("button", {id: "tl-zoom-out", text: "zoom out", onclick: zoom(2)}),
      el("button", {id: "tl-reset", text: "whole window", onclick: () => tl.whole && setView(tl, ...tl.whole)}),
      el("button", {id: "tl-refresh", text: "refresh", onclick: () => load(tl, p, g, summary)}), trace, summary),
    wrap, el("div", {class: "legend"}, el("span", {}, el("i", {style: "background:hsl(30,65%,58%)"}), "span (colour by name)"),
      el("span", {}, el("i", {style: "background:#8fb8e8"}), "message handled"), el("span", {}, el("i", {style: "background:#c62828"}), "message that raised")),
    el("h3", {text: "Selected"}), detail));
  tl.wrap = wrap; tl.detail = detail;
  wireTimeline(tl);
  load(tl, p, g, summary);
}
async function load(tl, p, g, summary) {
  let d;
  try { d = await getJSON("/api/ui/timeline", p); } catch (e) { fail(g, e); return; }
  if (g !== generation) return;
  const events = [];
  for (const s of d.spans) events.push({kind: "span", name: s.name, track: s.track || "?", t0: s.started, t1: s.ended, row: s});
  for (const m of d.messages) events.push({kind: "message", name: m.endpoint, track: m.track || "?", t0: m.started, t1: m.ended, ok: m.ok, row: m});
  events.sort((a, b) => a.t0 - b.t0);
  // Per track, each event on the first row of its kind where it fits: the spans' rows
  // (nested spans go one deeper), then the messages' rows.
  const tracks = new Map();
  for (const e of events) {
    if (!tracks.has(e.track)) tracks.set(e.track, {name: e.track, span: [], message: []});
    const rows = tracks.get(e.track)[e.kind];
    let r = rows.findIndex(end => end <= e.t0);
    if (r < 0) { r = Math.min(rows.length, MAX_ROWS - 1); if (r === rows.length) rows.push(0); }
    rows[r] = Math.max(rows[r], e.t1);
    e.sub = r;
  }
  let y = AXIS_H;
  tl.lanes = [...tracks.values()].sort((a, b) => a.name.localeCompare(b.name, undefined, {numeric: true}));
  for (const tr of tl.lanes) { tr.y = y; tr.rows = Math.max(1, tr.span.length + tr.message.length); y += tr.rows * ROW_H + 6; }
  for (const e of events) if (e.kind === "message") e.sub += tracks.get(e.track).span.length;
  tl.height = y + 4;
  tl.events = events;
  const lo = events.length ? Math.min(...events.map(e => e.t0)) : d.since, hi = events.length ? Math.max(...events.map(e => e.t1)) : d.now;
  const pad = Math.max((hi - lo) * 0.02, 1e-4);
  tl.whole = [lo - pad, hi + pad];
  summary.textContent = d.spans.length + " spans, " + d.messages.length + " messages" + (d.truncated ? " (the newest; narrow the window for all)" : "");
  setView(tl, ...tl.whole);
}
function setView(tl, a, b) {
  if (!(b > a)) return;
  tl.view = [a, b];
  drawTimeline(tl);
}
function drawTimeline(tl) {
  const W = Math.max(600, tl.wrap.clientWidth || 1000), H = Math.max(tl.height || 60, 60);
  const [v0, v1] = tl.view, plotW = W - LABEL_W - 8;
  const xf = t => LABEL_W + plotW * (t - v0) / (v1 - v0);
  const svg = sv("svg", {id: "tl-svg", width: W, height: H, "data-v0": v0, "data-v1": v1, "data-events": tl.events.length});
  const lanes = sv("g", {class: "lanes"}), grid = sv("g", {}), bars = sv("g", {class: "bars"}), labels = sv("g", {class: "labels"});
  tl.lanes.forEach((tr, i) => lanes.append(sv("rect", {class: "lane" + (i % 2 ? " odd" : ""), x: 0, y: tr.y - 3, width: W, height: tr.rows * ROW_H + 6})));
  const step = niceStep(v1 - v0, Math.max(2, Math.floor(plotW / 110)));
  for (let t = Math.ceil(v0 / step) * step; t <= v1; t += step) {
    const x = xf(t);
    grid.append(sv("line", {class: "gridline", x1: x, x2: x, y1: AXIS_H - 4, y2: H}));
    grid.append(sv("text", {class: "tick", x: x + 2, y: 12, text: tickLabel(t, step)}));
  }
  let shown = 0;
  const byTrack = new Map(tl.lanes.map(tr => [tr.name, tr]));
  for (const e of tl.events) {
    if (e.t1 < v0 || e.t0 > v1) continue;
    const tr = byTrack.get(e.track);
    const x0 = Math.max(LABEL_W, xf(e.t0)), x1 = Math.min(W, xf(e.t1));
    const r = sv("rect", {class: "ev " + e.kind + (e.kind === "message" && e.ok === false ? " bad" : "") + (tl.selected === e ? " selected" : ""),
      x: x0, y: tr.y + e.sub * ROW_H, width: Math.max(2, x1 - x0), height: ROW_H - 2,
      "data-kind": e.kind, "data-name": e.name, "data-track": e.track},
      sv("title", {text: e.name + " · " + e.track + " · " + dur(e.t1 - e.t0)}));
    if (e.kind === "span") r.setAttribute("fill", "hsl(" + hue(e.name) + ",65%,58%)");
    // Only the classes change: a redraw would put a new element under the pointer, and a
    // double click (two clicks on one element) on a bar would no longer show the window.
    r.addEventListener("click", ev => {
      ev.stopPropagation();
      for (const old of tl.wrap.querySelectorAll("rect.ev.selected")) old.classList.remove("selected");
      r.classList.add("selected");
      tl.selected = e;
      showEvent(tl, e);
    });
    bars.append(r);
    if (x1 - x0 > 40) bars.append(sv("text", {x: x0 + 3, y: tr.y + e.sub * ROW_H + 11, "pointer-events": "none", text: short(e.name, Math.floor((x1 - x0) / 6.5))}));
    shown++;
  }
  svg.setAttribute("data-shown", shown);
  labels.append(sv("rect", {x: 0, y: 0, width: LABEL_W - 4, height: H}));
  for (const tr of tl.lanes) labels.append(sv("text", {class: "track", x: 6, y: tr.y + 11, "data-track": tr.name, text: short(tr.name, 28)}, sv("title", {text: tr.name})));
  if (!tl.lanes.length) labels.append(sv("text", {x: LABEL_W + 10, y: AXIS_H + 20, text: "No span or message in this window."}));
  svg.append(lanes, grid, bars, labels);
  tl.wrap.replaceChildren(svg);
}
function tickLabel(t, step) {
  const d = new Date(t * 1000);
  const base = d.toLocaleTimeString([], {hour12: false});
  if (step >= 1) return base;
  const digits = Math.min(6, Math.max(1, Math.ceil(-Math.log10(step))));
  return base + "." + (t % 1).toFixed(digits).slice(2);
}
function showEvent(tl, e) {
  const r = e.row, facts = el("dl", {class: "facts"});
  const add = (k, v) => { if (v != null && v !== "") facts.append(el("dt", {text: k}), el("dd", {text: String(v)})); };
  add(e.kind, e.name); add("on", e.track); add("proc", r.proc); add("host", r.host);
  add("started", new Date(e.t0 * 1000).toLocaleTimeString() + " (+" + dur(e.t0 - tl.whole[0]) + ")"); add("took", dur(e.t1 - e.t0));
  if (e.kind === "span") { add("trace id", r.trace_id); add("span id", r.span_id); add("parent", r.parent_id); for (const [k, v] of Object.entries(r.attributes || {})) add(k, v); }
  else { add("sender", r.sender); add("queued", dur(r.queued_s)); add("request bytes", r.request_bytes); add("reply bytes", r.reply_bytes); add("ok", r.ok); if (r.sample_rate != null && r.sample_rate < 1) add("sampled", "1 in " + Math.round(1 / r.sample_rate)); }
  const m = /^(.*)\[(\d+)\]$/.exec(e.track);
  tl.detail.className = "";
  tl.detail.replaceChildren(facts, m ? el("p", {class: "links"}, link(logsLink(m[1], m[2]), "logs of " + e.track), link(hashOf("actor/" + encodeURIComponent(m[1]) + "/" + m[2]), "actor " + e.track)) : null);
}
function wireTimeline(tl) {
  const wrap = tl.wrap;
  const timeAt = x => { const [v0, v1] = tl.view, W = wrap.clientWidth - LABEL_W - 8; return v0 + (v1 - v0) * Math.max(0, x - LABEL_W) / W; };
  wrap.addEventListener("wheel", ev => {
    if (!tl.view) return;
    ev.preventDefault();
    const x = ev.clientX - wrap.getBoundingClientRect().left, t = timeAt(x), f = Math.pow(1.0015, ev.deltaY);
    const [v0, v1] = tl.view;
    setView(tl, t - (t - v0) * f, t + (v1 - t) * f);
  }, {passive: false});
  let drag = null;
  wrap.addEventListener("mousedown", ev => { if (tl.view) { drag = {x: ev.clientX, view: tl.view.slice()}; wrap.classList.add("dragging"); } });
  window.addEventListener("mousemove", ev => {
    if (!drag) return;
    const W = wrap.clientWidth - LABEL_W - 8, dt = (ev.clientX - drag.x) / W * (drag.view[1] - drag.view[0]);
    if (Math.abs(ev.clientX - drag.x) > 2) setView(tl, drag.view[0] - dt, drag.view[1] - dt);
  });
  window.addEventListener("mouseup", () => { drag = null; wrap.classList.remove("dragging"); });
  wrap.addEventListener("dblclick", () => tl.whole && setView(tl, ...tl.whole));
}
