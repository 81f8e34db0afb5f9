// The swarm page: asks /api/swarm every READ_EVERY_MS and draws it. Every string that comes
// from a peer goes into the document through textContent (never innerHTML), so a model name
// that is an HTML payload is shown as text and runs nothing.
"use strict";

const READ_EVERY_MS = 2000;  // the server reads the swarm as often (status_page.READ_EVERY_S)
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                 "#7f7f7f", "#bcbd22"];
const STATE_ORDER = ["training", "stale", "unchecked", "silent", "left", "gone"];  // how "state" sorts
const COLUMNS = [  // [heading, value of a row, shown as, numeric]
  ["peer", (r) => short(r.peer), null, false],
  ["run", (r) => r.run, null, false],
  ["answered", (r) => answered(r.checked), null, false],
  ["state", (r) => STATE_ORDER.indexOf(r.state), (v) => STATE_ORDER[v] || "?", false],
  ["age", (r) => r.age_s, (v) => `${v.toFixed(0)}s`, true],
  ["model", (r) => r.model || "-", null, false],
  ["train", (r) => (r.lora ? `LoRA r=${r.lora}` : "full"), null, false],
  ["backend", (r) => r.backend || "-", null, false],
  ["device", (r) => r.device || "-", null, false],
  ["round", (r) => r.round, null, true],
  ["reward", (r) => r.reward, (v) => v.toFixed(3), true],
  ["eval_acc", (r) => r.eval_acc, (v) => v.toFixed(3), true],
  ["published", (r) => r.published, null, true],
  ["consumed", (r) => r.consumed, null, true],
  ["filtered", (r) => r.filtered_frac, (v) => v.toFixed(2), true],
  ["reach", (r) => r.reach || "-", null, false],
  ["version", (r) => r.version || "-", null, false],
  ["uptime", (r) => r.uptime_s, (v) => `${(v / 60).toFixed(1)}m`, true],
];

const sorting = { column: "state", up: true };
const charts = {};
let latest = null;

function short(peer) {
  return peer && peer.length > 8 ? `…${peer.slice(-8)}` : peer || "";
}

function answered(checked) {
  if (!checked || !checked.asked) return "-";
  if (checked.answered_ms === null) return "no";
  const ms = checked.answered_ms;
  const took = ms < 1000 ? `${ms.toFixed(0)}ms` : `${(ms / 1000).toFixed(1)}s`;
  return checked.reached ? `${took} ${checked.reached}` : took;
}

function element(tag, text, className) {
  const made = document.createElement(tag);
  if (text !== undefined && text !== null) made.textContent = String(text);
  if (className) made.className = className;
  return made;
}

function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined) return 1;
  if (b === null || b === undefined) return -1;
  return a < b ? -1 : 1;
}

function drawPeers(peers, me) {
  const table = document.getElementById("peers");
  const head = element("tr");
  for (const [name] of COLUMNS) {
    const th = element("th", name, name === sorting.column ? (sorting.up ? "sorted up" : "sorted") : "");
    th.addEventListener("click", () => {
      sorting.up = sorting.column === name ? !sorting.up : true;
      sorting.column = name;
      if (latest) draw(latest);
    });
    head.append(th);
  }
  table.tHead.replaceChildren(head);
  const [, value] = COLUMNS.find(([name]) => name === sorting.column);
  const rows = [...peers].sort((a, b) => compare(value(a), value(b)) * (sorting.up ? 1 : -1));
  const body = rows.map((peer) => {
    const tr = element("tr", null, peer.peer === me ? "mine" : "");
    tr.dataset.peer = peer.peer;
    for (const [name, get, shown, numeric] of COLUMNS) {
      const raw = get(peer);
      const text = raw === null || raw === undefined ? "-" : shown ? shown(raw) : raw;
      const cell = element("td", text, numeric ? "num" : name);
      if (name === "state") cell.classList.add(`state-${STATE_ORDER[raw]}`);
      if (name === "peer" || name === "model") cell.title = name === "peer" ? peer.peer : (peer.model || "");
      tr.append(cell);
    }
    return tr;
  });
  table.tBodies[0].replaceChildren(...body);
}

function pointsIn(data) {
  let count = 0;
  for (const ys of data.slice(1)) for (const y of ys) if (y !== null && y !== undefined) count += 1;
  return count;
}

// One uPlot chart in `id`, made again when its series change, else given the new data. With
// `right`, the last series has a scale of its own, on an axis on the right.
function chart(id, title, labels, data, scales, right) {
  const box = document.getElementById(id);
  const key = JSON.stringify([labels, Boolean(right)]);
  let made = charts[id];
  if (!made || made.key !== key) {
    if (made) made.plot.destroy();
    const series = [{}, ...labels.map((label, i) => ({
      label, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true, points: { show: true, size: 4 },
      scale: right && i === labels.length - 1 ? "right" : "y",
    }))];
    const axes = [{}, { scale: "y", size: 60 }];
    if (right) axes.push({ scale: "right", side: 1, size: 60, grid: { show: false } });
    const options = { title, width: 560, height: 240, series, axes, legend: { live: false },
                      scales: { x: { time: true }, ...(scales || {}) } };
    made = charts[id] = { key, plot: new uPlot(options, data, box) };
  } else {
    made.plot.setData(data);
  }
  box.dataset.points = String(pointsIn(data));
}

// The peers the server chose to draw (those that answered first; swarm_history.drawn).
function perNode(state, field) {
  const models = new Map(state.peers.map((p) => [p.peer, p.model || ""]));
  const tables = state.drawn.map((peer) => [state.series[peer].t, state.series[peer][field]]);
  if (!tables.length) return { labels: [], data: [[]] };
  return { labels: state.drawn.map((peer) => `${short(peer)} ${models.get(peer) || ""}`), data: uPlot.join(tables) };
}

function drawCharts(state) {
  const accuracy = perNode(state, "eval_acc");
  chart("chart-accuracy", "held-out accuracy", accuracy.labels, accuracy.data, { y: { range: [0, 1] } });
  const reward = perNode(state, "reward");
  chart("chart-reward", "reward of own completions", reward.labels, reward.data);
  const totals = state.totals;
  chart("chart-peers", "peers: answered / claim training", ["answered (checked)", "training (claimed)"],
        [totals.t, totals.answered, totals.training]);
  chart("chart-flow", "rounds a minute (left), peers' samples trained (right), claimed",
        ["rounds a minute", "peers' samples trained"], [totals.t, totals.rounds_per_min, totals.samples], {}, true);
}

function drawEdges(state) {
  const checked = state.node ? state.node.edges : [];
  const edges = [...checked, ...state.edges.filter((e) => !(state.me && e.to === state.me))];
  const note = document.getElementById("edges-note");
  note.textContent = state.me
    ? "Row: the node that trained; column: whose completions. The row of this page's node is checked (its own "
      + "metrics.jsonl); the others are claims (their heartbeats)."
    : "Row: the node that trained; column: whose completions. Every cell is a claim (the trainer's heartbeat): "
      + "run the page in a node's run dir to see that node's row checked.";
  const names = state.drawn;
  const table = document.getElementById("edges");
  const most = Math.max(1, ...edges.map((e) => e.count));
  const head = element("tr");
  head.append(element("th", "trained \u2193 / on \u2192"));
  for (const name of names) head.append(element("th", short(name)));
  const byPair = new Map(edges.map((e) => [JSON.stringify([e.to, e.from]), e]));
  const rows = names.map((trainer) => {
    const tr = element("tr", null, trainer === state.me ? "mine" : "");
    tr.append(element("th", short(trainer)));
    for (const source of names) {
      const edge = byPair.get(JSON.stringify([trainer, source]));
      const cell = element("td", edge ? edge.count : "", "cell");
      if (edge) {
        cell.style.backgroundColor = `rgba(31, 119, 180, ${(0.15 + 0.85 * edge.count / most).toFixed(2)})`;
        cell.title = edge.checked ? "checked: this node's own count" : "claimed by the trainer";
        cell.dataset.checked = String(edge.checked);
      }
      tr.append(cell);
    }
    return tr;
  });
  table.replaceChildren(head, ...rows);
}

function drawNode(node) {
  const section = document.getElementById("node");
  section.hidden = !node;
  if (!node) return;
  const evals = uPlot.join([[node.t, node.reward], [node.eval_t, node.eval_acc]]);
  chart("chart-node-learning", "this node: reward and held-out accuracy", ["reward", "held-out accuracy"], evals);
  chart("chart-node-samples", "this node: peers' share, weights, filtered",
        ["peers' share of samples", "mean importance weight", "filtered share"],
        [node.t, node.peer_share, node.weight_mean, node.filtered_frac]);
  chart("chart-node-time", "this node: seconds a round", ["round time (s)"], [node.t, node.round_s]);
}

function draw(state) {
  latest = state;
  const training = state.peers.filter((p) => p.state === "training").length;
  const runs = new Set(state.peers.map((p) => p.run)).size;
  document.getElementById("summary").textContent =
    `${state.peers.length} peer(s) seen, ${training} training and answering, in ${runs} run(s); `
    + `read ${new Date(state.time * 1000).toLocaleTimeString()}`;
  const error = document.getElementById("error");
  error.hidden = !state.error;
  error.textContent = state.error || "";
  drawPeers(state.peers, state.me);
  drawCharts(state);
  drawEdges(state);
  drawNode(state.node);
}

async function refresh() {
  try {
    const answer = await fetch("/api/swarm", { cache: "no-store" });
    if (!answer.ok) throw new Error(`the page's server answered ${answer.status}`);
    draw(await answer.json());
  } catch (err) {
    const error = document.getElementById("error");
    error.hidden = false;
    error.textContent = `cannot read the page's server: ${err.message}`;
  }
  setTimeout(refresh, READ_EVERY_MS);
}

refresh();
