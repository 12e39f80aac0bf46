// A workflow's DAG as an SVG graph, layered by dependency depth: a task
// stands one column right of its deepest dependency. Each node is a link
// (keyboard-focusable) that opens the step panel, coloured by status and
// with the status written out, so it reads without colour too.
//
// Big workflows (a thousand steps) stay quick: the SVG is built once per
// shape (or fold), an event changes one node (or one folded node's
// counts) in place, and one delegated listener of each kind serves every
// node. The view pans (drag, or Tab to a node out of sight) and zooms
// (wheel, the buttons); the `for_each` instances of a step fold into one
// node with their counts by status; a step is found by name.

import { fill, h, s } from './dom.js';

const NODE_W = 230;
const NODE_H = 54;
const GAP_X = 64;
const GAP_Y = 18;
const PAD = 12;
/** A step with at least this many `for_each` instances starts folded. */
export const FOLD_AT = 10;
/** The tallest the view starts (px); a smaller graph gets a smaller view. */
const VIEW_MAX_H = 520;
const VIEW_MIN_H = 160;
const SCALE_MIN = 0.05;
const SCALE_MAX = 3;
const ZOOM_STEP = 1.25;
/** Matches the find box lists; the rest are counted. */
const FIND_LIST = 20;

/** How each status shows in a folded node's counts (a symbol, then its words). */
const SYMBOL = {
  completed: '✓', running: '●', failed: '✗', retry_waiting: '↻', queued: '◔', pending: '○',
  cancelled: '⊘', skipped: '↷', not_started: '–',
};
const STATUS_ORDER = ['completed', 'running', 'retry_waiting', 'queued', 'pending', 'failed', 'cancelled', 'skipped', 'not_started'];

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
    let d = 0;
    for (const p of parents.get(id)) d = Math.max(d, depthOf(p, seen) + 1);
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
      const mean = new Map(column.map((id) => {
        const rows = parents.get(id).map((p) => row.get(p)).filter((r) => r !== undefined);
        return [id, rows.length ? rows.reduce((a, b) => a + b, 0) / rows.length : order.get(id)];
      }));
      column.sort((a, b) => mean.get(a) - mean.get(b) || order.get(a) - order.get(b));
    }
    column.forEach((id, r) => row.set(id, r));
  });
  let tallest = 1;
  for (const column of columns) tallest = Math.max(tallest, column.length);
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

/**
 * A name cut to fit its node: the visible part stays a prefix of the name
 * (what the node is called), the ellipsis is for eyes only.
 */
function shortText(text, max, attrs) {
  if (text.length <= max) return s('text', { ...attrs, text });
  return s('text', attrs, text.slice(0, max - 1), s('tspan', { 'aria-hidden': 'true', text: '…' }));
}

function statusLine(task) {
  const status = task.status.replace('_', ' ');
  return task.attempts > 0 ? `${status} · attempt ${task.attempts}/${task.max_attempts}` : status;
}

/**
 * The `for_each` instances of each step: `key → task ids`, for steps with
 * more than one instance. Rollback steps group apart from what they undo.
 */
export function instanceGroups(tasks) {
  const groups = new Map();
  for (const task of tasks) {
    const step = task.step;
    if (!step?.ref_name || step.each === null || step.each === undefined) continue;
    const key = step.rollback_of ? `${step.ref_name} (rollback)` : step.ref_name;
    (groups.get(key) ?? groups.set(key, []).get(key)).push(task.id);
  }
  for (const [key, ids] of groups) if (ids.length < 2) groups.delete(key);
  return groups;
}

/** A folded node's status: the most telling of its instances'. */
function groupStatus(counts, total) {
  for (const status of ['failed', 'running', 'retry_waiting', 'queued', 'cancelled']) {
    if (counts[status]) return status;
  }
  if ((counts.completed ?? 0) === total) return 'completed';
  if (counts.pending) return counts.completed ? 'running' : 'pending';
  if (counts.completed) return 'completed';
  return counts.skipped ? 'skipped' : 'not_started';
}

function countsText(counts) {
  return STATUS_ORDER.filter((st) => counts[st]).map((st) => `${counts[st]} ${SYMBOL[st]}`).join(' ');
}

function countsWords(counts) {
  return STATUS_ORDER.filter((st) => counts[st]).map((st) => `${counts[st]} ${st.replace('_', ' ')}`).join(', ');
}

/**
 * Draws the graph into `container`. `hrefFor(task)` is each node's link.
 * Returns `setTask(task)` / `setStatus(id, status)` to change nodes in
 * place (focus, pan and zoom stay), `select(id)`, `find(text)`,
 * `focusTask(id)`, `fold(key, folded)`, and `state()` (what a redraw of a
 * new shape keeps: pass it back as `keep`).
 */
export function renderDag(container, view, { hrefFor, selected, keep }) {
  const tasks = new Map(view.tasks.map((t) => [t.id, { ...t }]));
  const groups = instanceGroups(view.tasks);
  const groupOf = new Map();
  for (const [key, ids] of groups) for (const id of ids) groupOf.set(id, key);
  // Which groups are folded: big ones start folded; a redraw keeps choices.
  const folded = new Set();
  for (const [key, ids] of groups) {
    const chosen = keep?.folded?.get(key);
    if (chosen ?? ids.length >= FOLD_AT) folded.add(key);
  }
  let selectedId = selected ?? null;
  let transform = keep?.transform ?? null; // {x, y, k}
  let nodes = new Map(); // task id → {node, label}
  let groupNodes = new Map(); // group key → {node, name, label, counts, total}
  let positions = new Map(); // display id → {x, y}
  let size = { width: 0, height: 0 };
  let found = null;

  // The toolbar: zoom, fit, fold all, find.
  const zoomText = h('span', { class: 'zoom-level', 'aria-live': 'polite', 'aria-atomic': 'true' });
  const tool = (label, name, text) => h('button', { type: 'button', class: 'tool', 'aria-label': label, title: label, dataset: { tool: name }, text });
  const foldAll = groups.size ? tool('Fold all instances of every step', 'fold-all', 'Fold all') : null;
  const unfoldAll = groups.size ? tool('Unfold all instances of every step', 'unfold-all', 'Unfold all') : null;
  const findInput = h('input', {
    type: 'search', id: 'dag-find', autocomplete: 'off', spellcheck: 'false', placeholder: 'step name',
    'aria-controls': 'dag-matches', 'aria-describedby': 'dag-find-count',
  });
  const findCount = h('span', { id: 'dag-find-count', class: 'hint', 'aria-live': 'polite' });
  const matchList = h('ul', { id: 'dag-matches', class: 'dag-matches', 'aria-label': 'Steps found' });
  const findForm = h('form', { class: 'dag-find', role: 'search', 'aria-label': 'Find a step' },
    h('label', { for: 'dag-find', text: 'Find a step' }), findInput, findCount);
  const toolbar = h('div', { class: 'dag-tools' },
    h('div', { class: 'actions', role: 'group', 'aria-label': 'Graph view' },
      tool('Zoom out', 'zoom-out', '−'), zoomText, tool('Zoom in', 'zoom-in', '+'),
      tool('Fit the graph in the view', 'fit', 'Fit'), tool('Zoom to 100%', 'actual', '100%'),
      foldAll, unfoldAll),
    findForm);

  const stage = s('g', { class: 'dag-view' });
  const svg = s('svg', {
    class: 'dag',
    role: 'group',
    'aria-label': `Workflow graph of ${view.tasks.length} steps: one link per step, in dependency order; drag to pan, the wheel zooms`,
  },
  s('defs', {},
    s('marker', {
      id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5,
      markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse',
    }, s('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrowhead' }))),
  stage);
  const viewport = h('div', { class: 'dag-viewport' }, svg);
  fill(container, toolbar, matchList, viewport);
  container.dataset.steps = String(view.tasks.length);

  /** Lays out and draws what is shown now: single tasks and folded groups. */
  function draw() {
    const shown = [];
    const seenGroups = new Set();
    for (const task of view.tasks) {
      const key = groupOf.get(task.id);
      if (key && folded.has(key)) {
        if (!seenGroups.has(key)) {
          seenGroups.add(key);
          shown.push({ id: `group:${key}`, key });
        }
      } else {
        shown.push({ id: task.id, task: tasks.get(task.id) });
      }
    }
    const displayOf = (id) => {
      const key = groupOf.get(id);
      return key && folded.has(key) ? `group:${key}` : id;
    };
    const edges = [];
    const seenEdges = new Set();
    for (const [from, to] of view.edges) {
      const a = displayOf(from);
      const b = displayOf(to);
      const pair = `${a}>${b}`;
      if (a === b || seenEdges.has(pair)) continue;
      seenEdges.add(pair);
      edges.push([a, b]);
    }
    const laid = layout(shown, edges);
    positions = laid.positions;
    size = { width: laid.width, height: laid.height };
    nodes = new Map();
    groupNodes = new Map();
    const parts = [];
    for (const [from, to] of edges) {
      const a = positions.get(from);
      const b = positions.get(to);
      if (!a || !b) continue;
      const x1 = a.x + NODE_W;
      const y1 = a.y + NODE_H / 2;
      const x2 = b.x;
      const y2 = b.y + NODE_H / 2;
      const bend = Math.max(24, (x2 - x1) / 2);
      parts.push(s('path', {
        class: 'edge',
        d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`,
        'marker-end': 'url(#arrow)',
      }));
    }
    for (const item of shown) {
      const p = positions.get(item.id);
      parts.push(item.key ? groupNode(item.key, p) : taskNode(item.task, p));
    }
    fill(stage, parts);
    if (selectedId) select(selectedId);
    if (found) markFound(found.ids);
  }

  function taskNode(task, p) {
    // Named by its <title> (the whole name), described by its status.
    const label = s('text', { class: 'status-label', x: 12, y: 40 });
    const desc = s('desc');
    const node = s('a', {
      class: 'node',
      href: hrefFor(task),
      transform: `translate(${p.x} ${p.y})`,
      dataset: { taskId: task.id, status: task.status },
    },
    s('title', { text: task.name }),
    desc,
    s('rect', { width: NODE_W, height: NODE_H, rx: 8 }),
    shortText(task.name, 30, { class: 'name', x: 12, y: 21 }),
    label);
    nodes.set(task.id, { node, label, desc });
    paint(task);
    return node;
  }

  function groupNode(key, p) {
    const ids = groups.get(key);
    const counts = {};
    for (const id of ids) {
      const st = tasks.get(id).status;
      counts[st] = (counts[st] ?? 0) + 1;
    }
    const name = shortText(`${key} ×${ids.length}`, 26, { class: 'name', x: 12, y: 21 });
    const label = s('text', { class: 'status-label', x: 12, y: 40 });
    const desc = s('desc');
    const node = s('g', {
      class: 'node group',
      role: 'button',
      tabindex: 0,
      'aria-expanded': 'false',
      transform: `translate(${p.x} ${p.y})`,
      dataset: { group: key, instances: ids.length },
    },
    s('title', { text: `${key} ×${ids.length}, folded` }),
    desc,
    s('rect', { class: 'stack', x: 6, y: -6, width: NODE_W, height: NODE_H, rx: 8 }),
    s('rect', { width: NODE_W, height: NODE_H, rx: 8 }),
    name, label,
    s('text', { class: 'unfold', x: NODE_W - 12, y: 21, 'text-anchor': 'end', 'aria-hidden': 'true', text: '⊞' }));
    const entry = { node, label, desc, counts, total: ids.length, key };
    groupNodes.set(key, entry);
    paintGroup(entry);
    return node;
  }

  function paint(task) {
    const entry = nodes.get(task.id);
    if (!entry) return;
    entry.node.dataset.status = task.status;
    entry.desc.textContent = statusLine(task);
    entry.label.textContent = statusLine(task);
  }

  function paintGroup(entry) {
    const status = groupStatus(entry.counts, entry.total);
    entry.node.dataset.status = status;
    entry.node.dataset.counts = STATUS_ORDER.filter((st) => entry.counts[st]).map((st) => `${st}:${entry.counts[st]}`).join(' ');
    entry.label.textContent = countsText(entry.counts);
    entry.desc.textContent = `${countsWords(entry.counts)}. Activate to unfold.`;
  }

  /** A task changed status: its node, or its folded node's counts. */
  function changed(task, before) {
    const key = groupOf.get(task.id);
    const entry = key && groupNodes.get(key);
    if (entry) {
      if (before === task.status) return;
      entry.counts[before] -= 1;
      if (!entry.counts[before]) delete entry.counts[before];
      entry.counts[task.status] = (entry.counts[task.status] ?? 0) + 1;
      paintGroup(entry);
    } else {
      paint(task);
    }
  }

  function setTask(fresh) {
    const task = tasks.get(fresh.id);
    if (!task) return;
    if (task.status === fresh.status && task.attempts === fresh.attempts && task.max_attempts === fresh.max_attempts) return;
    const before = task.status;
    Object.assign(task, fresh);
    changed(task, before);
  }

  function setStatus(id, status) {
    const task = tasks.get(id);
    if (!task || task.status === status) return;
    const before = task.status;
    task.status = status;
    changed(task, before);
  }

  function select(id) {
    stage.querySelector('.node[aria-current]')?.removeAttribute('aria-current');
    selectedId = id;
    // A folded instance marks its folded node.
    const node = nodes.get(id)?.node ?? groupNodes.get(groupOf.get(id))?.node;
    node?.setAttribute('aria-current', 'true');
  }

  // Pan and zoom: one transform on the stage.
  function viewSize() {
    return { w: viewport.clientWidth || 800, h: viewport.clientHeight || VIEW_MAX_H };
  }

  function apply() {
    const { x, y, k } = transform;
    stage.setAttribute('transform', `translate(${x.toFixed(1)} ${y.toFixed(1)}) scale(${k.toFixed(4)})`);
    svg.dataset.scale = k.toFixed(4);
    svg.dataset.x = x.toFixed(1);
    svg.dataset.y = y.toFixed(1);
    zoomText.textContent = `${Math.round(k * 100)}%`;
  }

  function zoomAt(factor, cx, cy) {
    const k = Math.min(SCALE_MAX, Math.max(SCALE_MIN, transform.k * factor));
    const f = k / transform.k;
    transform = { x: cx - (cx - transform.x) * f, y: cy - (cy - transform.y) * f, k };
    apply();
  }

  function fit() {
    const { w, h: vh } = viewSize();
    const k = Math.min(SCALE_MAX, Math.max(SCALE_MIN, Math.min(w / size.width, vh / size.height, 1)));
    transform = { x: (w - size.width * k) / 2, y: Math.max(0, (vh - size.height * k) / 2), k };
    apply();
  }

  /** Moves the view so that `id`'s node (or its folded node) is in the middle. */
  function centre(displayId) {
    const p = positions.get(displayId);
    if (!p) return;
    const { w, h: vh } = viewSize();
    const k = Math.max(transform.k, 0.6);
    transform = { x: w / 2 - (p.x + NODE_W / 2) * k, y: vh / 2 - (p.y + NODE_H / 2) * k, k };
    apply();
  }

  function sizeView() {
    // A small graph gets a view its size; a big one a fixed window on it.
    viewport.style.height = `${Math.max(VIEW_MIN_H, Math.min(VIEW_MAX_H, size.height + 16))}px`;
  }

  function fold(key, yes) {
    if (!groups.has(key) || folded.has(key) === yes) return;
    if (yes) folded.add(key);
    else folded.delete(key);
    draw();
  }

  // Finding a step by name (or its step's ref_name).
  function search(text) {
    const needle = text.trim().toLowerCase();
    if (!needle) return [];
    const ids = [];
    for (const task of view.tasks) {
      if (task.name.toLowerCase().includes(needle) || task.step?.ref_name?.toLowerCase() === needle) ids.push(task.id);
    }
    return ids;
  }

  function markFound(ids) {
    for (const el of stage.querySelectorAll('.node.match')) el.classList.remove('match');
    for (const id of ids) {
      const key = groupOf.get(id);
      const el = key && folded.has(key) ? groupNodes.get(key)?.node : nodes.get(id)?.node;
      el?.classList.add('match');
    }
  }

  function find(text) {
    const ids = search(text);
    found = { text, ids };
    markFound(ids);
    findCount.textContent = text.trim() ? `${ids.length} step${ids.length === 1 ? '' : 's'} found` : '';
    fill(matchList, ids.slice(0, FIND_LIST).map((id) => {
      const task = tasks.get(id);
      return h('li', {}, h('button', { type: 'button', class: 'link', dataset: { findTask: id }, text: task.name }));
    }), ids.length > FIND_LIST ? h('li', { class: 'hint', text: `and ${ids.length - FIND_LIST} more: type more of the name` }) : null);
    return ids;
  }

  /** Shows a task: unfolds its step if need be, centres it, focuses it. */
  function focusTask(id) {
    if (!tasks.has(id)) return;
    const key = groupOf.get(id);
    if (key && folded.has(key)) fold(key, false);
    centre(id);
    const node = nodes.get(id)?.node;
    node?.classList.add('match');
    node?.focus({ preventScroll: true });
  }

  // One listener of each kind for the whole graph.
  toolbar.addEventListener('click', (e) => {
    const name = e.target.closest('button[data-tool]')?.dataset.tool;
    if (!name) return;
    const { w, h: vh } = viewSize();
    if (name === 'zoom-in') zoomAt(ZOOM_STEP, w / 2, vh / 2);
    else if (name === 'zoom-out') zoomAt(1 / ZOOM_STEP, w / 2, vh / 2);
    else if (name === 'fit') fit();
    else if (name === 'actual') zoomAt(1 / transform.k, w / 2, vh / 2);
    else if (name === 'fold-all' || name === 'unfold-all') {
      for (const key of groups.keys()) {
        if (name === 'fold-all') folded.add(key);
        else folded.delete(key);
      }
      draw();
    }
  });
  findForm.addEventListener('submit', (e) => {
    e.preventDefault();
    const ids = find(findInput.value);
    if (ids.length) focusTask(ids[0]);
  });
  let findTimer = null;
  findInput.addEventListener('input', () => {
    clearTimeout(findTimer);
    findTimer = setTimeout(() => find(findInput.value), 150);
  });
  matchList.addEventListener('click', (e) => {
    const id = e.target.closest('button[data-find-task]')?.dataset.findTask;
    if (id) focusTask(id);
  });
  const toggleGroup = (el) => {
    const key = el.dataset.group;
    fold(key, false);
    // The first instance takes the focus, so the keyboard stays in place.
    const first = groups.get(key)?.[0];
    if (first) {
      centre(first);
      nodes.get(first)?.node.focus({ preventScroll: true });
    }
  };
  let dragged = false;
  svg.addEventListener('click', (e) => {
    if (dragged) {
      // The end of a drag is not a click on what it ended over.
      e.preventDefault();
      e.stopPropagation();
      return;
    }
    const group = e.target.closest('.node.group');
    if (group) toggleGroup(group);
  }, true);
  svg.addEventListener('keydown', (e) => {
    const group = e.target.closest?.('.node.group');
    if (group && (e.key === 'Enter' || e.key === ' ')) {
      e.preventDefault();
      toggleGroup(group);
    }
  });
  // A node reached with Tab comes into sight.
  svg.addEventListener('focusin', (e) => {
    const node = e.target.closest?.('.node');
    if (!node) return;
    const box = node.getBoundingClientRect();
    const frame = viewport.getBoundingClientRect();
    if (box.left < frame.left || box.right > frame.right || box.top < frame.top || box.bottom > frame.bottom) {
      centre(node.dataset.taskId ?? `group:${node.dataset.group}`);
    }
  });
  viewport.addEventListener('wheel', (e) => {
    e.preventDefault();
    const frame = viewport.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? ZOOM_STEP : 1 / ZOOM_STEP, e.clientX - frame.left, e.clientY - frame.top);
  }, { passive: false });
  let drag = null;
  viewport.addEventListener('pointerdown', (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, from: { ...transform }, id: e.pointerId };
    dragged = false;
  });
  viewport.addEventListener('pointermove', (e) => {
    if (!drag || e.pointerId !== drag.id) return;
    const dx = e.clientX - drag.x;
    const dy = e.clientY - drag.y;
    if (!dragged && Math.hypot(dx, dy) < 4) return;
    if (!dragged) {
      dragged = true;
      viewport.setPointerCapture(e.pointerId);
      viewport.classList.add('panning');
    }
    transform = { ...drag.from, x: drag.from.x + dx, y: drag.from.y + dy };
    apply();
  });
  const endDrag = () => {
    drag = null;
    viewport.classList.remove('panning');
    // The click that follows a drag's release is swallowed, then clicks work again.
    setTimeout(() => { dragged = false; }, 0);
  };
  viewport.addEventListener('pointerup', endDrag);
  viewport.addEventListener('pointercancel', endDrag);

  draw();
  sizeView();
  if (transform) apply();
  else if (size.width <= viewSize().w && size.height <= viewSize().h) {
    transform = { x: 0, y: 0, k: 1 };
    apply();
  } else {
    fit();
  }

  return {
    setTask,
    setStatus,
    select,
    find,
    focusTask,
    fold,
    has: (id) => tasks.has(id),
    state: () => ({ transform, folded: new Map([...groups.keys()].map((key) => [key, folded.has(key)])) }),
  };
}

/** Whether two views have the same graph (same tasks, same edges). */
export function sameShape(a, b) {
  if (!a || !b || a.tasks.length !== b.tasks.length || a.edges.length !== b.edges.length) return false;
  return a.tasks.every((t, i) => t.id === b.tasks[i].id)
    && a.edges.every((e, i) => e[0] === b.edges[i][0] && e[1] === b.edges[i][1]);
}
