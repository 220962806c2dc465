// farside proxy dashboard: reads /events (server-sent events, one JSON snapshot per
// event; format in crates/proxy/src/dashboard.rs), keeps the last minute, and draws the
// tables and charts. Plain JS, no build step.
'use strict';

const HISTORY_MS = 60000; // charts show the last minute
const RATE_WINDOW_MS = 1000; // rates are over the last second of snapshots
const CHART_HEIGHT = 180;

const hist = []; // snapshots, oldest first
let updates = 0;
let charts = null; // {key, load, age, decisions, routed}

const $ = (sel) => document.querySelector(sel);
const num = (x) => (typeof x === 'number' && isFinite(x) ? x : null);

function fmt(x, digits) {
  if (x === null || x === undefined) return '–';
  if (digits === undefined) digits = Math.abs(x) >= 100 || Number.isInteger(x) ? 0 : 1;
  return x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function fmtMs(ns) {
  if (ns === null || ns === undefined) return '–';
  const ms = ns / 1e6;
  return ms < 10 ? fmt(ms, 2) + ' ms' : fmt(ms, 0) + ' ms';
}

// The first value whose key starts with `prefix` (e.g. a family with unknown labels).
function pick(v, prefix) {
  for (const k in v) if (k === prefix || k.startsWith(prefix + '{')) return v[k];
  return null;
}

// Sum of all samples of family `name` in `g` whose labels match `want` (an object).
function sumOf(g, name, want) {
  let s = 0;
  for (const k in g) {
    if (!(k === name || k.startsWith(name + '{'))) continue;
    const labels = parseLabels(k);
    let ok = true;
    for (const w in want) if (labels[w] !== want[w]) ok = false;
    if (ok) s += g[k] || 0;
  }
  return s;
}

function parseLabels(key) {
  const out = {};
  const i = key.indexOf('{');
  if (i < 0) return out;
  for (const kv of key.slice(i + 1, -1).split(',')) {
    const j = kv.indexOf('=');
    out[kv.slice(0, j)] = kv.slice(j + 1);
  }
  return out;
}

// The snapshot about RATE_WINDOW_MS before the newest (or the oldest kept).
function base() {
  const now = hist[hist.length - 1];
  for (let i = hist.length - 2; i >= 0; i--) {
    if (now.t_ms - hist[i].t_ms >= RATE_WINDOW_MS) return hist[i];
  }
  return hist.length > 1 ? hist[0] : null;
}

function rate(cur, old, f) {
  if (!old) return null;
  const dt = (cur.t_ms - old.t_ms) / 1000;
  if (dt <= 0) return null;
  const a = f(cur), b = f(old);
  if (a === null || b === null) return null;
  return Math.max(0, (a - b) / dt);
}

function backendOf(snap, addr) {
  for (const b of snap.backends) if (b.addr === addr) return b;
  return null;
}

// fresh / stale / down / local (no load data) / never read, as the control layer sees it.
function state(snap, b) {
  const v = b.v;
  if (v.farside_backend_down === 1) return ['down', 'down (after a failure)'];
  const status = v.farside_monitor_status;
  if (status === undefined) return ['local', b.transport === 'none' ? 'no load data' : 'unknown'];
  if (status === 0) return ['stale', 'never read'];
  const age = v.farside_monitor_record_age_ns / 1e6;
  if (status === 2) return ['stale', 'read failing'];
  if (age > snap.stale_after_ms) return ['stale', 'stale'];
  return ['fresh', 'fresh'];
}

function cell(tr, cls, text, title) {
  const td = document.createElement('td');
  td.className = cls;
  td.textContent = text;
  if (title) td.title = title;
  tr.appendChild(td);
  return td;
}

function drawBackends(cur, old) {
  const body = $('#backends tbody');
  body.textContent = '';
  const routedRates = cur.backends.map((b) =>
    rate(cur, old, (s) => {
      const o = backendOf(s, b.addr);
      return o ? num(o.v.farside_backend_routed_total) : null;
    }));
  const totalRate = routedRates.reduce((a, r) => a + (r || 0), 0);
  const totalRouted = cur.backends.reduce((a, b) => a + (b.v.farside_backend_routed_total || 0), 0);
  cur.backends.forEach((b, i) => {
    const v = b.v;
    const tr = document.createElement('tr');
    tr.className = 'backend';
    tr.dataset.addr = b.addr;
    cell(tr, 'addr', b.addr);
    cell(tr, 'site', b.site || '(any)');
    cell(tr, 'transport', b.transport);
    const [cls, label] = state(cur, b);
    cell(tr, 'state ' + cls, label);
    const load = num(pick(v, 'farside_backend_load'));
    const limit = num(v.farside_backend_limit);
    // A back-end admitted by another metric than the configured one (`backlog` under
    // `delay` while it publishes no queueing delay) says so beside its load.
    cell(tr, 'load', (load === null || load < 0 ? '–' : fmt(load)) + ' / ' +
      (limit === null || limit > 1e15 ? '∞' : fmt(limit)) + (b.metric ? ' (' + b.metric + ')' : ''),
      'metric ' + (b.metric ? b.metric + ': no delay reading' : cur.metric));
    cell(tr, 'inflight', fmt(num(v.farside_backend_inflight)));
    cell(tr, 'routed-rate', fmt(routedRates[i], 1));
    const share = totalRate > 0 ? routedRates[i] / totalRate
      : totalRouted > 0 ? (v.farside_backend_routed_total || 0) / totalRouted : null;
    cell(tr, 'share', share === null ? '–' : fmt(100 * share, 0) + ' %',
      totalRate > 0 ? 'of requests routed in the last second' : 'of all requests routed');
    const f = (name) => num(v['farside_monitor_load{field=' + name + '}']);
    const cpu = f('cpu_util_ppm');
    cell(tr, 'cpu', cpu === null ? '–' : fmt(cpu / 1e4, 1));
    cell(tr, 'runnable', fmt(f('runnable')));
    cell(tr, 'conns', fmt(f('conns_established')));
    cell(tr, 'backlog', fmt(f('accept_backlog')));
    cell(tr, 'pending', fmt(f('conns_pending')));
    const age = num(v.farside_monitor_record_age_ns);
    cell(tr, 'age', fmtMs(age), 'stale after ' + cur.stale_after_ms + ' ms');
    let gap = null;
    const o = old && backendOf(old, b.addr);
    const gs = num(v.farside_monitor_update_gap_seconds_sum);
    const gc = num(v.farside_monitor_update_gap_seconds_count);
    if (o && gc !== null && gc > (o.v.farside_monitor_update_gap_seconds_count || 0)) {
      gap = (gs - o.v.farside_monitor_update_gap_seconds_sum) /
        (gc - o.v.farside_monitor_update_gap_seconds_count);
    } else if (gc) {
      gap = gs / gc;
    }
    cell(tr, 'gap', gap === null ? '–' : fmtMs(gap * 1e9));
    const lat = num(v.farside_monitor_read_latency_ns);
    cell(tr, 'latency', lat === null ? '–' : fmt(lat / 1000, 1) + ' µs');
    cell(tr, 'errors', fmt(num(v.farside_monitor_read_errors_total)));
    const busy = num(v['farside_upstream_conns{state=busy}']);
    const idle = num(v['farside_upstream_conns{state=idle}']);
    cell(tr, 'upstream', busy === null ? '–' : fmt(busy) + ' / ' + fmt(idle));
    body.appendChild(tr);
  });
}

// Outcomes: requests admitted (every routed request counts there), then each rejection
// reason over both stages (a connection refused at accept sends no request), then the
// connections admitted at accept (a connection carries one or many requests).
function outcomes(g) {
  const out = [['admit', sumOf(g, 'farside_admission_decisions_total', { stage: 'request', outcome: 'admit' })]];
  const reasons = new Set();
  for (const k in g) {
    if (k.startsWith('farside_admission_decisions_total{') || k.startsWith('farside_proxy_rejects_total{')) {
      const r = parseLabels(k).reason;
      if (r) reasons.add(r);
    }
  }
  for (const r of reasons) {
    // The data path's rejects (farside_proxy_rejects_total) include the gate's and
    // its own (queue_timeout); count each reason once, the larger of the two.
    out.push([r, Math.max(
      sumOf(g, 'farside_admission_decisions_total', { outcome: 'reject', reason: r }),
      sumOf(g, 'farside_proxy_rejects_total', { reason: r }))]);
  }
  out.push(['accept', sumOf(g, 'farside_admission_decisions_total', { stage: 'accept', outcome: 'admit' })]);
  return out;
}

function drawDecisions(cur, old) {
  const body = $('#decisions tbody');
  body.textContent = '';
  const prev = old ? new Map(outcomes(old.g)) : null;
  const dt = old ? (cur.t_ms - old.t_ms) / 1000 : 0;
  for (const [name, total] of outcomes(cur.g)) {
    const tr = document.createElement('tr');
    tr.id = 'dec-' + name;
    tr.className = name === 'admit' || name === 'accept' ? name : 'reject';
    cell(tr, 'name', name === 'admit' ? 'requests admitted'
      : name === 'accept' ? 'connections admitted at accept' : 'rejected: ' + name);
    const r = prev && dt > 0 ? Math.max(0, (total - (prev.get(name) || 0)) / dt) : null;
    cell(tr, 'rate', fmt(r, 1));
    cell(tr, 'total', fmt(total));
    body.appendChild(tr);
  }
}

function drawSites(cur) {
  const body = $('#sites tbody');
  body.textContent = '';
  const role = (b, part) => num(b.v['farside_monitor_role_served{part=' + part + '}']);
  const rows = [];
  if (cur.sites.length) {
    for (const s of cur.sites) {
      const nodes = cur.backends
        .filter((b) => role(b, 'site') === s.id && role(b, 'version') > 0)
        .map((b) => b.addr + ' v' + role(b, 'version'));
      rows.push([s.name + ' (#' + s.id + ')', s.hosts.join(' '), nodes.join(', ') || 'none (site_unserved)']);
    }
  } else {
    const by = new Map();
    for (const b of cur.backends) {
      const k = b.site || '(every host)';
      if (!by.has(k)) by.set(k, []);
      by.get(k).push(b.addr);
    }
    for (const [k, addrs] of by) rows.push([k, k === '(every host)' ? '*' : k, addrs.join(', ')]);
  }
  for (const r of rows) {
    const tr = document.createElement('tr');
    tr.className = 'site';
    cell(tr, 'name', r[0]);
    cell(tr, 'hosts', r[1]);
    cell(tr, 'nodes', r[2]);
    body.appendChild(tr);
  }
}

function makeChart(el, title, names, unit) {
  const width = Math.max(400, el.clientWidth - 10);
  const palette = ['#2a7', '#d62', '#36c', '#a3a', '#c90', '#099', '#c36', '#666'];
  const series = [{}].concat(names.map((n, i) => ({
    label: n, stroke: palette[i % palette.length], width: 1.5, spanGaps: true,
  })));
  return new uPlot({
    title, width, height: CHART_HEIGHT, series,
    scales: { x: { time: true } },
    axes: [{}, { label: unit, size: 60 }],
    legend: { live: false },
  }, [[]].concat(names.map(() => [])), el);
}

function ensureCharts(cur) {
  const key = cur.metric + '|' + cur.backends.map((b) => b.addr).join(',');
  if (charts && charts.key === key) return;
  if (charts) for (const c of ['load', 'age', 'decisions', 'routed']) charts[c].destroy();
  const names = cur.backends.map((b) => b.addr);
  charts = {
    key,
    load: makeChart($('#chart-load'), 'Load (' + cur.metric + ') per back-end', names, cur.metric),
    age: makeChart($('#chart-age'), 'Record age per back-end', names, 'ms'),
    decisions: makeChart($('#chart-decisions'), 'Decisions per second', ['admitted', 'rejected'], '/s'),
    routed: makeChart($('#chart-routed'), 'Routed per second per back-end', names, '/s'),
  };
}

function drawCharts(cur) {
  ensureCharts(cur);
  const xs = [], load = [], age = [], adm = [], rej = [], routed = [];
  const addrs = cur.backends.map((b) => b.addr);
  addrs.forEach(() => { load.push([]); age.push([]); routed.push([]); });
  let prev = null;
  for (const s of hist) {
    xs.push(s.t_ms / 1000);
    addrs.forEach((a, i) => {
      const b = backendOf(s, a);
      const l = b ? num(pick(b.v, 'farside_backend_load')) : null;
      load[i].push(l === null || l < 0 ? null : l);
      const ag = b ? num(b.v.farside_monitor_record_age_ns) : null;
      age[i].push(ag === null ? null : ag / 1e6);
      routed[i].push(rate(s, prev, (x) => {
        const o = backendOf(x, a);
        return o ? num(o.v.farside_backend_routed_total) : null;
      }));
    });
    const o = outcomes(s.g);
    const po = prev ? outcomes(prev.g) : null;
    const dt = prev ? (s.t_ms - prev.t_ms) / 1000 : 0;
    const sumRej = (list) => list.slice(1, -1).reduce((a, x) => a + x[1], 0);
    adm.push(po && dt > 0 ? Math.max(0, (o[0][1] - po[0][1]) / dt) : null);
    rej.push(po && dt > 0 ? Math.max(0, (sumRej(o) - sumRej(po)) / dt) : null);
    prev = s;
  }
  charts.load.setData([xs].concat(load));
  charts.age.setData([xs].concat(age));
  charts.decisions.setData([xs, adm, rej]);
  charts.routed.setData([xs].concat(routed));
}

function onSnapshot(cur) {
  hist.push(cur);
  while (hist.length > 1 && cur.t_ms - hist[0].t_ms > HISTORY_MS) hist.shift();
  updates++;
  document.body.dataset.updates = String(updates);
  const old = base();
  $('#about').textContent = 'admission ' + (cur.admission ? 'on' : 'off') + ' · metric ' +
    cur.metric + ' · stale after ' + cur.stale_after_ms + ' ms · ' + cur.backends.length +
    ' back-end(s)';
  const st = $('#status');
  st.className = 'status ok';
  st.textContent = 'live · ' + updates + ' updates · ' + new Date(cur.t_ms).toLocaleTimeString();
  drawBackends(cur, old);
  drawDecisions(cur, old);
  drawSites(cur);
  try {
    drawCharts(cur);
  } catch (e) {
    // Charts are an extra: the tables stay live whatever happens to them.
    console.error('charts:', e);
  }
}

function connect() {
  const hz = new URLSearchParams(location.search).get('hz');
  const es = new EventSource('/events' + (hz ? '?hz=' + encodeURIComponent(hz) : ''));
  es.onmessage = (e) => {
    try {
      onSnapshot(JSON.parse(e.data));
    } catch (err) {
      console.error('snapshot:', err);
    }
  };
  es.onerror = () => {
    const st = $('#status');
    st.className = 'status bad';
    st.textContent = 'disconnected (retrying; the proxy may be down or at its stream limit)';
  };
}

connect();
