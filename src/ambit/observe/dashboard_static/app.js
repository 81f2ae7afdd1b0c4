// The topology page of `ambit dashboard`: draws /api/graph as SVG, shows a node's or an edge's details, asks
// /api/explain. Every text from the API is set with textContent or as an attribute value, never parsed as markup.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const REFRESH_MS = 2000;
const state = { graph: null, selected: null, positions: new Map() };

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await response.json();
  if (!response.ok) throw new Error(body && body.error ? body.error : "HTTP " + response.status);
  return body;
}

function label(node) {
  if (node.kind === "workload") return node.name;
  if (node.kind === "service") return node.name || node.id.slice(4);
  return node.name;
}

function group(node) {
  if (node.kind === "address") return "(outside the mesh)";
  return node.namespace || "(unknown)";
}

// Namespaces side by side; a namespace's nodes on an ellipse in its column, so that an edge between two of them is
// a chord that crosses no other node. Stable from one refresh to the next (sorted ids).
function layout(graph, width, height) {
  const columns = new Map();
  for (const node of graph.nodes) {
    const key = group(node);
    if (!columns.has(key)) columns.set(key, []);
    columns.get(key).push(node);
  }
  const names = [...columns.keys()].sort((a, b) => (a.startsWith("(") - b.startsWith("(")) || a.localeCompare(b));
  const positions = new Map();
  const step = width / Math.max(names.length, 1);
  const cy = 40 + (height - 40) / 2;
  names.forEach((name, i) => {
    const nodes = columns.get(name);
    const cx = step * (i + 0.5);
    const rx = Math.max(step / 2 - 45, 30), ry = (height - 40) / 2 - 60;
    const labelChars = Math.max(8, Math.floor((nodes.length > 2 ? step / 2 : step) / 7.5));
    nodes.forEach((node, j) => {
      node.labelChars = labelChars;
      if (nodes.length === 1) {
        positions.set(node.id, { x: cx, y: cy });
        return;
      }
      const angle = -Math.PI / 2 + (2 * Math.PI * j) / nodes.length;
      positions.set(node.id, { x: cx + rx * Math.cos(angle), y: cy + ry * Math.sin(angle) });
    });
  });
  return { positions, columns: names.map((name, i) => ({ name, x: step * (i + 0.5) })) };
}

function shortened(text, most) {
  return text.length > most ? text.slice(0, most - 1) + "…" : text;
}

function edgeClasses(edge) {
  const plaintext = edge.flows > 0 ? edge.plaintext > 0 : Boolean(edge.rate && !edge.rate.mtls);
  const classes = ["edge", plaintext ? "plaintext" : "mtls"];
  if (edge.denied > 0) classes.push("denied");
  else if (edge.failed > 0 || (edge.rate && edge.rate.errorRatio > 0)) classes.push("failed");
  return classes;
}

// An edge's rates from the proxies' metrics, short: requests/s when it carries HTTP, else bytes/s; "" without any.
function rateText(rate) {
  if (!rate) return "";
  const fixed = (value) => (value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2));
  if (rate.requestsPerSecond > 0) {
    const errors = rate.errorRatio > 0 ? `, ${(100 * rate.errorRatio).toFixed(1)}% 5xx` : "";
    return `${fixed(rate.requestsPerSecond)} req/s${errors}`;
  }
  const bytes = rate.bytesPerSecond;
  const shown = bytes >= 1e6 ? `${fixed(bytes / 1e6)} MB/s` : bytes >= 1e3 ? `${fixed(bytes / 1e3)} kB/s` : `${fixed(bytes)} B/s`;
  return `${shown}, ${fixed(rate.connectionsPerSecond)} conn/s`;
}

function endPoint(from, to, radius) {
  const dx = to.x - from.x, dy = to.y - from.y;
  const length = Math.hypot(dx, dy) || 1;
  return { x: to.x - (dx / length) * radius, y: to.y - (dy / length) * radius };
}

function draw() {
  const graph = state.graph;
  const area = document.getElementById("graph");
  const box = area.getBoundingClientRect();
  const width = Math.max(box.width, 400), height = Math.max(box.height, 300);
  area.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const { positions, columns } = layout(graph, width, height);
  state.positions = positions;
  const edgeLayer = document.getElementById("edges");
  const nodeLayer = document.getElementById("nodes");
  edgeLayer.replaceChildren();
  nodeLayer.replaceChildren();
  for (const column of columns) nodeLayer.appendChild(svg("text", { class: "nslabel", x: column.x, y: 24 }, column.name));
  const pairs = new Set(graph.edges.map((e) => e.src + "\u0000" + e.dst));
  for (const edge of graph.edges) {
    const a = positions.get(edge.src), b = positions.get(edge.dst);
    if (!a || !b) continue;
    // A slight curve keeps an edge off the nodes it passes; both ways: two distinct curves.
    const bend = pairs.has(edge.dst + "\u0000" + edge.src) ? 30 : 0.12 * Math.hypot(b.x - a.x, b.y - a.y);
    const mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2;
    const dx = b.x - a.x, dy = b.y - a.y, length = Math.hypot(dx, dy) || 1;
    const cx = mx - (dy / length) * bend, cy = my + (dx / length) * bend;
    const end = endPoint({ x: cx, y: cy }, b, 24);
    const d = a === b ? `M ${a.x} ${a.y - 20} c 40 -60 60 0 20 18` : `M ${a.x} ${a.y} Q ${cx} ${cy} ${end.x} ${end.y}`;
    const rate = edge.rate || {};
    const group = svg("g", {
      "data-src": edge.src, "data-dst": edge.dst, "data-denied": edge.denied,
      "data-bytes-per-second": rate.bytesPerSecond || 0, "data-requests-per-second": rate.requestsPerSecond || 0,
      "data-connections-per-second": rate.connectionsPerSecond || 0,
    });
    const width = Math.min(1.5 + Math.log2(1 + edge.flows), 8);
    const classes = edgeClasses(edge);
    if (state.selected && state.selected.edge && state.selected.src === edge.src && state.selected.dst === edge.dst) {
      classes.push("selected");
    }
    const path = svg("path", {
      class: classes.join(" "),
      d,
      "stroke-width": width,
      "marker-end": edge.denied > 0 ? "url(#arrow-denied)" : "url(#arrow)",
    });
    const title = svg("title", {}, `${edge.src} → ${edge.dst}: ${edge.flows} flows, ${edge.denied} denied, ` +
      `${edge.failed} failed, ${edge.mtls} mTLS, ${edge.plaintext} plaintext, ${edge.bytes} bytes` +
      (edge.rate ? `; over the last ${graph.rateWindow} s: ${rateText(edge.rate)}` : ""));
    path.appendChild(title);
    group.appendChild(path);
    if (edge.rate && a !== b) group.appendChild(svg("text", { class: "rate", x: (mx + cx) / 2, y: (my + cy) / 2 - 4 }, rateText(edge.rate)));
    group.appendChild(svg("path", { class: "edge-hit", d }));
    group.addEventListener("click", () => selectEdge(edge.src, edge.dst));
    edgeLayer.appendChild(group);
  }
  for (const node of graph.nodes) {
    const p = positions.get(node.id);
    const classes = ["node", node.kind];
    if (!node.known) classes.push("unknown");
    if (state.selected && state.selected.node === node.id) classes.push("selected");
    const group = svg("g", { class: classes.join(" "), "data-node-id": node.id, transform: `translate(${p.x} ${p.y})` });
    if (node.kind === "service") group.appendChild(svg("rect", { x: -22, y: -14, width: 44, height: 28, rx: 8 }));
    else if (node.kind === "address") group.appendChild(svg("polygon", { points: "0,-18 18,0 0,18 -18,0" }));
    else group.appendChild(svg("circle", { r: 18 }));
    group.appendChild(svg("text", { y: 32, class: "name", "data-name": label(node) }, shortened(label(node), node.labelChars || 28)));
    group.appendChild(svg("title", {}, node.id));
    group.addEventListener("click", () => selectNode(node.id));
    nodeLayer.appendChild(group);
  }
  const denied = graph.edges.reduce((n, e) => n + e.denied, 0);
  const flows = graph.edges.reduce((n, e) => n + e.flows, 0);
  document.getElementById("summary").textContent =
    `${graph.nodes.length} nodes, ${graph.edges.length} edges, ${flows} flows (${denied} denied)`;
  fillExplainChoices(graph);
}

function definition(list, term, value) {
  list.appendChild(el("dt", {}, term));
  if (Array.isArray(value)) {
    if (value.length === 0) list.appendChild(el("dd", {}, "none"));
    for (const item of value) list.appendChild(el("dd", {}, item));
  } else {
    list.appendChild(el("dd", {}, value === "" || value === undefined ? "none" : value));
  }
}

function selectNode(id) {
  state.selected = { node: id };
  const node = state.graph.nodes.find((n) => n.id === id);
  const panel = document.getElementById("details");
  panel.replaceChildren(el("h2", {}, "Details"));
  if (!node) return;
  const list = el("dl", { id: "node-details" });
  definition(list, node.kind, node.name);
  if (node.namespace) definition(list, "namespace", node.namespace);
  const d = node.details || {};
  if (node.kind === "workload") {
    definition(list, "identity", d.identity || (node.known ? "none (plaintext)" : "not in any proxy's config"));
    definition(list, "node", d.node);
    definition(list, "waypoint", d.waypoint);
    definition(list, "protocol", d.protocol);
    definition(list, "addresses", d.addresses || []);
    definition(list, "policies", d.policies || []);
  } else if (node.kind === "service") {
    definition(list, "hostname", d.hostname || node.name);
    definition(list, "VIPs", d.vips || []);
    definition(list, "waypoint", d.waypoint);
  } else {
    definition(list, "address", node.name);
  }
  panel.appendChild(list);
  draw();
}

async function selectEdge(src, dst) {
  state.selected = { edge: true, src, dst };
  draw();
  const panel = document.getElementById("details");
  panel.replaceChildren(el("h2", {}, "Recent flows"), el("p", { class: "edge-title" }, `${src} → ${dst}`));
  try {
    const params = new URLSearchParams({ src, dst, window: document.getElementById("window").value });
    const answer = await getJSON("/api/edge?" + params.toString());
    const table = el("table", { id: "edge-flows" });
    const head = el("tr");
    for (const h of ["time", "proxy", "verdict", "security", "bytes", "detail"]) head.appendChild(el("th", {}, h));
    table.appendChild(head);
    for (const flow of answer.flows) {
      const row = el("tr");
      row.appendChild(el("td", {}, new Date(flow.time * 1000).toLocaleTimeString()));
      row.appendChild(el("td", {}, flow.proxy || "-"));
      row.appendChild(el("td", { class: "verdict-" + flow.verdict }, flow.verdict));
      row.appendChild(el("td", {}, flow.mtls ? "mTLS" : "plaintext"));
      row.appendChild(el("td", {}, (flow.bytes_sent || 0) + (flow.bytes_recv || 0)));
      const request = flow.method ? `${flow.method} ${flow.path || ""} ${flow.response_code} ` : "";
      row.appendChild(el("td", {}, request + (flow.reason || flow.flag || "")));
      table.appendChild(row);
    }
    const edge = state.graph.edges.find((e) => e.src === src && e.dst === dst);
    if (edge && edge.rate) {
      const r = edge.rate;
      panel.appendChild(el("p", { id: "edge-rate" }, `Over the last ${state.graph.rateWindow} s (proxies' metrics): ` +
        `${r.requestsPerSecond.toFixed(2)} req/s (${(100 * r.errorRatio).toFixed(1)}% 5xx), ` +
        `${r.bytesPerSecond.toFixed(0)} B/s, ${r.connectionsPerSecond.toFixed(2)} connections/s, ` +
        (r.security === "mutual_tls" ? "mutual TLS" : r.security === "mixed" ? "partly mutual TLS" : "plaintext")));
    }
    panel.appendChild(table);
    if (state.graph.explain && src.startsWith("wl:") && (dst.startsWith("wl:") || dst.startsWith("svc:"))) {
      panel.appendChild(el("p", { class: "hint" }, "Choose a port below to explain this pair's verdict."));
      setChoice("explain-src", src.slice(3));
      setChoice("explain-dst", dst.startsWith("wl:") ? dst.slice(3) : serviceRef(dst));
    }
  } catch (error) {
    panel.appendChild(el("p", { class: "error" }, error.message));
  }
}

function serviceRef(id) {
  const node = state.graph.nodes.find((n) => n.id === id);
  return node && node.namespace ? `${node.namespace}/${node.name}` : "";
}

function setChoice(id, value) {
  const select = document.getElementById(id);
  for (const option of select.options) if (option.value === value) select.value = value;
}

function fillExplainChoices(graph) {
  const section = document.getElementById("explain");
  section.hidden = !graph.explain;
  if (!graph.explain) return;
  const refs = (kinds) => graph.nodes.filter((n) => n.known && kinds.includes(n.kind) && n.namespace)
    .map((n) => `${n.namespace}/${n.name}`);
  for (const [id, kinds] of [["explain-src", ["workload"]], ["explain-dst", ["workload", "service"]]]) {
    const select = document.getElementById(id);
    const wanted = [...new Set(refs(kinds))].sort();
    const have = [...select.options].map((o) => o.value);
    if (have.join("\n") === wanted.join("\n")) continue;
    const keep = select.value;
    select.replaceChildren(...wanted.map((ref) => el("option", { value: ref }, ref)));
    if (wanted.includes(keep)) select.value = keep;
  }
}

async function explain(event) {
  event.preventDefault();
  const out = document.getElementById("explain-result");
  out.replaceChildren(el("p", { class: "hint" }, "asking…"));
  const params = new URLSearchParams({
    src: document.getElementById("explain-src").value,
    dst: document.getElementById("explain-dst").value,
    port: document.getElementById("explain-port").value,
  });
  try {
    const answer = await getJSON("/api/explain?" + params.toString());
    out.replaceChildren(el("p", { class: "verdict-" + answer.verdict }, `${answer.verdict} from ${answer.source}` +
      ` (${answer.sourceIdentity || "no identity: plaintext"})`));
    for (const dest of answer.destinations || []) {
      out.appendChild(el("p", { class: "verdict-" + dest.verdict },
        `${dest.destination || ""} ${dest.address || ""}:${dest.port || ""} ${dest.verdict}: ${dest.reason || ""}`));
      const list = el("ul");
      for (const policy of dest.policies || []) {
        const matched = policy.matchedRule === null || policy.matchedRule === undefined
          ? "no rule matched" : `rule ${policy.matchedRule} matched`;
        list.appendChild(el("li", {}, `${policy.policy || ""} ${policy.action || ""}${policy.dryRun ? " (dry run)" : ""}` +
          `: ${matched} ${(policy.whyNot || []).join("; ")}`));
      }
      out.appendChild(list);
    }
  } catch (error) {
    out.replaceChildren(el("p", { class: "error" }, error.message));
  }
}

async function refreshSources() {
  try {
    const sources = await getJSON("/api/sources");
    const list = document.getElementById("source-list");
    list.replaceChildren(...sources.map((s) => el("li", { class: s.error ? "error" : "" },
      `${s.name}: ${s.flows ? s.flows + " flows" : "ok"}${s.error ? " — " + s.error : ""}`)));
  } catch (error) {
    // the graph's refresh reports a dead server
  }
}

async function refresh() {
  try {
    const window = document.getElementById("window").value;
    state.graph = await getJSON("/api/graph?window=" + encodeURIComponent(window));
    draw();
    document.body.dataset.ready = String(Number(document.body.dataset.ready || "0") + 1);
  } catch (error) {
    document.getElementById("summary").textContent = "cannot read the dashboard's API: " + error.message;
  }
  refreshSources();
}

// A link may choose the window: ?window=SECONDS (whole seconds, 1 to 3600, as /api/graph takes), an option of its own
// when the list lacks it; anything else leaves the default.
function windowFromLink() {
  const text = new URLSearchParams(location.search).get("window") || "";
  if (!/^[0-9]{1,4}$/.test(text) || Number(text) < 1 || Number(text) > 3600) return;
  const select = document.getElementById("window");
  const value = String(Number(text));
  if (![...select.options].some((o) => o.value === value)) select.append(el("option", { value }, `${value} s`));
  select.value = value;
}

windowFromLink();
document.getElementById("explain-form").addEventListener("submit", explain);
document.getElementById("window").addEventListener("change", refresh);
window.addEventListener("resize", () => state.graph && draw());
refresh();
setInterval(refresh, REFRESH_MS);
