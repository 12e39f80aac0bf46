// A workflow's DAG as an SVG graph, layered by dependency depth: a task
// stands one column right of its deepest dependency. Each node is a link
// (keyboard-focusable) that opens the step panel, coloured by status and
// with the status written out, so it reads without colour too.

import { fill, s } from './dom.js';

const NODE_W = 230;
const NODE_H = 54;
const GAP_X = 64;
const GAP_Y = 18;
const PAD = 12;

/**
 * Positions for `tasks` (in plan order) given `edges` (`[from, to]`, `to`
 * depends on `from`): column = longest path from a root, row = order in
 * the column by the mean row of the task's dependencies (fewer crossings),
 * plan order breaking ties.
 */
export function layout(tasks, edges) {
  const order = new Map(tasks.map((t, i) => [t.id, i]));
  const parents = new Map(tasks.map((t) => [t.id, []]));
  for (const [from, to] of edges) {
    if (parents.has(to) && order.has(from)) parents.get(to).push(from);
  }
  const depth = new Map();
  const depthOf = (id, seen = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0; // a cycle cannot be stored; stay safe anyway
    seen.add(id);
    const d = Math.max(-1, ...parents.get(id).map((p) => depthOf(p, seen))) + 1;
    depth.set(id, d);
    return d;
  };
  const columns = [];
  for (const task of tasks) {
    const d = depthOf(task.id);
    (columns[d] ??= []).push(task.id);
  }
  const row = new Map();
  columns.forEach((column, d) => {
    if (d > 0) {
      const mean = (id) => {
        const rows = parents.get(id).map((p) => row.get(p)).filter((r) => r !== undefined);
        return rows.length ? rows.reduce((a, b) => a + b, 0) / rows.length : order.get(id);
      };
      column.sort((a, b) => mean(a) - mean(b) || order.get(a) - order.get(b));
    }
    column.forEach((id, r) => row.set(id, r));
  });
  const tallest = Math.max(1, ...columns.map((c) => c.length));
  const positions = new Map();
  columns.forEach((column, d) => {
    // Shorter columns are centred against the tallest.
    const offset = ((tallest - column.length) * (NODE_H + GAP_Y)) / 2;
    column.forEach((id, r) => {
      positions.set(id, {
        x: PAD + d * (NODE_W + GAP_X),
        y: PAD + offset + r * (NODE_H + GAP_Y),
      });
    });
  });
  return {
    positions,
    width: PAD * 2 + columns.length * NODE_W + Math.max(0, columns.length - 1) * GAP_X,
    height: PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y,
  };
}

function shorten(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function statusLine(task) {
  const status = task.status.replace('_', ' ');
  return task.attempts > 0 ? `${status} · attempt ${task.attempts}/${task.max_attempts}` : status;
}

/**
 * Draws the graph into `container`. `hrefFor(task)` is each node's link.
 * Returns `setTask(task)` / `setStatus(id, status)` to change nodes in
 * place (focus and scroll stay), and `select(id)`.
 */
export function renderDag(container, view, { hrefFor, selected }) {
  const { positions, width, height } = layout(view.tasks, view.edges);
  const nodes = new Map();
  const svg = s('svg', {
    class: 'dag',
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: 'group',
    'aria-label': 'Workflow graph: one link per step, in dependency order',
  });
  svg.append(
    s('defs', {},
      s('marker', {
        id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5,
        markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse',
      }, s('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrowhead' }))),
  );
  for (const [from, to] of view.edges) {
    const a = positions.get(from);
    const b = positions.get(to);
    if (!a || !b) continue;
    const x1 = a.x + NODE_W;
    const y1 = a.y + NODE_H / 2;
    const x2 = b.x;
    const y2 = b.y + NODE_H / 2;
    const bend = Math.max(24, (x2 - x1) / 2);
    svg.append(s('path', {
      class: 'edge',
      d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`,
      'marker-end': 'url(#arrow)',
    }));
  }
  for (const task of view.tasks) {
    const p = positions.get(task.id);
    const title = s('title', { text: task.name });
    const label = s('text', { class: 'status-label', x: 12, y: 40 });
    const node = s('a', {
      class: 'node',
      href: hrefFor(task),
      transform: `translate(${p.x} ${p.y})`,
      dataset: { taskId: task.id, status: task.status },
    },
    title,
    s('rect', { width: NODE_W, height: NODE_H, rx: 8 }),
    s('text', { class: 'name', x: 12, y: 21, text: shorten(task.name, 30) }),
    label);
    nodes.set(task.id, { node, label });
    svg.append(node);
    setTask(task);
  }
  fill(container, svg);

  function setTask(task) {
    const entry = nodes.get(task.id);
    if (!entry) return;
    entry.node.dataset.status = task.status;
    entry.node.setAttribute('aria-label', `${task.name}: ${statusLine(task)}`);
    entry.label.textContent = statusLine(task);
  }

  function setStatus(id, status) {
    const entry = nodes.get(id);
    if (!entry || entry.node.dataset.status === status) return;
    entry.node.dataset.status = status;
    const attempt = entry.label.textContent.split(' · ')[1];
    entry.label.textContent = [status.replace('_', ' '), attempt].filter(Boolean).join(' · ');
  }

  function select(id) {
    for (const [taskId, { node }] of nodes) {
      if (taskId === id) node.setAttribute('aria-current', 'true');
      else node.removeAttribute('aria-current');
    }
  }
  select(selected);

  return { setTask, setStatus, select, has: (id) => nodes.has(id) };
}

/** Whether two views have the same graph (same tasks, same edges). */
export function sameShape(a, b) {
  if (!a || !b || a.tasks.length !== b.tasks.length || a.edges.length !== b.edges.length) return false;
  return a.tasks.every((t, i) => t.id === b.tasks[i].id)
    && a.edges.every((e, i) => e[0] === b.edges[i][0] && e[1] === b.edges[i][1]);
}
