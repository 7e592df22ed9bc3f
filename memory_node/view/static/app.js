// The memory view: plain JS and SVG, no library. Everything comes from this server's /api.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const POLL_MS = 2000;
const $ = (sel) => document.querySelector(sel);

const state = {
  span: null,            // [first t, last t] of the store
  window: [null, null],  // the time range control: [after, before], null = open
  track: [], keyframes: [], kfTotal: 0, notes: [], places: [], hits: [],
  occupancy: null, pose: null, near: null, selected: null,
  view: { cx: 0, cy: 0, s: 40 },  // world centre (m) and pixels per metre
  fitted: false, counts: "", lidarCount: -1, occupancyAt: 0,
};

// ---- helpers --------------------------------------------------------------------------------
function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function html(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}
function absTime(t) {
  if (t === null || t === undefined) return "–";
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}
function ago(t) {
  let s = Date.now() / 1000 - t;
  const future = s < 0;
  s = Math.abs(s);
  const text = s < 90 ? `${Math.round(s)} s` : s < 5400 ? `${Math.round(s / 60)} min`
    : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} days`;
  return future ? `in ${text}` : `${text} ago`;
}
// Colour by time rank among what the map shows (blue oldest, red newest): a store with gaps
// (a recording imported months before today's notes) still spreads its colours.
let timeRanks = [];
function rankTimes() {
  timeRanks = state.track.map((p) => p[0]).concat(state.keyframes.map((k) => k[1]), state.notes.map((n) => n.t));
  timeRanks.sort((a, b) => a - b);
}
function timeColor(t) {
  const n = timeRanks.length;
  let lo = 0, hi = n;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (timeRanks[mid] <= t) lo = mid + 1; else hi = mid; }
  const f = n > 1 ? Math.min(1, Math.max(0, (lo - 1) / (n - 1))) : 1;
  return `hsl(${Math.round(240 * (1 - f))} 80% 45%)`;
}
function isImage(ref) { return !!ref && /\.jpe?g$/i.test(ref); }
function fmt(v, n = 2) { return v === null || v === undefined ? "–" : Number(v).toFixed(n); }
async function api(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok || !body || body.ok !== true) {
    const err = body && body.error ? body.error : { message: `HTTP ${response.status}` };
    const message = typeof err === "string" ? err : (err.message || JSON.stringify(err));
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return body;
}
function windowQuery(extra = {}) {
  const p = new URLSearchParams();
  if (state.window[0] !== null) p.set("after", state.window[0]);
  if (state.window[1] !== null) p.set("before", state.window[1]);
  for (const [k, v] of Object.entries(extra)) p.set(k, v);
  const q = p.toString();
  return q ? `?${q}` : "";
}
function setStatus(text, isError = false) {
  const node = $("#status");
  node.textContent = text;
  node.className = isError ? "error" : "muted";
}

// ---- projection, pan and zoom -----------------------------------------------------------------
const svg = $("#map");
function size() { const r = svg.getBoundingClientRect(); return [r.width || 800, r.height || 600]; }
function toScreen(x, y) {
  const [w, h] = size(), v = state.view;
  return [w / 2 + (x - v.cx) * v.s, h / 2 - (y - v.cy) * v.s];
}
function toWorld(px, py) {
  const [w, h] = size(), v = state.view;
  return [v.cx + (px - w / 2) / v.s, v.cy - (py - h / 2) / v.s];
}
function fit() {
  const xs = [], ys = [];
  for (const p of state.track) { xs.push(p[1]); ys.push(p[2]); }
  for (const k of state.keyframes) { xs.push(k[2]); ys.push(k[3]); }
  for (const p of state.places) { xs.push(p.x - p.radius, p.x + p.radius); ys.push(p.y - p.radius, p.y + p.radius); }
  if (!xs.length) return false;
  const [w, h] = size();
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  state.view.cx = (x0 + x1) / 2;
  state.view.cy = (y0 + y1) / 2;
  state.view.s = Math.max(0.5, Math.min(400, 0.85 * Math.min(w / Math.max(1, x1 - x0), h / Math.max(1, y1 - y0))));
  return true;
}
function reveal(x, y) {  // pan so that (x, y) is on screen, only when it is not
  const [px, py] = toScreen(x, y), [w, h] = size();
  if (px < 20 || py < 20 || px > w - 20 || py > h - 20) { state.view.cx = x; state.view.cy = y; redraw(); }
}
// Layers to draw at the next frame: a pan or zoom moves them all, a search only its marks.
const LAYERS = ["grid", "occupancy", "track", "places", "keyframes", "notes", "marks"];
const dirty = new Set();
let frameRequested = false;
function redraw(layers = LAYERS) {
  for (const layer of layers) dirty.add(layer);
  if (frameRequested) return;
  frameRequested = true;
  requestAnimationFrame(() => { frameRequested = false; draw(); });
}
let drag = null;
svg.addEventListener("pointerdown", (e) => {
  drag = { x: e.clientX, y: e.clientY, cx: state.view.cx, cy: state.view.cy, moved: false, target: e.target };
  svg.setPointerCapture(e.pointerId);
});
svg.addEventListener("pointermove", (e) => {
  if (!drag) return;
  const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
  if (Math.abs(dx) + Math.abs(dy) > 4) drag.moved = true;
  if (drag.moved) {
    state.view.cx = drag.cx - dx / state.view.s;
    state.view.cy = drag.cy + dy / state.view.s;
    redraw();
  }
});
svg.addEventListener("pointerup", (e) => {
  const d = drag;
  drag = null;
  if (!d || d.moved) return;
  const target = d.target;
  if (target.classList && target.classList.contains("keyframe")) { showRow(Number(target.dataset.id)); return; }
  if (target.classList && target.classList.contains("note")) { showRow(Number(target.dataset.id)); return; }
  if (target.classList && target.classList.contains("place")) { showVisits({ visits: true, near: target.dataset.name }, `visits to ${target.dataset.name}`); return; }
  const r = svg.getBoundingClientRect();
  const [x, y] = toWorld(e.clientX - r.left, e.clientY - r.top);
  setNear(x, y);
});
svg.addEventListener("wheel", (e) => {
  e.preventDefault();
  const r = svg.getBoundingClientRect();
  const px = e.clientX - r.left, py = e.clientY - r.top;
  const [wx, wy] = toWorld(px, py);
  const factor = Math.exp(-e.deltaY * 0.0015);
  state.view.s = Math.max(0.05, Math.min(2000, state.view.s * factor));
  const [w, h] = size();
  state.view.cx = wx - (px - w / 2) / state.view.s;
  state.view.cy = wy + (py - h / 2) / state.view.s;
  redraw();
}, { passive: false });
window.addEventListener("resize", redraw);

// ---- drawing ----------------------------------------------------------------------------------
function niceStep(metres) {
  const p = Math.pow(10, Math.floor(Math.log10(metres)));
  for (const m of [1, 2, 5, 10]) if (m * p >= metres) return m * p;
  return 10 * p;
}
function drawGrid() {
  const g = $("#grid"); g.replaceChildren(); g.setAttribute("class", "grid");
  const [w, h] = size();
  const step = niceStep(80 / state.view.s);
  const [x0, y1] = toWorld(0, 0), [x1, y0] = toWorld(w, h);
  const digits = step < 1 ? Math.ceil(-Math.log10(step)) : 0;
  for (let x = Math.ceil(x0 / step) * step; x <= x1; x += step) {
    const [px] = toScreen(x, 0);
    el("line", { x1: px, y1: 0, x2: px, y2: h, class: Math.abs(x) < step / 2 ? "axis" : "" }, g);
    el("text", { x: px + 2, y: h - 4 }, g).textContent = `${x.toFixed(digits)} m`;
  }
  for (let y = Math.ceil(y0 / step) * step; y <= y1; y += step) {
    const [, py] = toScreen(0, y);
    el("line", { x1: 0, y1: py, x2: w, y2: py, class: Math.abs(y) < step / 2 ? "axis" : "" }, g);
    el("text", { x: 2, y: py - 2 }, g).textContent = `${y.toFixed(digits)} m`;
  }
  const o = $("#overlay"); o.replaceChildren();
  const bar = el("g", { class: "scalebar" }, o);
  const len = step * state.view.s;
  el("line", { x1: w - 20 - len, y1: h - 24, x2: w - 20, y2: h - 24 }, bar);
  el("line", { x1: w - 20 - len, y1: h - 28, x2: w - 20 - len, y2: h - 20 }, bar);
  el("line", { x1: w - 20, y1: h - 28, x2: w - 20, y2: h - 20 }, bar);
  el("text", { x: w - 20 - len / 2, y: h - 30, "text-anchor": "middle" }, bar).textContent = `${step} m`;
  const frame = el("text", { x: w - 20, y: 16, "text-anchor": "end" }, o);
  frame.textContent = `frame ${state.frame || "map"} · x → · y ↑`;
}
function drawOccupancy() {
  const img = $("#occupancy");
  const occ = state.occupancy;
  if (!occ || !occ.cells.length) { img.setAttribute("width", 0); return; }
  if (!occ.url) {
    const c = occ.cell;
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity, top = 1;
    for (const [x, y, n] of occ.cells) {
      x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x); y1 = Math.max(y1, y); top = Math.max(top, n);
    }
    const cols = Math.round((x1 - x0) / c) + 1, rows = Math.round((y1 - y0) / c) + 1;
    const canvas = document.createElement("canvas");
    canvas.width = cols; canvas.height = rows;
    const ctx = canvas.getContext("2d");
    for (const [x, y, n] of occ.cells) {
      const shade = Math.round(150 - 130 * Math.min(1, Math.log1p(n) / Math.log1p(top)));
      ctx.fillStyle = `rgb(${shade},${shade},${shade})`;
      ctx.fillRect(Math.round((x - x0) / c), rows - 1 - Math.round((y - y0) / c), 1, 1);
    }
    occ.url = canvas.toDataURL("image/png");
    occ.box = [x0 - c / 2, y0 - c / 2, x1 + c / 2, y1 + c / 2];
    img.setAttribute("href", occ.url);
  }
  const [a, b, c, d] = occ.box;
  const [px0, py1] = toScreen(a, d), [px1, py0] = toScreen(c, b);
  img.setAttribute("x", px0); img.setAttribute("y", py1);
  img.setAttribute("width", Math.max(0, px1 - px0)); img.setAttribute("height", Math.max(0, py0 - py1));
}
function drawTrack() {
  const g = $("#track"); g.replaceChildren();
  const pts = state.track;
  if (pts.length < 2) return;
  const bins = 32, per = Math.max(2, Math.ceil(pts.length / bins));
  for (let i = 0; i < pts.length - 1; i += per - 1) {
    const part = pts.slice(i, i + per);
    const line = el("polyline", { stroke: timeColor(part[Math.floor(part.length / 2)][0]) }, g);
    line.setAttribute("points", part.map((p) => toScreen(p[1], p[2]).map((v) => v.toFixed(1)).join(",")).join(" "));
  }
}
function drawKeyframes() {
  const g = $("#keyframes"); g.replaceChildren();
  for (const [id, t, x, y] of state.keyframes) {
    const [px, py] = toScreen(x, y);
    const dot = el("circle", { cx: px.toFixed(1), cy: py.toFixed(1), r: 4, fill: timeColor(t), "data-id": id,
      class: "keyframe" + (state.selected === id ? " selected" : "") }, g);
    el("title", {}, dot).textContent = `#${id} keyframe ${absTime(t)} (${ago(t)}) x=${fmt(x)} y=${fmt(y)}`;
  }
}
function drawNotes() {
  const g = $("#notes"); g.replaceChildren();
  for (const n of state.notes) {
    const [px, py] = toScreen(n.x, n.y);
    const mark = el("rect", { x: px - 5, y: py - 5, width: 10, height: 10, class: "note", "data-id": n.id, transform: `rotate(45 ${px} ${py})` }, g);
    el("title", {}, mark).textContent = `note #${n.id} ${absTime(n.t)} (${ago(n.t)}): ${n.text}`;
    const label = el("text", { x: px + 8, y: py + 4, class: "note-label" }, g);
    label.textContent = n.text.length > 40 ? n.text.slice(0, 39) + "…" : n.text;
  }
}
function drawPlaces() {
  const g = $("#places"); g.replaceChildren();
  for (const p of state.places) {
    const [px, py] = toScreen(p.x, p.y);
    const c = el("circle", { cx: px, cy: py, r: Math.max(3, p.radius * state.view.s), class: "place", "data-name": p.name }, g);
    el("title", {}, c).textContent = `place ${p.name} (r ${p.radius} m): click for its visits`;
    el("text", { x: px, y: py - p.radius * state.view.s - 4, "text-anchor": "middle", class: "place-label" }, g).textContent = p.name;
  }
}
function drawMarks() {
  const g = $("#hits"); g.replaceChildren();
  state.hits.forEach((hit, i) => {
    if (!hit.pose || hit.pose.x === null || hit.pose.x === undefined) return;
    const [px, py] = toScreen(hit.pose.x, hit.pose.y);
    el("circle", { cx: px, cy: py, r: 9, class: "hit-mark" }, g);
    el("text", { x: px + 10, y: py - 8, class: "hit-rank" }, g).textContent = String(i + 1);
  });
  const m = $("#marks"); m.replaceChildren();
  if (state.near) {
    const [px, py] = toScreen(state.near.x, state.near.y);
    el("circle", { cx: px, cy: py, r: Math.max(3, state.near.radius * state.view.s), class: "near-mark" }, m);
  }
  if (state.pose && state.pose.x !== null) {
    const [px, py] = toScreen(state.pose.x, state.pose.y);
    const a = -(state.pose.yaw || 0);
    const pts = [[12, 0], [-7, 6], [-7, -6]].map(([x, y]) =>
      `${(px + x * Math.cos(a) - y * Math.sin(a)).toFixed(1)},${(py + x * Math.sin(a) + y * Math.cos(a)).toFixed(1)}`);
    const robot = el("polygon", { points: pts.join(" "), class: "robot" }, m);
    el("title", {}, robot).textContent = `the robot now: x=${fmt(state.pose.x)} y=${fmt(state.pose.y)}`;
  }
}
const DRAW = { grid: () => drawGrid(), occupancy: () => drawOccupancy(), track: () => drawTrack(),
  places: () => drawPlaces(), keyframes: () => drawKeyframes(), notes: () => drawNotes(), marks: () => drawMarks() };
function draw() {
  const layers = LAYERS.filter((l) => dirty.has(l));
  dirty.clear();
  for (const layer of layers) DRAW[layer]();
}
function selectDot(id) {  // the selected keyframe, without redrawing every dot
  for (const dot of document.querySelectorAll("#map .keyframe.selected")) dot.classList.remove("selected");
  const dot = document.querySelector(`#map .keyframe[data-id="${id}"]`);
  if (dot) dot.classList.add("selected");
}

// ---- data ----------------------------------------------------------------------------------
async function loadMap() {
  const q = windowQuery({ max_points: 3000 });
  const [track, kf, notes] = await Promise.all([
    api(`/api/track${q}`), api(`/api/keyframes${q}`), api(`/api/notes${windowQuery()}`)]);
  state.frame = track.frame;
  state.track = track.points;
  state.keyframes = kf.keyframes;
  state.kfTotal = kf.total;
  state.notes = notes.notes;
  rankTimes();
  if (!state.fitted) state.fitted = fit();
  showCounts();
  redraw();
}
async function loadOccupancy() {
  try {
    state.occupancy = await api("/api/occupancy");
    state.occupancyAt = Date.now();
    redraw(["occupancy"]);
  } catch (e) { state.occupancy = null; }
}
function showCounts() {
  const shown = state.keyframes.length;
  const total = state.kfTotal;
  setStatus(`${shown === total ? shown : `${shown} of ${total}`} keyframes · ${state.notes.length} notes · ${state.places.length} places`);
}
function applyStreams(answer) {
  state.places = answer.places || [];
  let first = null, last = null;
  for (const s of answer.streams) {
    if (s.first_t !== null && s.first_t !== undefined) first = first === null ? s.first_t : Math.min(first, s.first_t);
    if (s.last_t !== null && s.last_t !== undefined) last = last === null ? s.last_t : Math.max(last, s.last_t);
  }
  if (first !== null) state.span = [first, Math.max(last, first + 1e-3)];
  renderStreams(answer);
  updateTimeText();
}
function renderStreams(answer) {
  const box = $("#streams"); box.replaceChildren();
  const table = html("table");
  const head = html("tr");
  for (const h of ["stream", "rows", "first", "last", "status", "captions"]) head.appendChild(html("th", h === "rows" ? { class: "num" } : {}, h));
  table.appendChild(head);
  for (const s of answer.streams) {
    const tr = html("tr");
    tr.appendChild(html("td", {}, s.name + (s.semantic ? " ◆" : "") + (s.topic ? ` (${s.topic})` : "")));
    tr.appendChild(html("td", { class: "num" }, String(s.count)));
    tr.appendChild(html("td", {}, s.first_t ? absTime(s.first_t).slice(5, 19) : "–"));
    tr.appendChild(html("td", {}, s.last_t ? `${absTime(s.last_t).slice(5, 19)} (${ago(s.last_t)})` : "–"));
    tr.appendChild(html("td", { class: `status-${s.status || "none"}` }, s.status || ""));
    const cap = s.captioned !== undefined && s.captioned !== null
      ? `${s.captioned} done, ${s.pending || 0} pending, ${s.failed || 0} failed` : "";
    tr.appendChild(html("td", {}, cap + (s.evicted ? ` · ${s.evicted} evicted` : "")));
    table.appendChild(tr);
  }
  box.appendChild(table);
  if (answer.indexes && answer.indexes.length) {
    const it = html("table");
    const h = html("tr");
    for (const c of ["index (model)", "vectors", "search"]) h.appendChild(html("th", {}, c));
    it.appendChild(h);
    for (const ix of answer.indexes) {
      const tr = html("tr");
      tr.appendChild(html("td", {}, ix.model_id));
      tr.appendChild(html("td", { class: "num" }, String(ix.vectors)));
      const recall = ix.recall_at_5 !== undefined ? `, recall@5 ${fmt(ix.recall_at_5, 3)}` : "";
      tr.appendChild(html("td", {}, `${ix.graph}${ix.searched_by ? ` (${ix.searched_by})` : ""}${recall}`));
      it.appendChild(tr);
    }
    box.appendChild(it);
  }
  if (state.places.length) {
    const p = html("p", {}, "places: ");
    state.places.forEach((pl, i) => {
      const a = html("a", { href: "#", "data-name": pl.name }, `${pl.name} (${fmt(pl.x, 1)}, ${fmt(pl.y, 1)}, r ${pl.radius} m)`);
      a.addEventListener("click", (e) => { e.preventDefault(); showVisits({ visits: true, near: pl.name }, `visits to ${pl.name}`); });
      if (i) p.appendChild(document.createTextNode(" · "));
      p.appendChild(a);
    });
    box.appendChild(p);
  }
  if (answer.disk_bytes !== undefined) {
    const mb = (b) => `${(b / 1048576).toFixed(1)} MB`;
    box.appendChild(html("p", { class: "muted" }, `disk: ${mb(answer.disk_bytes)}` +
      (answer.disk_budget_bytes ? ` of ${mb(answer.disk_budget_bytes)} budget` : "") +
      (answer.disk_free_bytes !== undefined ? `, ${mb(answer.disk_free_bytes)} free` : "")));
  }
}

// ---- search ----------------------------------------------------------------------------------
function extras() {
  const out = {};
  if (state.near) { out.near_x = Number(state.near.x.toFixed(3)); out.near_y = Number(state.near.y.toFixed(3)); out.radius = state.near.radius; }
  if (state.window[0] !== null) out.after = state.window[0];
  if (state.window[1] !== null) out.before = state.window[1];
  return out;
}
function searchBody() {
  const text = $("#search").value.trim();
  const more = extras();
  if (text.startsWith("{")) {
    let obj;
    try { obj = JSON.parse(text); } catch (e) { return text; }  // the server says what is wrong
    if (obj && typeof obj === "object" && !Array.isArray(obj)) {
      const has = (k) => Object.prototype.hasOwnProperty.call(obj, k);
      const centre = has("near") || has("near_here") || has("near_x");
      for (const [k, v] of Object.entries(more)) {
        if ((k === "near_x" || k === "near_y" || k === "radius") && centre) continue;
        if (!has(k)) obj[k] = v;
      }
      return JSON.stringify(obj);
    }
    return text;
  }
  if (!Object.keys(more).length) return text;
  return JSON.stringify(text ? { semantic_query: text, ...more } : more);
}
async function runSearch() {
  const body = searchBody();
  if (!body) return;
  const box = $("#results");
  box.replaceChildren(html("p", { class: "muted" }, "searching…"));
  try {
    const answer = await api("/api/search", { method: "POST", headers: { "Content-Type": "text/plain; charset=utf-8" }, body });
    if (answer.visits) { renderVisits(answer, "visits"); return; }
    renderHits(answer);
  } catch (e) {
    state.hits = [];
    box.replaceChildren(html("p", { class: "error" }, e.message));
    redraw(["marks"]);
  }
}
function renderHits(answer) {
  const box = $("#results"); box.replaceChildren();
  state.hits = answer.results;
  box.appendChild(html("h3", {}, `${answer.count} result${answer.count === 1 ? "" : "s"}` + (answer.took_ms !== undefined ? ` · ${fmt(answer.took_ms, 1)} ms` : "")));
  for (const n of answer.notes || []) box.appendChild(html("p", { class: "muted" }, n));
  answer.results.forEach((r, i) => {
    const hit = html("div", { class: "hit", "data-id": r.id });
    if (isImage(r.ref)) hit.appendChild(html("img", { src: `/api/rows/${r.id}/image?thumb=1`, alt: `keyframe #${r.id}`, loading: "eager" }));
    const body = html("div", { class: "body" });
    body.appendChild(html("div", {}, `${i + 1}. #${r.id} ${r.stream} · ${ago(r.t)} · ${absTime(r.t)}`));
    const pose = r.pose && r.pose.x !== null && r.pose.x !== undefined
      ? `x=${fmt(r.pose.x)} y=${fmt(r.pose.y)} heading=${Math.round((r.pose.yaw || 0) * 180 / Math.PI)}°` : "no pose";
    body.appendChild(html("div", { class: "muted" }, pose + (r.score !== null && r.score !== undefined ? ` · score ${fmt(r.score, 3)}` : "")));
    if (r.text) body.appendChild(html("div", { class: "text" }, r.text));
    if (r.tags && Object.keys(r.tags).length) body.appendChild(html("div", { class: "tags" }, JSON.stringify(r.tags)));
    hit.appendChild(body);
    hit.addEventListener("click", () => { showRow(r.id); if (r.pose && r.pose.x !== null) reveal(r.pose.x, r.pose.y); });
    box.appendChild(hit);
  });
  redraw(["marks"]);
}

// ---- visits ----------------------------------------------------------------------------------
function duration(s) { return s < 90 ? `${fmt(s, 0)} s` : s < 5400 ? `${fmt(s / 60, 1)} min` : `${fmt(s / 3600, 1)} h`; }
async function showVisits(query, title) {
  if (state.window[0] !== null && query.after === undefined) query.after = state.window[0];
  if (state.window[1] !== null && query.before === undefined) query.before = state.window[1];
  const box = $("#detail");
  try {
    const answer = await api("/api/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(query) });
    renderVisits(answer, title, box);
  } catch (e) { box.replaceChildren(html("p", { class: "error" }, e.message)); }
}
function renderVisits(answer, title, box = $("#results")) {
  box.replaceChildren(html("h3", {}, title));
  box.appendChild(html("p", {}, `${answer.count} visit${answer.count === 1 ? "" : "s"}, ${duration(answer.total_s)} in all` +
    (answer.first ? `; first ${absTime(answer.first)}, last ${absTime(answer.last)} (${ago(answer.last)})` : "")));
  for (const n of answer.notes || []) box.appendChild(html("p", { class: "muted" }, n));
  const table = html("table", { class: "visits" });
  const h = html("tr");
  for (const c of ["from", "to", "for"]) h.appendChild(html("th", {}, c));
  table.appendChild(h);
  for (const v of answer.visits) {
    const tr = html("tr");
    tr.appendChild(html("td", {}, absTime(v.start)));
    tr.appendChild(html("td", {}, absTime(v.end).slice(11)));
    tr.appendChild(html("td", {}, duration(v.duration_s)));
    table.appendChild(tr);
  }
  box.appendChild(table);
}

// ---- one row: the keyframe large ------------------------------------------------------------
async function showRow(id) {
  const box = $("#detail");
  try {
    const answer = await api(`/api/rows/${id}`);
    const r = answer.result;
    state.selected = r.id;
    for (const h of document.querySelectorAll("#results .hit")) h.classList.toggle("selected", Number(h.dataset.id) === r.id);
    box.replaceChildren(html("h3", {}, `#${r.id} ${r.stream}`));
    box.dataset.id = r.id;
    if (isImage(r.ref)) box.appendChild(html("img", { src: `/api/rows/${r.id}/image`, alt: `keyframe #${r.id}` }));
    const nav = html("div", { class: "nav" });
    const prev = html("button", { type: "button", class: "prev" }, "← previous keyframe");
    const next = html("button", { type: "button", class: "next" }, "next keyframe →");
    prev.disabled = answer.prev === null; next.disabled = answer.next === null;
    prev.addEventListener("click", () => showRow(answer.prev));
    next.addEventListener("click", () => showRow(answer.next));
    nav.append(prev, next);
    box.appendChild(nav);
    const table = html("table");
    const pose = r.pose || {};
    const rows = [["time", `${absTime(r.t)} (${ago(r.t)})`],
      ["pose", pose.x !== null && pose.x !== undefined ? `x=${fmt(pose.x)} y=${fmt(pose.y)} z=${fmt(pose.z)} heading=${Math.round((pose.yaw || 0) * 180 / Math.PI)}° in ${pose.frame || "?"} (${pose.source})` : "none"],
      ["text", r.text || ""], ["tags", JSON.stringify(r.tags || {})]];
    if (r.archived) rows.push(["archived", "yes"]);
    for (const [k, v] of rows) { const tr = html("tr"); tr.append(html("th", {}, k), html("td", {}, v)); table.appendChild(tr); }
    box.appendChild(table);
    selectDot(r.id);
  } catch (e) { box.replaceChildren(html("p", { class: "error" }, e.message)); }
}

// ---- "search here" and the time range ------------------------------------------------------
function setNear(x, y) {
  state.near = { x, y, radius: Number($("#radius").value) || 2 };
  $("#near").hidden = false;
  $("#near-text").textContent = `x=${fmt(x)} y=${fmt(y)}`;
  redraw(["marks"]);
  runSearch();
}
$("#radius").addEventListener("change", () => { if (state.near) { state.near.radius = Number($("#radius").value) || 2; redraw(["marks"]); runSearch(); } });
$("#near-clear").addEventListener("click", () => { state.near = null; $("#near").hidden = true; redraw(["marks"]); });
$("#visits-here").addEventListener("click", () => {
  if (!state.near) return;
  showVisits({ visits: true, near_x: state.near.x, near_y: state.near.y, radius: state.near.radius }, `visits within ${state.near.radius} m of x=${fmt(state.near.x)} y=${fmt(state.near.y)}`);
});
$("#search").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); runSearch(); } });
function sliderTime(id) {
  const v = Number($(id).value);
  if (!state.span) return null;
  if (id === "#after-range" && v <= 0) return null;
  if (id === "#before-range" && v >= 1000) return null;
  return state.span[0] + (state.span[1] - state.span[0]) * v / 1000;
}
function updateTimeText() {
  const a = sliderTime("#after-range"), b = sliderTime("#before-range");
  $("#after-text").textContent = a === null ? (state.span ? absTime(state.span[0]) : "") : absTime(a);
  $("#before-text").textContent = b === null ? "now" : absTime(b);
}
let rangeTimer = null;
function onRange() {
  if (Number($("#after-range").value) > Number($("#before-range").value)) $("#before-range").value = $("#after-range").value;
  state.window = [sliderTime("#after-range"), sliderTime("#before-range")];
  updateTimeText();
  clearTimeout(rangeTimer);
  rangeTimer = setTimeout(() => loadMap().catch((e) => setStatus(e.message, true)), 200);
}
$("#after-range").addEventListener("input", onRange);
$("#before-range").addEventListener("input", onRange);
$("#time-reset").addEventListener("click", () => { $("#after-range").value = 0; $("#before-range").value = 1000; onRange(); });

// ---- live --------------------------------------------------------------------------------
async function poll() {
  try {
    const [streams, pose] = await Promise.all([api("/api/streams"), api("/api/pose").catch(() => ({ pose: null }))]);
    const counts = JSON.stringify(streams.streams.map((s) => [s.name, s.count, s.last_t])) + JSON.stringify(streams.places || []);
    const lidar = streams.streams.filter((s) => s.name === "lidar").reduce((n, s) => n + s.count, 0);
    const moved = JSON.stringify(pose.pose) !== JSON.stringify(state.pose);
    state.pose = pose.pose;
    applyStreams(streams);
    if (counts !== state.counts) {
      state.counts = counts;
      await loadMap();
    } else if (moved) redraw(["marks"]);
    if (lidar > 0 && lidar !== state.lidarCount && Date.now() - state.occupancyAt > 10000) {
      state.lidarCount = lidar;
      loadOccupancy();
    }
  } catch (e) {
    setStatus(`memory unreachable: ${e.message}`, true);
  }
}
async function start() {
  await poll();
  setInterval(poll, POLL_MS);
}
start();
