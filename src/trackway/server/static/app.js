// The trackway dashboard: one page, hash routes, data from /api, live from /api/events. No network beyond this server.
"use strict";

const TOKEN_KEY = "trackway-token";
const COLORS = ["#2f5bd3", "#d3502f", "#1b7f3b", "#8a3fd1", "#c98a00", "#00838f", "#6d4c41"];
const page = document.getElementById("page");
// Steps are whole numbers: the x axis ticks at 1, 2, 5, 10, 20, 50, ... never at 0.5.
const STEP_INCREMENTS = [];
for (let scale = 1; scale <= 1e12; scale *= 10) STEP_INCREMENTS.push(scale, 2 * scale, 5 * scale);
const listeners = new Set();  // what the current page refreshes on an event
// Each route() is a new visit. A page renders only into the visit it began in: a refresh still waiting on the server
// when the reader went elsewhere would otherwise replace the page they went to with the one they left.
let visit = 0;

// -- plumbing ---------------------------------------------------------------------------------------------------

function takeToken() {
  // `#/runs?token=...` once: kept for this tab, removed from the address bar (never sent in a URL).
  const match = location.hash.match(/[?&]token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.hash.replace(/[?&]token=[^&]+/, ""));
  }
}

function headers(extra) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return Object.assign(token ? { Authorization: "Bearer " + token } : {}, extra || {});
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ headers: headers() }, options || {}));
  const body = (response.headers.get("content-type") || "").startsWith("application/json") ? await response.json() : await response.text();
  if (!response.ok) {
    const message = body && body.error ? body.error.message : String(body);
    if (response.status === 401) askToken();
    throw new Error(message);
  }
  return body;
}

function askToken() {
  const token = prompt("This server needs a token: the contents of $TRACKWAY_HOME/server-token, or one from `trackway token add`:");
  if (token) { sessionStorage.setItem(TOKEN_KEY, token.trim()); route(); }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(columns, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) =>
      c instanceof Node ? el("td", {}, c) : el("td", { class: typeof c === "number" ? "num" : "" }, fmt(c)))))));
}

function fmt(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(4);
  return String(value);
}

function age(iso) {
  if (!iso) return "-";
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (seconds < 90) return Math.round(seconds) + " s";
  if (seconds < 5400) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h";
  return Math.round(seconds / 86400) + " d";
}

// A moment in the viewer's own zone, to the second; the exact value the server sent on hover.
function when(iso) {
  if (!iso) return "-";
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return String(iso);
  const pad = (n) => String(n).padStart(2, "0");
  const text = `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
  return el("time", { datetime: iso, title: iso, class: "when" }, text);
}

// Signal numbers as the CLI names them (Linux numbering, where trackway's executors run).
const SIGNALS = { 1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
  10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM" };
function ending(a) {
  if (a.signal !== null && a.signal !== undefined) return SIGNALS[a.signal] || `signal ${a.signal}`;
  return a.exit_code === null || a.exit_code === undefined ? "-" : `exit ${a.exit_code}`;
}

// Text written for a terminal (`trackway resume r1`): the backticked parts as code, the rest as text, never markup.
function words(text) {
  if (text === null || text === undefined) return "-";
  return el("span", {}, String(text).split("`").map((part, i) => (i % 2 ? el("code", {}, part) : part)));
}

function stateCell(status, approval) {
  // An agent's run waiting for a person (`trackway approve RUN`) is queued, and says what it waits for.
  return el("span", { class: "state-" + status }, approval === "awaiting" ? status + " (awaiting approval)" : status);
}
function show(...nodes) { page.replaceChildren(...nodes); }
function failed(error) { show(el("p", { class: "error" }, String(error.message || error))); }
function shower() {
  // `show` for the page being rendered now: a no-op once the reader has moved to another route.
  const here = visit;
  return (...nodes) => { if (here === visit) show(...nodes); };
}

// -- the event stream: fetch (so the token can go in a header), read as server-sent events -----------------------

async function listen() {
  const live = document.getElementById("live");
  try {
    const response = await fetch("/api/events", { headers: headers() });
    if (!response.ok) throw new Error(String(response.status));
    live.classList.add("on");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const kind = (block.match(/^event: (.*)$/m) || [])[1];
        const data = (block.match(/^data: (.*)$/m) || [])[1];
        if (kind && data) listeners.forEach((heard) => heard(kind, JSON.parse(data)));
      }
    }
  } catch (error) { /* reconnect below */ }
  live.classList.remove("on");
  setTimeout(listen, 3000);
}

function onEvents(refresh, wanted) {
  // A burst of events is one refresh, and none once the reader has left (the timer outlives listeners.clear()).
  // The refreshed page listens for itself: this listener goes, else each refresh would add one and a busy page's
  // refreshes would double with every burst.
  const here = visit;
  let timer = null;
  const heard = (kind, data) => {
    if (wanted && !wanted(kind, data)) return;
    clearTimeout(timer);
    timer = setTimeout(() => {
      if (here !== visit) return;
      listeners.delete(heard);
      refresh().catch((error) => { if (here === visit) failed(error); });
    }, 300);
  };
  listeners.add(heard);
}

// -- runs ---------------------------------------------------------------------------------------------------------

const RUNS_PAGE = 100;

async function runsPage() {
  const show = shower();
  const asked = new URLSearchParams(location.hash.split("?")[1] || "");
  const filters = { search: asked.get("search") || "", project: asked.get("project") || "", kind: asked.get("kind") || "",
    state: asked.get("state") || "", sort: asked.get("sort") || "created", offset: Number(asked.get("offset") || 0) };
  const query = new URLSearchParams({ limit: RUNS_PAGE, offset: filters.offset, sort: filters.sort });
  for (const key of ["search", "project", "kind", "state"]) if (filters[key]) query.set(key, filters[key]);
  const jobs = await api("/api/jobs?" + query);
  const go = (changes) => {
    const next = Object.assign({}, filters, changes);
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(next)) if (value && !(key === "sort" && value === "created")) params.set(key, value);
    location.hash = "#/runs" + (params.toString() ? "?" + params : "");
  };
  const picked = new Set();
  const compare = el("button", { disabled: true, onclick: () => { location.hash = "#/compare/" + [...picked].join(","); } },
    "compare selected");
  const choice = (name, options) => el("select", { id: "filter-" + name, onchange: (e) => go({ [name]: e.target.value, offset: 0 }) },
    options.map((o) => el("option", { value: o, ...(filters[name] === o ? { selected: "" } : {}) }, o || `any ${name}`)));
  const search = el("input", { id: "search", type: "search", placeholder: "search id, name or command", value: filters.search,
    onchange: (e) => go({ search: e.target.value.trim(), offset: 0 }) });
  const project = el("input", { id: "filter-project", placeholder: "project", value: filters.project,
    onchange: (e) => go({ project: e.target.value.trim(), offset: 0 }) });
  // A header click sorts by that column (on the server: every page is in that order).
  const sortable = { name: "name", project: "project", status: "state", created: "created" };
  const header = (label) => sortable[label]
    ? el("a", { href: "#", class: filters.sort === sortable[label] ? "sorted" : "", onclick: (e) => { e.preventDefault(); go({ sort: sortable[label], offset: 0 }); } }, label)
    : label;
  const paging = el("span", { class: "paging" },
    el("button", { disabled: filters.offset === 0 ? "" : null, onclick: () => go({ offset: Math.max(0, filters.offset - RUNS_PAGE) }) }, "newer"),
    ` runs ${jobs.length ? filters.offset + 1 : 0}–${filters.offset + jobs.length} `,
    el("button", { disabled: jobs.length < RUNS_PAGE ? "" : null, onclick: () => go({ offset: filters.offset + RUNS_PAGE }) }, "older"));
  show(
    el("h1", {}, "Runs"),
    el("div", { class: "controls" }, search, project, choice("kind", ["", "test", "full", "eval"]),
      choice("state", ["", "queued", "running", "completed", "failed", "cancelled"]), compare, paging),
    table(["", "run", "name", "project", "kind", "status", "reason", "attempts", "last metric", "created"].map(header), jobs.map((job) => [
      el("input", { type: "checkbox", onchange: (event) => {
        event.target.checked ? picked.add(job.id) : picked.delete(job.id);
        compare.disabled = picked.size < 2;
      } }),
      el("a", { href: "#/runs/" + job.id }, job.id), job.name, job.project, job.kind, stateCell(job.status, job.approval), job.termination_reason,
      job.attempts, job.last_metric ? `${job.last_metric.key} ${fmt(job.last_metric.value)} @ ${job.last_metric.step}` : "-",
      el("span", { title: job.created_at }, age(job.created_at) + " ago"),
    ])),
  );
  onEvents(() => runsPage(),
    (kind) => kind.startsWith("attempt_") || kind === "checkpoint_committed");
}

// -- one run: curves across attempts, timeline, lineage, evaluations, explain ------------------------------------

function ema(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map((v) => (v === null ? null : (last = last === null ? v : last * weight + v * (1 - weight))));
}

function aligned(seriesByName) {
  // uPlot draws every series over one x array: the union of their steps, null where a series has no point.
  const steps = [...new Set(Object.values(seriesByName).flatMap((s) => s.steps))].sort((a, b) => a - b);
  const index = new Map(steps.map((step, i) => [step, i]));
  const columns = Object.values(seriesByName).map((s) => {
    const column = new Array(steps.length).fill(null);
    s.steps.forEach((step, i) => { column[index.get(step)] = s.values[i]; });
    return column;
  });
  return [steps, ...columns];
}

function restartMarkers(attempts, color, who, row = 0) {
  // A vertical dashed line at each attempt's first step after the first, labelled with why the one before ended.
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        for (const a of attempts.filter((a) => a.number > 1 && a.first_step !== null)) {
          const x = u.valToPos(a.first_step, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = color || "#b3261e";
          ctx.setLineDash([5, 4]);
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
          ctx.setLineDash([]);
          ctx.fillStyle = color || "#b3261e";
          ctx.font = `${12 * devicePixelRatio}px system-ui`;
          ctx.fillText(`${who ? who + " " : ""}attempt ${a.number} · after ${a.after || "?"}`, x + 4 * devicePixelRatio,
            u.bbox.top + (14 + 14 * row) * devicePixelRatio);  // one label row a run: two restarts at one step stay legible
        }
        ctx.restore();
      }],
    },
  };
}

function drawChart(target, names, data, attempts, opts) {
  target.replaceChildren();
  const series = [{ label: "step" }, ...names.map((name, i) => ({ label: name, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true }))];
  const plot = new uPlot({
    width: Math.min(target.clientWidth || 1000, 1300),
    height: 360,
    series,
    scales: { x: { time: false }, y: opts.log ? { distr: 3 } : {} },
    axes: [{ label: "step", incrs: STEP_INCREMENTS }, {}],
    cursor: { drag: { x: true, y: false } },
    plugins: opts.markers || (attempts ? [restartMarkers(attempts)] : []),
    hooks: {
      ready: [() => { if (target.isConnected) document.body.dataset.chart = "drawn"; }],  // not a left page's chart
      // The visible steps, on the element: what a reader (or a test) can check without reading the canvas.
      setScale: [(u, key) => { if (key === "x") target.dataset.steps = `${Math.round(u.scales.x.min)}..${Math.round(u.scales.x.max)}`; }],
    },
  }, data, target);
  const full = { min: data[0][0], max: data[0][data[0].length - 1] };
  target.ondblclick = () => plot.setScale("x", full);
  // Pan: the wheel with shift (or a horizontal wheel) moves the visible steps; the wheel alone zooms around the cursor.
  plot.over.addEventListener("wheel", (event) => {
    event.preventDefault();
    const { min, max } = plot.scales.x;
    const span = max - min;
    if (event.shiftKey || Math.abs(event.deltaX) > Math.abs(event.deltaY)) {
      const shift = span * 0.1 * Math.sign(event.deltaX || event.deltaY);
      plot.setScale("x", { min: min + shift, max: max + shift });
    } else {
      const at = plot.posToVal(event.offsetX, "x");
      const factor = event.deltaY < 0 ? 0.8 : 1.25;
      plot.setScale("x", { min: at - (at - min) * factor, max: at + (max - at) * factor });
    }
  }, { passive: false });
  return plot;
}

async function runPage(runId, rank = 0) {
  const show = shower();
  const [job, chart] = await Promise.all([api(`/api/jobs/${runId}`),
    api(`/api/runs/${runId}/metrics?max_points=2000&rank=${rank}`)]);
  const keys = Object.keys(chart.series);
  const chosen = new Set(keys.includes("loss") ? ["loss"] : keys.slice(0, 1));
  const opts = { log: false, smooth: 0 };
  const target = el("div", { id: "chart" });
  const redraw = () => {
    const names = keys.filter((k) => chosen.has(k));
    if (!names.length) { target.replaceChildren(el("p", { class: "muted" }, "pick a metric")); return; }
    const picked = Object.fromEntries(names.map((k) => [k, chart.series[k]]));
    const data = aligned(picked);
    for (let i = 1; i < data.length; i++) data[i] = ema(data[i], opts.smooth);
    drawChart(target, names, data, chart.attempts, opts);
  };
  // Each rank's own values: offered when more than one process logged (rank 0's by default).
  const ranks = chart.ranks.length > 1 ? el("select", { id: "rank",
    // Another rank is another visit: a refresh of this rank's page still pending must not draw it back.
    onchange: (e) => { visit += 1; listeners.clear(); runPage(runId, Number(e.target.value)).catch(failed); } },
    chart.ranks.map((r) => el("option", { value: r, ...(r === chart.rank ? { selected: "" } : {}) }, `rank ${r}`))) : "";
  const controls = el("div", { class: "controls" }, ranks,
    keys.map((k) => el("label", {}, el("input", { type: "checkbox", ...(chosen.has(k) ? { checked: "" } : {}),
      onchange: (e) => { e.target.checked ? chosen.add(k) : chosen.delete(k); redraw(); } }), " " + k)),
    el("label", {}, el("input", { type: "checkbox", id: "log", onchange: (e) => { opts.log = e.target.checked; redraw(); } }), " log scale"),
    el("label", {}, "smoothing ", el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: 0,
      oninput: (e) => { opts.smooth = Number(e.target.value); redraw(); } })),
    el("span", { class: "muted" }, "drag or wheel to zoom, shift+wheel to pan, double-click to reset"),
  );
  const markers = el("ul", { id: "markers" }, chart.attempts.filter((a) => a.number > 1).map((a) =>
    el("li", {}, (a.first_step === null ? `attempt ${a.number} logged no step` : `attempt ${a.number} starts at step ${a.first_step}`)
      + ` after ${a.after || "an ending not recorded"}` + (a.resumed_from ? `, resumed from ${a.resumed_from}` : ""))));
  // What the run set out to show (`submit --expect`), as last judged.
  const expected = (job.expectations || []).length ? el("ul", { id: "expected" }, job.expectations.map((c) =>
    el("li", {}, el("span", { class: "expect-" + c.state.replace(" ", "-") }, c.state), " ", el("code", {}, c.criterion), ` (${c.why})`))) : "";
  const tabs = el("div", { class: "tabs" });
  const body = el("div", {});
  const sections = {
    attempts: () => attemptsTable(job),
    config: () => configView(runId, job),
    checkpoints: () => checkpointsView(runId),
    evaluations: () => evaluationsView(runId),
    explain: () => explainView(runId, job),
  };
  const open = async (name) => {
    [...tabs.children].forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
    try { body.replaceChildren(await sections[name]()); } catch (error) { body.replaceChildren(el("p", { class: "error" }, error.message)); }
  };
  Object.keys(sections).forEach((name) => tabs.append(el("button", { "data-tab": name, onclick: () => open(name) }, name)));
  const summary = chart.attempts.length ? `${chart.attempts.length} attempt(s)` : "no attempt yet";
  show(
    el("h1", {}, `${job.name || job.id} `, stateCell(job.status, job.approval), el("span", { class: "muted" }, ` ${job.kind} · ${summary} · ${job.resource}`)),
    expected, controls, target, markers, tabs, body,
  );
  redraw();
  open("attempts");
  onEvents(() => runPage(runId, chart.rank),
    (kind, data) => data.run_id === runId || (data.attempt_id || "").startsWith(runId + "/"));
}

function resumedText(checkpoints) {
  // A checkpoint's name (and where it was read), else the start; not known where the attempt's events never came.
  if (checkpoints.resumed_from) {
    return checkpoints.resumed_from + (checkpoints.read_from ? ` (read from ${checkpoints.read_from})` : "");
  }
  const lost = checkpoints.events_lost || [];
  return lost.length ? `not known: this attempt's events never arrived (${lost.join(", ")})` : "the start";
}

function attemptsTable(job) {
  return table(["attempt", "started", "ended", "reason", "ended by", "steps", "resumed from", "decision", "started by"],
    job.attempts.map((a) => [a.attempt_id, when(a.started_at), when(a.ended_at), a.termination_reason, ending(a),
      a.first_step !== null ? `${a.first_step}..${a.last_step}` : "none logged",
      a.resumed_from || (a.events_lost && a.events_lost.length ? "not known (events lost)" : "the start"), a.decision ? words(`${a.decision.action}: ${a.decision.message}`) : "-", words(a.started_by)]));
}

async function configView(runId, job) {
  // The config each attempt ran with (secrets masked), and what differs from the attempt before it.
  const numbers = job.attempts.map((a) => a.number);
  if (!numbers.length) return el("p", { class: "muted" }, "no attempt yet");
  const pick = el("select", { id: "config-attempt" }, numbers.map((n) => el("option", { value: n }, `attempt ${n}`)));
  pick.value = numbers[numbers.length - 1];
  const out = el("div", { id: "config" });
  const load = async () => {
    const config = (await api(`/api/attempts/${runId}/${pick.value}/explain`)).config || {};
    const values = config.values || {};
    const before = config.differs_from_previous;
    out.replaceChildren(
      before ? el("div", { id: "config-diff" }, el("b", {}, `Against ${before.attempt_id}: `),
        before.keys.length ? el("ul", {}, before.keys.map((line) => el("li", {}, el("code", {}, line)))) : "the same config")
        : el("p", { class: "muted" }, "the first attempt: nothing before it to compare"),
      Object.keys(values).length ? table(["key", "value"], Object.entries(values).map(([k, v]) =>
        [el("code", {}, k), typeof v === "string" ? v : JSON.stringify(v)])) : el("p", { class: "muted" }, "no config declared"),
    );
  };
  pick.onchange = () => load().catch((e) => out.replaceChildren(el("p", { class: "error" }, e.message)));
  await load();
  return el("div", {}, pick, out);
}

async function checkpointsView(runId) {
  const rows = await api(`/api/runs/${runId}/checkpoints`);
  if (!rows.length) return el("p", { class: "muted" }, "no checkpoint");
  return table(["step", "name", "state", "parent", "attempt", "size", "committed"],
    rows.map((c) => [c.step, c.name, c.state, c.parent, c.attempt_id, c.size_bytes, when(c.committed_at)]));
}

async function evaluationsView(runId) {
  const result = await api(`/api/runs/${runId}/evals`);
  if (!result.evaluations.length) return el("p", { class: "muted" }, "no evaluation");
  const metrics = [...new Set(result.evaluations.flatMap((e) => Object.keys(e.metrics)))].sort();
  return table(["step", "spec", "state", ...metrics], result.evaluations.map((e) => [e.step, e.spec, e.state,
    ...metrics.map((m) => (e.metrics[m] ? `${fmt(e.metrics[m].mean)} ± ${fmt(e.metrics[m].std)} (${e.metrics[m].seeds})` : "-"))]));
}

async function explainView(runId, job) {
  const numbers = job.attempts.map((a) => a.number);
  const pick = el("select", {}, numbers.map((n) => el("option", { value: n }, `attempt ${n}`)));
  pick.value = numbers[numbers.length - 1];
  const out = el("div", { id: "explain" });
  const load = async () => {
    const facts = await api(`/api/attempts/${runId}/${pick.value}/explain`);
    const ended = facts.ended_by || {};
    const changes = Object.entries(facts.changes || {}).filter(([, v]) => v && v.length);
    out.replaceChildren(
      el("p", {}, el("b", {}, "Ended: "), `${ended.reason || "not yet"}`, ended.rule ? ` (rule ${ended.rule})` : ""),
      ended.evidence && ended.evidence.length ? el("pre", {}, ended.evidence.join("\n")) : "",
      el("p", {}, el("b", {}, "Resumed from: "), resumedText(facts.checkpoints)),
      changes.length ? el("div", {}, el("b", {}, "Changed against the previous attempt"),
        el("ul", {}, changes.map(([kind, lines]) => el("li", {}, `${kind}: ${lines.join("; ")}`)))) : "",
      facts.watchers && facts.watchers.length ? el("div", {}, el("b", {}, "Watchers"), el("ul", {}, facts.watchers.map((w) => el("li", {}, w)))) : "",
      el("p", {}, el("b", {}, "Next: "), words(facts.next_steps.trackway || "-")),
      facts.next_steps.person ? el("p", {}, el("b", {}, "To go on: "), words(facts.next_steps.person)) : "",
    );
  };
  pick.onchange = () => load().catch((e) => out.replaceChildren(el("p", { class: "error" }, e.message)));
  await load();
  return el("div", {}, pick, out);
}

// -- compare ------------------------------------------------------------------------------------------------------

async function overlay(target, ids, key, labels) {
  // The runs' curves of one metric on one step axis, one colour a run, each run's restarts dashed in its colour.
  const charts = await Promise.all(ids.map((id) => api(`/api/runs/${id}/metrics?keys=${encodeURIComponent(key)}&max_points=2000`)));
  const having = charts.filter((c) => c.series[key]);
  if (!having.length) { target.replaceChildren(el("p", { class: "muted" }, `no run here logged ${key}`)); return; }
  const names = having.map((c) => (labels && labels[c.run_id]) || c.run_id);
  const data = aligned(Object.fromEntries(having.map((c, i) => [names[i], c.series[key]])));
  const markers = having.map((c, i) => restartMarkers(c.attempts, COLORS[i % COLORS.length], names[i], i));
  drawChart(target, names, data, null, { log: false, markers });
  target.dataset.series = String(having.length);
}

async function comparePage(ids) {
  const show = shower();
  const key = new URLSearchParams(location.hash.split("?")[1] || "").get("key") || "loss";
  const facts = await api(`/api/compare?runs=${encodeURIComponent(ids.join(","))}`);
  const labels = Object.fromEntries(facts.runs.map((r) => [r.run_id, r.name || r.run_id]));
  const target = el("div", { id: "chart" });
  const keys = facts.metrics.map((m) => m.key);
  const pick = el("select", { id: "compare-key", onchange: (e) => { location.hash = `#/compare/${ids.join(",")}?key=${encodeURIComponent(e.target.value)}`; } },
    (keys.includes(key) ? keys : [key, ...keys]).map((k) => el("option", { value: k, ...(k === key ? { selected: "" } : {}) }, k)));
  const names = facts.runs.map((r) => r.name || r.run_id);
  const differing = facts.config.filter((c) => !c.same);
  show(el("h1", {}, "Compare ", names.join(" · ")), el("div", { class: "controls" }, pick), target,
    el("h2", {}, `Config: ${differing.length} key(s) differ, ${facts.config_same} the same`),
    differing.length ? table(["key", ...names], differing.map((c) => [el("code", {}, c.key),
      ...c.values.map((v) => (typeof v === "string" ? v : JSON.stringify(v)))])) : "",
    el("h2", {}, "Final metrics (best), and the difference from " + names[0]),
    table(["metric", ...names], facts.metrics.map((m) => [m.key, ...m.runs.map((r, i) => (r.final === null ? "not logged"
      : `${fmt(r.final)} (${fmt(r.best)})` + (i && r.delta !== null ? ` ${r.delta >= 0 ? "+" : ""}${fmt(r.delta)}` : "")))])),
    el("h2", {}, "Runs"), table(["run", "state", "steps", "attempts", "compute hours", "code", "data"], facts.runs.map((r, i) => [
      el("a", { href: "#/runs/" + r.run_id }, names[i]), r.state, r.steps, r.attempts, `${fmt(r.compute_hours)} ${r.compute}-h`,
      facts.code.runs[i].commit ? facts.code.runs[i].commit.slice(0, 12) : "no commit", facts.data.manifests[i] ? facts.data.manifests[i].slice(0, 12) : "none"])),
  );
  await overlay(target, ids, key, labels);
}

// -- waste, resources, experiments ---------------------------------------------------------------------------------

async function wastePage() {
  const show = shower();
  const rows = await api("/api/waste?weeks=8");
  const most = Math.max(1e-9, ...rows.map((r) => r.gpu_hours));
  show(el("h1", {}, "Compute hours by termination reason, by week"),
    el("p", { class: "muted" }, "GPU-hours where attempts had GPUs; an attempt without one counts its wall time on its CPUs."),
    table(["week", "reason", "attempts", "hours", "wasted", ""], rows.map((r) => [r.week, r.termination_reason, r.attempts,
      r.gpu_hours, r.wasted_gpu_hours, el("span", {},
        el("span", { class: "bar useful", style: `width:${200 * (r.gpu_hours - r.wasted_gpu_hours) / most}px` }),
        el("span", { class: "bar", style: `width:${200 * r.wasted_gpu_hours / most}px` }))])));
}

async function resourcesPage() {
  const show = shower();
  const rows = await api("/api/resources");
  show(el("h1", {}, "Resources and queue"), table(["resource", "executor", "gpu", "free / total", "running", "pending", "$/GPU-h", "reachable"],
    rows.map((r) => [r.resource, r.executor, r.gpu, r.total_gpus === null ? "-" : `${r.free_gpus} / ${r.total_gpus}`,
      r.running_jobs, r.pending_jobs, r.cost_per_gpu_hour, r.reachable ? "yes" : r.error])));
}

async function experimentsPage() {
  const show = shower();
  const rows = await api("/api/experiments");
  show(el("h1", {}, "Experiments"), rows.length ? table(["experiment", "title", "status", "verdict", "baseline", "full run"],
    rows.map((e) => [el("a", { href: "#/experiments/" + e.experiment_id }, e.experiment_id), e.title, e.status,
      el("span", { class: "verdict-" + e.verdict }, e.verdict || "-"), e.baseline_run_id,
      e.full_run_id ? el("a", { href: "#/runs/" + e.full_run_id }, e.full_run_id) : "-"])) : el("p", { class: "muted" }, "no experiment yet"));
}

async function experimentPage(id) {
  const show = shower();
  const d = await api(`/api/experiments/${id}`);
  const detail = d.verdict_detail || {};
  const link = (runId, label) => (runId ? el("a", { href: "#/runs/" + runId }, label || runId) : "not started");
  const candidate = d.full_run ? d.full_run.run_id : d.test_run ? d.test_run.run_id : null;
  const target = el("div", { id: "chart" });
  show(el("h1", {}, `${d.experiment_id}: ${d.title} `, el("span", { class: "verdict-" + d.verdict }, d.verdict || d.status)),
    el("p", {}, d.hypothesis),
    table(["", "baseline", "test run", "full run"], [
      ["run", link(d.baseline_run_id), link(d.test_run && d.test_run.run_id), link(d.full_run && d.full_run.run_id)],
      ["state", "-", d.test_run ? d.test_run.state : "-", d.full_run ? d.full_run.state : "-"],
    ]),
    el("h2", {}, "The change"), (d.changes || []).length ? el("ul", { id: "changes" }, d.changes.map((c) =>
      el("li", {}, el("code", {}, `${c.key}: ${JSON.stringify(c.before)} → ${JSON.stringify(c.after)}`)))) : el("p", { class: "muted" }, "no config change recorded"),
    el("h2", {}, "Loss: baseline and candidate"), target,
    candidate ? el("p", {}, el("a", { href: `#/compare/${d.baseline_run_id},${candidate}` }, "compare the runs side by side")) : "",
    el("h2", {}, "Criteria"), table(["criterion", "holds", "observed", "quantities"], (detail.criteria || []).map((o) =>
      [el("code", {}, o.criterion), o.holds === null ? "undecided" : o.holds ? "yes" : "no", o.missing || `${fmt(o.left)} vs ${fmt(o.right)}`,
        Object.entries(o.values).map(([k, v]) => `${k} = ${fmt(v)}`).join(", ")])),
    el("p", {}, words(detail.why || d.stop_reason || "")),
    el("h2", {}, "Test-run checks"), table(["check", "result", "detail"], (d.test_checks || []).map((c) =>
      [c.check, c.passed === null ? "skipped" : c.passed ? "pass" : el("span", { class: "fail" }, "FAIL"), words(c.detail)])));
  if (candidate) await overlay(target, [d.baseline_run_id, candidate], "loss", { [d.baseline_run_id]: "baseline", [candidate]: d.full_run ? "full run" : "test run" });
  else target.replaceChildren(el("p", { class: "muted" }, "no candidate run yet"));
}

// -- routing --------------------------------------------------------------------------------------------------------

async function route() {
  const here = ++visit;
  listeners.clear();
  delete document.body.dataset.chart;
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/runs";
  const parts = path.split("/").filter(Boolean);
  try {
    if (parts[0] === "runs" && parts[1]) await runPage(parts[1]);
    else if (parts[0] === "compare" && parts[1]) await comparePage(parts[1].split(","));
    else if (parts[0] === "waste") await wastePage();
    else if (parts[0] === "resources") await resourcesPage();
    else if (parts[0] === "experiments" && parts[1]) await experimentPage(parts[1]);
    else if (parts[0] === "experiments") await experimentsPage();
    else await runsPage();
  } catch (error) { if (here === visit) failed(error); }
}

takeToken();
window.addEventListener("hashchange", route);
route();
listen();
