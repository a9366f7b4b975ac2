"use strict";
// danaus dashboard pages: jobs, meshes, actors, timeline, logs, metrics. Hand-written, no
// dependencies. The route is the URL's hash (#/page?param=value), so every view has a
// link; the token stays in the URL's query, and every fetch carries it.
const token = new URLSearchParams(location.search).get("token") || "";
const api = (path, params) => {
  const u = new URLSearchParams(Object.assign({token}, params || {}));
  return path + "?" + u.toString();
};
const main = document.getElementById("main");
const statusEl = document.getElementById("status");
document.getElementById("nav-topology").href = "/?token=" + encodeURIComponent(token);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null) continue;
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}
function dur(s) {
  if (s == null) return "–";
  const a = Math.abs(s);
  if (a < 1e-3) return (s * 1e6).toFixed(a < 1e-5 ? 1 : 0) + " µs";
  if (a < 1) return (s * 1e3).toFixed(a < 1e-2 ? 2 : 1) + " ms";
  if (a < 120) return s.toFixed(a < 10 ? 2 : 0) + " s";
  return (s / 60).toFixed(1) + " min";
}
function when(t) { return t == null ? "–" : new Date(t * 1000).toLocaleTimeString(); }
function num(x, d) { return x == null ? "–" : Number(x).toFixed(d || 0); }
function short(x, n) { x = x || ""; return x.length > n ? x.slice(0, n - 1) + "…" : x; }
function cls(state) { return (state || "").split(" ")[0].replace(/[^A-Za-z]+/g, "-"); }
function badge(state) { return el("span", {class: "badge " + cls(state), text: state || "?"}); }
function link(hash, text, attrs) { return el("a", Object.assign({href: hash, text}, attrs || {})); }
function hashOf(page, params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v != null && v !== "") p.set(k, v);
  const s = p.toString();
  return "#/" + page + (s ? "?" + s : "");
}
const logsLink = (mesh, rank) => hashOf("logs", {mesh, rank});
const spansLink = (actor, proc) => hashOf("timeline", {actor, proc});
function box(title, ...kids) { return el("section", {class: "box"}, el("h2", {}, ...[].concat(title)), ...kids); }
async function getJSON(path, params) {
  const r = await fetch(api(path, params));
  const d = await r.json();
  if (!r.ok) throw new Error(d.error || r.status + " " + r.statusText);
  return d;
}
// A <select> of windows [seconds, label], showing `value` even when it is not one of them.
function windowSelect(id, pairs, value) {
  const n = Number(value), label = n < 120 ? n + " s" : n < 7200 ? Math.round(n / 60) + " min" : Math.round(n / 3600) + " h";
  if (!pairs.some(([v]) => v === value)) pairs = [[value, "last " + label], ...pairs];
  const s = el("select", {id}, ...pairs.map(([v, t]) => el("option", {value: v, text: t})));
  s.value = value;
  return s;
}
function table(headers, rows, attrs) {
  return el("table", attrs || {}, el("tr", {}, ...headers.map(h => el("th", {text: h}))), ...rows);
}

// -- routing ----------------------------------------------------------------------------
let timer = null;  // the current page's refresh
let generation = 0;  // a page's async work is dropped once another page is shown
function route() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  const parts = path.split("/").map(decodeURIComponent);
  const page = parts[0] || "jobs";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === (page === "actor" ? "actors" : page));
  if (timer) { clearInterval(timer); timer = null; }
  generation++;
  main.dataset.page = page;
  main.replaceChildren();
  const pages = {jobs: jobsPage, meshes: meshesPage, actors: actorsPage, actor: actorPage, timeline: timelinePage, logs: logsPage, metrics: metricsPage};
  (pages[page] || jobsPage)(params, parts.slice(1));
}
window.addEventListener("hashchange", route);
function every(ms, fn) { const g = generation; fn(); timer = setInterval(() => { if (g === generation && !document.hidden) fn(); }, ms); }
function show(g, ...kids) { if (g === generation) { main.replaceChildren(...kids); statusEl.textContent = "updated " + new Date().toLocaleTimeString(); } }
function fail(g, e) { if (g === generation) main.replaceChildren(box("Error", el("div", {class: "error", text: String(e.message || e)}))); }

// -- jobs, meshes, actors ---------------------------------------------------------------
async function overview(g, draw) {
  try { const d = await getJSON("/api/ui/overview"); if (g === generation) draw(d); } catch (e) { fail(g, e); }
}
function jobsPage() {
  const g = generation;
  every(3000, () => overview(g, d => {
    const j = d.job;
    const facts = el("dl", {class: "facts", id: "job-facts"});
    for (const [k, v] of [["job", j.name], ["program", j.program], ["pid", j.pid], ["host", j.hostname],
      ["procs", j.alive + " alive of " + j.procs], ["actor meshes", d.meshes.length], ["failures", j.failures],
      ["logs", j.log_dir], ["kept history", j.history || "none (the tables read the live procs)"]]) facts.append(el("dt", {text: k}), el("dd", {text: String(v)}));
    const rows = d.jobs.map(x => el("tr", {class: x.current ? "current" : null, "data-job": x.name},
      el("td", {}, x.current ? el("strong", {text: x.name + " (this job)"}) : document.createTextNode(x.name)),
      el("td", {text: new Date(x.modified * 1000).toLocaleString()}), el("td", {class: "num", text: x.procs}),
      el("td", {text: x.history ? "danaus query --job " + x.name : "–"}), el("td", {text: "danaus logs --job " + x.name})));
    show(g, box(["This job ", badge(j.failures ? "failed" : "alive")], facts,
      el("p", {class: "links"}, link("#/meshes", "meshes"), link("#/actors", "actors"), link("#/actors?failed=1", "failed actors (" + j.failures + ")"))),
      box(["Jobs on this host ", el("span", {class: "muted", text: "(their logs and kept telemetry stay after the job ends)"})],
        table(["job", "last written", "procs", "telemetry", "logs"], rows, {id: "jobs-table"})));
  }));
}
function meshesPage() {
  const g = generation;
  every(3000, () => overview(g, d => {
    const rows = d.meshes.map(m => el("tr", {class: "mesh" + (m.failed ? " failed" : ""), "data-mesh": m.mesh},
      el("td", {}, link(hashOf("actors", {mesh: m.mesh}), m.mesh)), el("td", {text: m["class"] || "–"}),
      el("td", {}, badge(m.state)), el("td", {class: "num", text: m.ranks}),
      el("td", {text: Object.entries(m.states).map(([s, n]) => n + " " + s).join(", ")}),
      el("td", {class: "num", text: m.failed}), el("td", {class: "num", text: m.restarts}),
      el("td", {class: "num", text: m.received}), el("td", {text: m.hosts.join(", ")}),
      el("td", {class: "links"}, link(logsLink(m.mesh), "logs"), link(hashOf("metrics", {mesh: m.mesh}), "metrics"))));
    const procs = d.procs.map(p => el("tr", {class: p.state === "alive" ? "" : "failed", "data-proc": p.proc},
      el("td", {text: p.proc}), el("td", {text: String(p.mesh)}), el("td", {text: Object.entries(p.coords || {}).map(([k, v]) => k + "=" + v).join(",")}),
      el("td", {}, badge(p.state)), el("td", {text: p.hostname || p.host || "?"}), el("td", {text: p.pid || "–"}),
      el("td", {class: "muted", text: short(p.reason, 120)}), el("td", {class: "links"}, link(hashOf("logs", {proc: p.proc}), "logs"), link(spansLink(null, p.proc), "timeline"))));
    show(g, box("Actor meshes", rows.length ? table(["mesh", "class", "state", "ranks", "states", "failed", "restarts", "messages", "hosts", ""], rows, {id: "meshes-table"}) : el("p", {class: "muted", text: "No actor mesh yet."})),
      box("Procs", table(["proc", "proc mesh", "coords", "state", "host", "pid", "reason", ""], procs, {id: "procs-table"})));
  }));
}
function actorsPage(params) {
  const g = generation;
  every(3000, () => overview(g, d => {
    let actors = d.actors;
    if (params.mesh) actors = actors.filter(a => a.mesh === params.mesh);
    if (params.failed) actors = actors.filter(a => a.failed);
    const rows = actors.map(a => el("tr", {class: "actor" + (a.failed ? " failed" : ""), "data-actor": a.actor},
      el("td", {}, link(hashOf("actor/" + encodeURIComponent(a.mesh) + "/" + a.rank), a.actor, {class: "actor-link"})),
      el("td", {text: a["class"] || "–"}), el("td", {}, badge(a.state)), el("td", {text: a.proc || "–"}),
      el("td", {text: a.host || "–"}), el("td", {class: "num", text: a.restarts}), el("td", {class: "num", text: a.received == null ? "–" : a.received}),
      el("td", {class: "num", text: a.queued == null ? "–" : a.queued}), el("td", {class: "muted", text: short(a.failure, 90)}),
      el("td", {class: "links"}, link(logsLink(a.mesh, a.rank), "logs", {class: "logs-link"}), link(spansLink(a.actor), "spans", {class: "spans-link"}))));
    const title = "Actors" + (params.mesh ? " of mesh " + params.mesh : "") + (params.failed ? " that failed" : "");
    const filters = el("p", {class: "links"}, link("#/actors", "all"), link(hashOf("actors", Object.assign({}, params, {failed: 1})), "failed only"));
    show(g, box(title, filters, rows.length ? table(["actor", "class", "state", "proc", "host", "restarts", "messages", "queued", "failure", ""], rows, {id: "actors-table"}) : el("p", {class: "muted", text: "No actors."})));
  }));
}
function actorPage(params, parts) {
  const g = generation, mesh = parts[0], rank = Number(parts[1]);
  every(3000, () => overview(g, d => {
    const a = d.actors.find(x => x.mesh === mesh && x.rank === rank);
    if (!a) { show(g, box("Actor " + mesh + "[" + rank + "]", el("p", {class: "muted", text: "No such actor in this job."}))); return; }
    const f = d.failures.find(x => x.mesh === mesh && x.rank === rank);
    const restarts = d.restarts.filter(r => r.child === mesh && r.ranks.includes(rank));
    const facts = el("dl", {class: "facts"});
    for (const [k, v] of [["class", a["class"]], ["proc", a.proc], ["host", a.host], ["mesh id", a.mesh_id],
      ["started", when(a.started)], ["stopped", when(a.stopped)], ["messages", a.received], ["queued", a.queued], ["restarts", a.restarts]]) facts.append(el("dt", {text: k}), el("dd", {text: v == null ? "–" : String(v)}));
    const kids = [facts, el("p", {class: "links", id: "actor-links"},
      link(logsLink(mesh, rank), "logs of " + a.actor, {id: "actor-logs"}), link(spansLink(a.actor), "spans and messages of " + a.actor, {id: "actor-spans"}),
      a.proc ? link(hashOf("logs", {proc: a.proc}), "everything proc " + a.proc + " printed") : null)];
    if (a.failure) kids.push(el("h3", {text: "Failure"}), el("div", {class: "error", id: "actor-failure", text: a.failure}));
    if (a.traceback) kids.push(el("h3", {text: "Traceback"}), el("pre", {id: "actor-traceback", text: a.traceback}));
    if (f && f.logs.length) kids.push(el("h3", {text: "Last lines of its proc"}), el("pre", {text: f.logs.map(l => l.line).join("\n")}));
    if (restarts.length) kids.push(el("h3", {text: "Restarts"}), ...restarts.map(r => el("div", {class: "restart"}, el("strong", {text: when(r.time)}), " by supervisor " + r.supervisor + ": " + r.reason)));
    show(g, box(["Actor " + a.actor + " ", badge(a.state)], ...kids));
  }));
}

// -- logs -------------------------------------------------------------------------------
function logsPage(params) {
  const g = generation;
  const f = {q: params.q || "", mesh: params.mesh || "", rank: params.rank || "", level: params.level || "", proc: params.proc || ""};
  const input = (name, attrs) => { const i = el("input", Object.assign({name, value: f[name], id: "log-" + name}, attrs)); return i; };
  const level = el("select", {name: "level", id: "log-level"}, ...["", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"].map(l => el("option", {value: l, text: l ? l + " and above" : "any (prints too)"})));
  level.value = f.level;
  const form = el("form", {class: "controls", id: "log-form"},
    el("label", {}, "text", input("q", {type: "search", placeholder: "search…", size: 28})),
    el("label", {}, "mesh", input("mesh", {size: 12})), el("label", {}, "rank", input("rank", {size: 4, inputmode: "numeric"})),
    el("label", {}, "level", level), el("label", {}, "proc", input("proc", {size: 14})), el("button", {type: "submit", text: "search"}));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const p = Object.fromEntries(new FormData(form));
    location.hash = hashOf("logs", p);
  });
  const out = el("div", {id: "log-results", text: "searching…"});
  show(g, box("Logs of every proc", form, out));
  getJSON("/api/ui/logs", f).then(d => {
    if (g !== generation) return;
    const needle = f.q.toLowerCase();
    const text = t => {
      if (!needle) return document.createTextNode(t);
      const span = el("span"); let i = 0, lo = t.toLowerCase();
      for (let j = lo.indexOf(needle); j >= 0; j = lo.indexOf(needle, i)) { span.append(t.slice(i, j), el("mark", {text: t.slice(j, j + needle.length)})); i = j + needle.length; }
      span.append(t.slice(i)); return span;
    };
    const rows = d.lines.map(l => el("tr", {class: "log-line", "data-proc": l.proc, "data-level": l.level || ""},
      el("td", {text: l.mesh || "–"}), el("td", {class: "num", text: l.rank == null ? "–" : l.rank}), el("td", {}, link(hashOf("logs", {proc: l.proc}), short(l.proc, 14))),
      el("td", {}, l.level ? badge(l.level) : el("span", {class: "muted", text: "print"})), el("td", {class: "text"}, text(l.text))));
    const procs = d.procs.filter(p => p.matches).map(p => p.proc + " (" + p.matches + ")").join(", ");
    out.replaceChildren(el("p", {class: "muted", id: "log-summary", text: d.matches + " matching lines in " + d.procs.length + " procs" + (d.truncated ? ", the newest " + d.lines.length + " shown" : "") + (procs ? ": " + procs : "")}),
      rows.length ? table(["mesh", "rank", "proc", "level", "line"], rows, {id: "log-lines"}) : el("p", {class: "muted", text: "No line matches."}));
  }).catch(e => fail(g, e));
}

// -- metrics ----------------------------------------------------------------------------
const PALETTE = ["#d9730d", "#0969da", "#1a7f37", "#8250df", "#c62828", "#0a7f8c", "#b26a00", "#6e7781", "#bf3989", "#57606a"];
function metricsPage(params) {
  const g = generation;
  const p = {name: params.name || "calls", seconds: params.seconds || "300", mesh: params.mesh || ""};
  const names = el("select", {id: "metric-name"});
  const windows = windowSelect("metric-window", [["60", "last minute"], ["300", "last 5 minutes"], ["900", "last 15 minutes"], ["3600", "last hour"], ["21600", "last 6 hours"]], p.seconds);
  const change = () => { location.hash = hashOf("metrics", {name: names.value, seconds: windows.value, mesh: p.mesh}); };
  names.addEventListener("change", change); windows.addEventListener("change", change);
  const note = el("span", {class: "muted", id: "metric-note"});
  const charts = el("div", {id: "charts"});
  show(g, box("Metrics", el("div", {class: "controls"}, el("label", {}, "metric", names), el("label", {}, "window", windows),
    p.mesh ? el("span", {}, "mesh " + p.mesh + " ", link(hashOf("metrics", {name: p.name, seconds: p.seconds}), "(all)")) : null, note), charts));
  every(2000, async () => {
    let d;
    try { d = await getJSON("/api/ui/metrics", p); } catch (e) { fail(g, e); return; }
    if (g !== generation) return;
    if (!names.options.length) { for (const n of d.names) names.append(el("option", {value: n, text: n})); names.value = p.name; }
    note.textContent = (d.kind === "counter" ? "per second (the counter's rate)" : "its value") + " · " + (d.kept ? "from the kept history" : "kept by this dashboard since it was first asked (no job history)");
    const groups = new Map();
    for (const s of d.series) {
      const key = s.mesh != null ? s.mesh + (s.endpoint ? "." + s.endpoint : "") : "procs";
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(s);
    }
    charts.replaceChildren(...[...groups].map(([key, ss]) => chart(key, ss, d)));
    if (!groups.size) charts.replaceChildren(el("p", {class: "muted", text: "No samples of " + d.name + " in this window yet."}));
  });
}
function rates(pts) {
  const out = [];
  for (let i = 1; i < pts.length; i++) {
    const dt = pts[i][0] - pts[i - 1][0], dv = pts[i][1] - pts[i - 1][1];
    if (dt > 0) out.push([pts[i][0], dv >= 0 ? dv / dt : null]);  // a restart resets a counter
  }
  return out;
}
function chart(key, ss, d) {
  const W = 420, H = 150, L = 52, R = 8, T = 8, B = 18;
  const lines = ss.map(s => ({s, pts: d.kind === "counter" ? rates(s.points) : s.points}));
  const t0 = d.since, t1 = d.now;
  let top = 0;
  for (const {pts} of lines) for (const [, v] of pts) if (v != null && v > top) top = v;
  top = top > 0 ? top * 1.1 : 1;
  const xf = t => L + (W - L - R) * (t - t0) / Math.max(1e-9, t1 - t0), yf = v => T + (H - T - B) * (1 - v / top);
  const fmt = d.name.endsWith("_s") ? dur : v => v >= 1000 ? v.toExponential(2) : num(v, v < 10 ? 2 : 0);
  const svg = sv("svg", {viewBox: "0 0 " + W + " " + H, class: "metric-chart", "data-key": key, "data-series": lines.length,
    "data-points": lines.reduce((n, l) => n + l.pts.length, 0)},
    sv("path", {class: "axis", d: "M" + L + "," + T + " L" + L + "," + (H - B) + " L" + (W - R) + "," + (H - B)}),
    sv("text", {x: L - 4, y: T + 8, "text-anchor": "end", text: fmt(top)}), sv("text", {x: L - 4, y: H - B, "text-anchor": "end", text: "0"}),
    sv("text", {x: L, y: H - 4, text: "−" + dur(t1 - t0)}), sv("text", {x: W - R, y: H - 4, "text-anchor": "end", text: "now"}));
  lines.forEach(({s, pts}, i) => {
    let path = "", pen = false;
    for (const [t, v] of pts) { if (v == null || t < t0) { pen = false; continue; } path += (pen ? " L" : " M") + xf(t).toFixed(1) + "," + yf(v).toFixed(1); pen = true; }
    svg.append(sv("path", {class: "line", d: path.trim(), stroke: PALETTE[i % PALETTE.length], "data-label": s.label}, sv("title", {text: s.label})));
  });
  const last = l => { for (let i = l.pts.length - 1; i >= 0; i--) if (l.pts[i][1] != null) return l.pts[i][1]; return null; };
  return el("div", {class: "chart"}, el("strong", {text: key + " · " + d.name}),
    svg, el("div", {class: "keys"}, ...lines.slice(0, 16).map((l, i) => el("span", {}, el("i", {style: "background:" + PALETTE[i % PALETTE.length]}), l.s.label + " " + (last(l) == null ? "–" : fmt(last(l)))))));
}

// The timeline lives in its own part of this file, below.
