// The timeline: one row per step, one bar per attempt, from the tasks'
// `history` (every ended attempt: start, end, outcome, node, error) and,
// for a running task, its current attempt from `started_at` to now. A
// retried step shows several bars with the backoff between them.

import { fill, formatDuration, s } from './dom.js';

const LABEL_W = 220;
const ROW_H = 26;
const AXIS_H = 24;
const TICKS = 5;

/** Every attempt of a task as `{attempt, start, end, outcome, node, error, running}`. */
export function attempts(task, now) {
  const bars = (task.history ?? []).map((record) => ({
    attempt: record.attempt,
    start: Date.parse(record.started_at ?? record.ended_at),
    end: Date.parse(record.ended_at),
    outcome: record.outcome,
    node: record.node,
    error: record.error,
    running: false,
  }));
  const ended = new Set(bars.map((b) => b.attempt));
  const running = task.status === 'running';
  if (running && task.started_at && task.attempts > 0 && !ended.has(task.attempts)) {
    // The attempt that runs now: `history` records attempts once ended.
    bars.push({
      attempt: task.attempts,
      start: Date.parse(task.started_at),
      end: now,
      outcome: 'running',
      node: task.node,
      error: null,
      running: true,
    });
  }
  return bars.filter((b) => Number.isFinite(b.start) && Number.isFinite(b.end));
}

/** Draws the timeline of `view` into `container`. */
export function renderGantt(container, view, { hrefFor, now = Date.now() }) {
  const rows = view.tasks.map((task) => ({ task, bars: attempts(task, now) }));
  const starts = rows.flatMap((r) => r.bars.map((b) => b.start));
  const ends = rows.flatMap((r) => r.bars.map((b) => b.end));
  if (starts.length === 0) {
    fill(container, s('svg', { class: 'gantt', width: 1, height: 1, 'aria-hidden': 'true' }));
    container.dataset.empty = 'true';
    return;
  }
  delete container.dataset.empty;
  const t0 = Math.min(...starts);
  const t1 = Math.max(t0 + 1000, ...ends);
  const width = Math.max(640, container.clientWidth - 4);
  const chart = width - LABEL_W - 16;
  const x = (t) => LABEL_W + ((t - t0) / (t1 - t0)) * chart;
  const height = AXIS_H + rows.length * ROW_H + 4;

  const svg = s('svg', {
    class: 'gantt',
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    // A group, not an image: its row labels are links to each step, and
    // an image may hold nothing focusable.
    role: 'group',
    'aria-label': `Timeline of ${rows.reduce((n, r) => n + r.bars.length, 0)} attempts`,
  });
  for (let i = 0; i <= TICKS; i += 1) {
    const t = t0 + ((t1 - t0) * i) / TICKS;
    const tx = x(t);
    svg.append(
      s('line', { class: 'tick', x1: tx, x2: tx, y1: AXIS_H - 4, y2: height }),
      s('text', {
        class: 'tick-label', x: tx, y: 14,
        'text-anchor': i === 0 ? 'start' : i === TICKS ? 'end' : 'middle',
        text: `+${formatDuration(t - t0)}`,
      }),
    );
  }
  rows.forEach(({ task, bars }, i) => {
    const y = AXIS_H + i * ROW_H;
    svg.append(
      s('a', { href: hrefFor(task), class: 'row-label' },
        s('text', { x: 4, y: y + ROW_H / 2 + 4, text: task.name.length > 30 ? `${task.name.slice(0, 29)}…` : task.name })),
    );
    for (const bar of bars) {
      const bx = x(bar.start);
      const bw = Math.max(3, x(bar.end) - bx);
      const lines = [
        `${task.name}, attempt ${bar.attempt}${bar.node ? ` on ${bar.node}` : ''}`,
        `${bar.running ? 'running for' : bar.outcome.replace('_', ' ') + ' after'} ${formatDuration(bar.end - bar.start)}`,
        bar.error ?? '',
      ];
      svg.append(s('g', {
        class: 'bar',
        dataset: { taskId: task.id, attempt: bar.attempt, outcome: bar.running ? 'running' : bar.outcome },
      },
      s('title', { text: lines.filter(Boolean).join('\n') }),
      s('rect', { x: bx, y: y + 4, width: bw, height: ROW_H - 8, rx: 3 }),
      bw > 26 ? s('text', { x: bx + 5, y: y + ROW_H / 2 + 4, text: `#${bar.attempt}` }) : null));
    }
  });
  fill(container, svg);
}
