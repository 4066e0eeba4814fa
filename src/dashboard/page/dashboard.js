"use strict";
// The dashboard's script: polls dashboard.json (relative, so the page also works behind a path
// prefix) and hands each panel its part. Text from the proxy (request ids, model names) is only
// ever set as textContent, never parsed as HTML.
//
// A panel is three things with one name: a section of the page with data-panel NAME, a renderer
// PANELS.NAME(body, data, doc) below, and a builder in src/dashboard/panels.rs that fills
// doc.panels.NAME. A renderer draws into `body` (the section's .body) from scratch each time.

const PANELS = {};

// --- small helpers -------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
const dash = "\u2013";
function num(v, digits) { return v === null || v === undefined ? dash : v.toFixed(digits); }
function ms(v) { return v === null || v === undefined ? dash : (v * 1000).toFixed(v < 0.1 ? 1 : 0); }
function signedMs(v) { return v === null || v === undefined ? dash : (v >= 0 ? "+" : "") + (v * 1000).toFixed(1); }
function pct(v) { return v === null || v === undefined ? dash : (v * 100).toFixed(1) + " %"; }
function table(heads, rows) {
  return h("table", {},
    h("thead", {}, h("tr", {}, heads.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}
function empty(text) { return h("div", { class: "empty" }, text); }
function ratioClass(r) { return r === null || r === undefined ? "" : r >= 0.99 ? "good" : r >= 0.9 ? "warn" : "bad"; }

// --- panels --------------------------------------------------------------------------------
// Time series kept in the page (the proxy keeps none for it): one point per refresh.
const SERIES_MAX = 300;
const series = { t: [], rps: [], good: [], inflight: [] };
let trafficChart = null;

PANELS.traffic = (body, d) => {
  series.t.push(Date.now() / 1000);
  series.rps.push(d.recent_requests_per_s);
  series.good.push(d.recent_good_per_s);
  series.inflight.push(d.in_flight);
  for (const k of Object.keys(series)) if (series[k].length > SERIES_MAX) series[k].shift();
  if (!trafficChart) {
    body.replaceChildren();
    const tiles = h("div", { class: "tiles" });
    const plot = h("div", { class: "chart" });
    body.append(tiles, plot);
    if (window.uPlot) {
      trafficChart = new uPlot({
        width: Math.max(320, body.clientWidth - 8), height: 180,
        series: [{}, { label: "requests/s", stroke: "#2563eb" }, { label: "good/s", stroke: "#1a7f37" },
                 { label: "in flight", stroke: "#b7791f", scale: "n" }],
        axes: [{}, { label: "per s" }, { side: 1, scale: "n", grid: { show: false } }],
      }, [[], [], [], []], plot);
    }
  }
  const tile = (label, value, cls) => h("div", { class: "tile" },
    h("div", { class: "label" }, label), h("div", { class: "big " + (cls || "") }, value));
  body.querySelector(".tiles").replaceChildren(
    tile(`requests/s (last ${num(d.recent_seconds, 0)} s)`, num(d.recent_requests_per_s, 1)),
    tile(`good/s (last ${num(d.recent_seconds, 0)} s)`, num(d.recent_good_per_s, 1)),
    tile("goodput ratio (window)", pct(d.goodput_ratio), ratioClass(d.goodput_ratio)),
    tile("in flight", String(d.in_flight)),
    tile("requests in window", String(d.requests)));
  if (trafficChart) trafficChart.setData([series.t, series.rps, series.good, series.inflight]);
};

PANELS.goodput = (body, d) => {
  if (!d.models.length) { body.replaceChildren(empty("no request finished in the window")); return; }
  const names = d.outcome_names;
  const rows = d.models.map((m) => h("tr", {},
    h("td", { class: "text" }, m.model),
    h("td", {}, m.requests),
    h("td", { class: ratioClass(m.ratio) }, pct(m.ratio)),
    h("td", {}, num(m.good_per_s, 2)),
    names.map((n) => h("td", { class: n === "success" || !m.outcomes[n] ? "" : "bad" }, m.outcomes[n] || 0))));
  const parts = [table(["model", "requests", "goodput ratio", "good/s", ...names], rows)];
  if (d.more_models) parts.push(h("div", { class: "muted" }, `${d.more_models} more models not shown`));
  body.replaceChildren(...parts);
};

PANELS.latency = (body, d) => {
  if (!d.groups.length) { body.replaceChildren(empty("no request finished through the proxy in the window")); return; }
  const rows = [];
  for (const g of d.groups) {
    const e = g.engine;
    rows.push(h("tr", { class: "group" }, h("td", { colspan: 10 },
      `model ${g.model}, upstream ${g.upstream === null ? "(all)" : g.upstream}`,
      h("span", { class: "muted" }, `  engine: ${num(e.requests_per_s, 2)} req/s, max running ${e.max_running ?? dash}, max waiting ${e.max_waiting ?? dash}`))));
    for (const r of g.rows) {
      r.cells.forEach((c, i) => rows.push(h("tr", {},
        h("td", { class: "text" }, i === 0 ? r.quantity : ""),
        h("td", { class: "text" }, "p" + Math.round(c.quantile * 100)),
        h("td", {}, ms(c.exact)), h("td", {}, ms(c.proxy_hist)), h("td", {}, ms(c.engine_hist)),
        h("td", {}, signedMs(c.proxy_minus_exact)), h("td", {}, signedMs(c.engine_minus_exact)),
        h("td", {}, signedMs(c.proxy_minus_engine)), h("td", {}, ms(c.bucket_width)),
        h("td", {}, i === 0 ? `${r.exact_count}/${r.proxy_count}/${r.engine_count}` : ""))));
    }
  }
  const parts = [table(["", "q", "exact", "proxy~", "engine~", "proxy-exact", "engine-exact",
    "proxy-engine", "bucket", "n exact/proxy/engine"], rows),
    h("div", { class: "muted" }, `histogram window ${num(d.window_seconds, 0)} s`)];
  if (d.more_groups) parts.push(h("div", { class: "muted" }, `${d.more_groups} more groups not shown`));
  body.replaceChildren(...parts);
};

// Where TTFT goes: the parts' means over the last seconds, charted stacked (each band is one
// part; they add up to the mean client TTFT of the same requests), and per group p50 / p99 of
// each part beside the client's exact TTFT and the engine histogram's estimate.
// Stroke and an opaque fill per part (a lower band must hide the one drawn before it).
const SPLIT_COLORS = { proxy: ["#7c3aed", "#ddd6fe"], engine_queue: ["#b7791f", "#fde68a"],
                       engine_prefill: ["#2563eb", "#bfdbfe"], rest: ["#dc2626", "#fecaca"] };
const splitSeries = { t: [], proxy: [], engine_queue: [], engine_prefill: [], rest: [] };
let splitChart = null;

PANELS.ttft_split = (body, d) => {
  splitSeries.t.push(Date.now() / 1000);
  for (const p of d.parts) splitSeries[p].push(d.recent_means[p]);
  for (const k of Object.keys(splitSeries)) if (splitSeries[k].length > SERIES_MAX) splitSeries[k].shift();
  if (!splitChart) {
    body.replaceChildren(h("div", { class: "muted now" }), h("div", { class: "chart" }), h("div", { class: "rows" }));
    if (window.uPlot) {
      // Drawn top band first: each series is the running sum up to its part, filled down to 0,
      // so the next (lower) one paints over it; the legend shows each part's own value.
      const order = [...d.parts].reverse();
      splitChart = new uPlot({
        width: Math.max(320, body.clientWidth - 8), height: 180,
        series: [{}, ...order.map((p) => ({
          label: p.replace("_", " "), stroke: SPLIT_COLORS[p][0], fill: SPLIT_COLORS[p][1],
          value: (u, v, si, i) => i === null || i === undefined ? dash : ms(splitSeries[p][i]) + " ms",
        }))],
        axes: [{}, { label: "mean, s" }],
      }, [[], ...order.map(() => [])], body.querySelector(".chart"));
    }
  }
  if (splitChart) {
    const order = [...d.parts].reverse();
    const stacked = order.map((_, k) => splitSeries.t.map((_, i) => {
      let sum = 0;
      for (const p of d.parts.slice(0, d.parts.length - k)) {
        if (splitSeries[p][i] === null || splitSeries[p][i] === undefined) return null;
        sum += splitSeries[p][i];
      }
      return sum;
    }));
    splitChart.setData([splitSeries.t, ...stacked]);
  }
  const now = d.recent_requests
    ? `last ${num(d.recent_seconds, 0)} s, ${d.recent_requests} requests: ` +
      d.parts.map((p) => `${p.replace("_", " ")} ${ms(d.recent_means[p])}`).join(" + ") + " ms (means)"
    : `no request with engine timings in the last ${num(d.recent_seconds, 0)} s`;
  body.querySelector(".now").textContent = now;
  const rowsEl = body.querySelector(".rows");
  if (!d.groups.length) {
    rowsEl.replaceChildren(empty(d.starting ? "window starting" :
      "no request in the window whose engine reported its timings (vLLM: --enable-per-request-metrics)"));
    return;
  }
  const rows = [];
  for (const g of d.groups) {
    for (const q of ["p50", "p99"]) {
      rows.push(h("tr", {},
        h("td", { class: "text" }, q === "p50" ? `${g.model} @ ${g.upstream === null ? "(all)" : g.upstream}` : ""),
        h("td", { class: "text" }, q),
        h("td", {}, ms(g.client_ttft[q])),
        d.parts.map((p) => h("td", { class: p === "rest" ? "rest" : "" }, ms(g[p][q]))),
        h("td", {}, ms(g.engine_hist_ttft[q])),
        h("td", {}, q === "p50" ? `${g.requests}${g.clamped ? ` (${g.clamped} clamped)` : ""}` : "")));
    }
  }
  rowsEl.replaceChildren(table(["model @ upstream", "q", "client ttft", "proxy", "engine queue",
    "engine prefill", "rest", "engine~ ttft", "split requests"], rows),
    h("div", { class: "muted" }, "ms; percentiles of each part do not add up (the means above do); clamped: the engine's parts exceeded the client's TTFT (two clocks), rest set to 0"));
};

PANELS.replicas = (body, d) => {
  if (!d.replicas.length) { body.replaceChildren(empty("no replica")); return; }
  // An engine not scraped (yet, or its last scrape failed) has no figures: "n/a", not 0.
  const eng = (r, v, f) => !r.engine_scraped ? h("span", { class: "muted" }, "n/a") : v === null ? dash : f(v);
  const rows = d.replicas.map((r) => h("tr", {},
    h("td", { class: "text" }, r.upstream),
    h("td", { class: r.healthy ? "good" : "bad" }, r.healthy ? "healthy" : "unhealthy"),
    h("td", {}, r.in_flight),
    h("td", {}, eng(r, r.engine_waiting, String)),
    h("td", {}, eng(r, r.engine_running, String)),
    h("td", {}, eng(r, r.kv_cache_usage, pct))));
  const parts = [table(["upstream", "health", "in flight", "engine queue", "engine running", "KV cache"], rows)];
  if (d.more) parts.push(h("div", { class: "muted" }, `${d.more} more replicas not shown`));
  body.replaceChildren(...parts);
};

PANELS.headroom = (body, d) => {
  if (!d.models.length) { body.replaceChildren(empty("no finished request yet")); return; }
  // Headroom and desired replicas stay unknown until some load broke the target once.
  const est = (v, f) => v === null || v === undefined ? h("span", { class: "muted" }, "limit not seen yet") : f(v);
  const att = (a) => a === undefined ? dash : h("span", { class: a >= d.target ? "good" : "bad" }, pct(a));
  const rows = d.models.map((m) => h("tr", {},
    h("td", { class: "text" }, m.model),
    h("td", {}, att(m.attainment[d.windows[0]])),
    h("td", {}, att(m.attainment[d.windows[1]])),
    h("td", {}, est(m.headroom_streams, (v) => v.toFixed(1))),
    h("td", {}, est(m.headroom_tokens_per_second, (v) => v.toFixed(0))),
    h("td", {}, est(m.desired_replicas, (v) => v.toFixed(2)))));
  body.replaceChildren(table(["model", `attainment ${d.windows[0]}`, `attainment ${d.windows[1]}`, "headroom streams", "headroom tokens/s", "desired replicas"], rows));
};

PANELS.routing = (body, d) => {
  const total = Object.values(d.reasons).reduce((a, n) => a + n, 0);
  const head = h("div", { class: "muted" }, `strategy ${d.strategy}; ${d.retried} of ${total} requests retried on another replica after an admission rejection`);
  // Attainment is unknown until a request finished there ("n/a", not 100 %).
  const att = (a) => a === null ? h("span", { class: "muted" }, "n/a") : h("span", { class: a >= 0.9 ? "good" : "bad" }, pct(a));
  const why = (m) => Object.entries(m).map(([k, n]) => `${k} ${n}`).join(", ") || dash;
  const reasons = Object.entries(d.reasons).map(([k, n]) => h("tr", {},
    h("td", { class: "text" }, k), h("td", {}, n), h("td", {}, pct(n / total))));
  const replicas = d.replicas.map((r) => h("tr", {},
    h("td", { class: "text" }, r.upstream),
    h("td", {}, r.load_tokens),
    h("td", {}, att(r.attainment)),
    h("td", { class: "text" }, why(r.reasons))));
  const parts = [head];
  if (total) parts.push(table(["reason", "requests", "share"], reasons));
  else parts.push(empty("no routed request in the window"));
  parts.push(table(["upstream", "load (tokens)", "attainment", "chosen because"], replicas));
  if (d.more) parts.push(h("div", { class: "muted" }, `${d.more} more replicas not shown`));
  body.replaceChildren(...parts);
};

PANELS.tools = (body, d) => {
  if (!d.requests) { body.replaceChildren(empty("no request with tool calls in the window")); return; }
  const rows = Object.entries(d.outcomes).map(([k, n]) => h("tr", {},
    h("td", { class: "text" }, k), h("td", { class: k === "valid" || !n ? "" : "bad" }, n)));
  body.replaceChildren(table(["worst tool-call outcome", "requests"], rows));
};

PANELS.slowest = (body, d) => {
  if (!d.requests.length) { body.replaceChildren(empty("no request finished in the window")); return; }
  const rows = d.requests.map((r) => h("tr", {},
    h("td", { class: "text" }, r.trace
      ? h("a", { href: "trace/" + encodeURIComponent(r.id), class: "trace" }, r.id)
      : r.id),
    h("td", { class: "text" }, r.model),
    h("td", { class: "text" }, r.upstream),
    h("td", { class: "text " + (r.outcome === "success" ? "" : "bad") }, r.outcome),
    h("td", {}, r.status ?? dash),
    h("td", {}, ms(r.e2e_s)),
    h("td", {}, ms(r.ttft_s)),
    h("td", {}, r.completion_tokens ?? dash),
    h("td", {}, num(r.age_s, 0))));
  body.replaceChildren(table(["request id", "model", "upstream", "outcome", "status", "e2e ms",
    "ttft ms", "tokens", "ended s ago"], rows));
};

// --- the loop ------------------------------------------------------------------------------
const statusEl = document.getElementById("status");
const windowEl = document.getElementById("window");
const everyEl = document.getElementById("every");
let timer = null;
let inFlight = false;

async function refresh() {
  if (inFlight) return;
  inFlight = true;
  try {
    // Built from origin and path: a page opened as http://user:token@host/ has credentials in
    // its own URL, which fetch refuses; the browser sends the ones it signed in with anyway.
    const url = new URL("dashboard.json", location.origin + location.pathname);
    url.searchParams.set("window", windowEl.value);
    const resp = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    const text = await resp.text();
    if (resp.status === 401) throw new Error("the admin port asks for its token: reload the page to sign in");
    if (!resp.ok) throw new Error(`dashboard.json answered ${resp.status}: ${text.slice(0, 200)}`);
    const doc = JSON.parse(text);
    for (const section of document.querySelectorAll("section[data-panel]")) {
      const name = section.dataset.panel;
      const render = PANELS[name];
      const body = section.querySelector(".body");
      if (!render || doc.panels[name] === undefined) {
        body.replaceChildren(empty(`no data for panel ${name}`));
        section.dataset.ok = "0";
        continue;
      }
      try {
        render(body, doc.panels[name], doc);
        section.dataset.ok = "1";
      } catch (e) {
        body.replaceChildren(h("div", { class: "bad" }, `panel ${name}: ${e}`));
        section.dataset.ok = "0";
      }
    }
    statusEl.className = "status";
    statusEl.textContent = `updated ${new Date().toLocaleTimeString()} \u00b7 ${text.length} bytes \u00b7 window ${num(doc.window_seconds, 0)} s`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (e) {
    statusEl.className = "status error";
    statusEl.textContent = String(e);
  } finally {
    inFlight = false;
  }
}

function schedule() {
  if (timer) clearInterval(timer);
  const every = Number(everyEl.value);
  timer = every > 0 ? setInterval(refresh, every) : null;
}
windowEl.addEventListener("change", refresh);
everyEl.addEventListener("change", schedule);
refresh();
schedule();
