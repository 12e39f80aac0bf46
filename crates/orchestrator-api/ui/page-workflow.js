// One workflow: its DAG, the timeline of every attempt, the selected
// step's panel (input, output, attempts, streaming log) and the actions
// the role allows. Events patch node statuses at once; the full state is
// then re-read over REST (coalesced), which also fills in what events do
// not carry (attempt history, times, outputs).

import { api } from './api.js';
import { renderDag, sameShape } from './dag.js';
import { TERMINAL_TASK, TERMINAL_WORKFLOW, badge, coalesce, fill, formatDuration, h, json, tableWrap, time } from './dom.js';
import { renderGantt } from './gantt.js';
import { compareWith } from './page-compare.js';

/** The most of a log the page shows; the rest is one link away. */
const LOG_CAP = 2 * 1024 * 1024;
/**
 * From this many steps a workflow is big: its timeline waits behind a
 * disclosure until asked for, and the full re-read after events comes at
 * most every BIG_REREAD_MS (events still change the graph at once).
 */
const BIG = 200;
const BIG_REREAD_MS = 2000;

export function mount(main, ctx) {
  const id = ctx.params.id;
  let selected = ctx.params.task ?? null;
  let view = null;
  let dag = null;
  let panel = null;
  let generation = 0;
  const hrefFor = (task) => `#/workflows/${id}?task=${task.id}`;

  const title = h('h1', { text: 'Workflow' });
  const status = h('span', { class: 'head-status' });
  const facts = h('p', { class: 'facts' });
  const actions = h('div', { class: 'actions', role: 'group', 'aria-label': 'Workflow actions' });
  // "Compare with…" another run of the same template (page-compare.js).
  const compareBox = h('div', { class: 'compare-with-box' });
  const halt = h('p', { class: 'notice', hidden: true });
  const graph = h('div', { class: 'dag-wrap', id: 'dag' });
  const timeline = h('div', { class: 'gantt-wrap', id: 'timeline' });
  // A big workflow's timeline is drawn once asked for (a row per step).
  const timelineSummary = h('summary', { text: 'Show the timeline' });
  const timelineFold = h('details', { class: 'timeline-fold' }, timelineSummary);
  const timelineBox = h('div', {}, timeline);
  const big = () => view && view.tasks.length >= BIG;
  const drawTimeline = () => {
    if (!big() || timelineFold.open) renderGantt(timeline, view, { hrefFor });
  };
  timelineFold.addEventListener('toggle', () => {
    if (timelineFold.open) drawTimeline();
  });
  const panelBox = h('section', { class: 'step-panel', id: 'step', 'aria-labelledby': 'step-title' });

  fill(main,
    h('p', { class: 'crumbs' }, h('a', { href: '#/workflows', text: '← Workflows' })),
    h('div', { class: 'page-head' }, h('div', {}, title, status), h('div', { class: 'actions' }, actions, compareBox)),
    facts, halt,
    h('section', { 'aria-labelledby': 'graph-title' }, h('h2', { id: 'graph-title', text: 'Graph' }), graph),
    h('section', { 'aria-labelledby': 'timeline-title' },
      h('h2', { id: 'timeline-title', text: 'Timeline' }),
      h('p', { class: 'hint', text: 'One bar per attempt; retries show as several bars.' }),
      timelineBox),
    panelBox,
  );

  function renderHead() {
    const w = view;
    ctx.setTitle(w.name);
    title.textContent = w.name;
    fill(status, badge(w.status));
    status.dataset.status = w.status;
    fill(facts,
      `template ${w.kind}${w.template_version ? ` v${w.template_version}` : ''}`,
      w.reference ? ` · ref ${w.reference} rev ${w.revision}` : '',
      w.check_mode ? ' · check mode' : '',
      ` · priority ${w.priority} · created `, time(w.created_at),
      w.submitted_by ? ` by ${w.submitted_by}` : '',
      w.started_at ? [' · started ', time(w.started_at)] : '',
      w.finished_at ? [' · finished ', time(w.finished_at)] : '',
    );
    halt.hidden = !w.halt && !w.cancel_requested;
    halt.textContent = w.halt ? `Stopped: ${w.halt.reason}` : w.cancel_requested ? 'Cancel requested.' : '';
    const buttons = [];
    if (ctx.can('operator')) {
      if (!TERMINAL_WORKFLOW.has(w.status) && !w.cancel_requested) {
        buttons.push(actionButton('Cancel workflow', 'cancel-workflow', `/workflows/${id}/cancel`, 'Cancel requested', 'danger'));
      }
      const retryable = w.status === 'failed' || w.status === 'cancelled'
        || (w.status === 'completed' && w.tasks.some((t) => t.step?.always_run));
      if (retryable) {
        buttons.push(actionButton('Retry workflow', 'retry-workflow', `/workflows/${id}/retry`, 'Retry started'));
      }
    }
    fill(actions, ...buttons);
    if (!compareBox.firstChild) fill(compareBox, compareWith(w));
  }

  function actionButton(label, name, path, done, style = 'primary') {
    const button = h('button', { type: 'button', class: style, dataset: { action: name }, text: label });
    button.addEventListener('click', async () => {
      button.disabled = true;
      try {
        await api(path, { method: 'POST' });
        ctx.toast(done);
      } catch (e) {
        ctx.toast(e.message, 'error');
      } finally {
        button.disabled = false;
        refresh();
      }
    });
    return button;
  }

  // A finished workflow can be re-run from one of its steps: a new
  // revision in which the steps before it keep their outputs.
  function rerunButton(task) {
    const from = task.step?.ref_name;
    if (!ctx.can('operator') || !from || task.step?.rollback_of || !TERMINAL_WORKFLOW.has(view.status)) return '';
    const button = h('button', { type: 'button', class: 'primary', dataset: { action: 'rerun-from' }, text: 'Re-run from here' });
    button.addEventListener('click', async () => {
      button.disabled = true;
      try {
        const answer = await api(`/workflows/${id}/rerun`, { method: 'POST', body: { from } });
        ctx.toast(`Revision ${answer.revision} re-runs from ${from}`);
        ctx.navigate(`#/workflows/${answer.id}`);
      } catch (e) {
        ctx.toast(e.message, 'error');
        button.disabled = false;
      }
    });
    return button;
  }

  function renderPanel() {
    const task = view.tasks.find((t) => t.id === selected);
    if (!task) {
      if (panel) panel.stop();
      panel = null;
      fill(panelBox,
        h('h2', { id: 'step-title', text: 'Step' }),
        h('p', { class: 'hint', text: 'Choose a step in the graph or the timeline to see its input, output, attempts and log.' }),
      );
      return;
    }
    if (!panel || panel.taskId !== task.id) {
      if (panel) panel.stop();
      panel = stepPanel(task, panelBox, ctx, actionButton, rerunButton);
    }
    panel.show(task);
  }

  // One re-read at a time: a second one asked for meanwhile runs after it
  // (two reads of a thousand steps at once only slow each other down).
  let reading = false;
  let readAgain = false;
  // When an event last changed each task: a re-read that began before it
  // does not undo what the event showed (the next re-read brings it).
  const eventAt = new Map();

  async function refresh() {
    if (reading) {
      readAgain = true;
      return;
    }
    reading = true;
    try {
      await read();
    } finally {
      reading = false;
      if (readAgain) {
        readAgain = false;
        soon();
      }
    }
  }

  async function read() {
    const mine = ++generation;
    const started = performance.now();
    let answer;
    try {
      answer = await api(`/workflows/${id}`);
    } catch (e) {
      if (mine === generation) {
        if (e.status === 404 || e.status === 400) {
          fill(main, h('h1', { text: 'No such workflow' }), h('p', { text: e.message }),
            h('p', {}, h('a', { href: '#/workflows', text: 'Back to the list' })));
        } else {
          ctx.toast(e.message, 'error');
        }
      }
      return;
    }
    if (mine !== generation) return;
    const old = view;
    view = answer;
    renderHead();
    if (!dag || !sameShape(old, view)) {
      dag = renderDag(graph, view, { hrefFor, selected, keep: dag?.state() });
    } else {
      for (const task of view.tasks) {
        if (!(eventAt.get(task.id) > started)) dag.setTask(task);
      }
    }
    if (big() && !timelineFold.contains(timeline)) {
      timelineSummary.textContent = `Show the timeline of ${view.tasks.length.toLocaleString()} steps`;
      timelineFold.append(timeline);
      timelineBox.replaceChildren(timelineFold);
    }
    drawTimeline();
    renderPanel();
    main.dataset.loaded = 'true';
  }
  const soonSmall = coalesce(refresh, 250);
  const soonBig = coalesce(refresh, BIG_REREAD_MS);
  const soon = () => (big() ? soonBig() : soonSmall());
  soon.cancel = () => {
    soonSmall.cancel();
    soonBig.cancel();
  };

  // Running attempts grow on the timeline between refreshes.
  const ticker = setInterval(() => {
    if (view && view.tasks.some((t) => t.status === 'running')) drawTimeline();
  }, 1000);

  refresh();
  ctx.live.watch({ workflow: id }, {
    change(event) {
      if (event.workflow_id !== id) return;
      if (event.kind === 'log_appended') {
        if (panel && event.task_id === panel.taskId) panel.pullLog();
        return;
      }
      // Show the new status now; the re-read below brings the rest.
      if (event.task_id && event.status && dag) {
        eventAt.set(event.task_id, performance.now());
        dag.setStatus(event.task_id, event.status);
      }
      if (!event.task_id && event.status) {
        fill(status, badge(event.status));
        status.dataset.status = event.status;
      }
      soon();
    },
    refresh: soon,
  });

  return {
    update(params) {
      if (params.id !== id) return false; // another workflow: mount anew
      selected = params.task ?? null;
      dag?.select(selected);
      if (view) renderPanel();
      if (selected) panelBox.scrollIntoView({ block: 'nearest' });
      return true;
    },
    unmount() {
      clearInterval(ticker);
      soon.cancel();
      panel?.stop();
    },
  };
}

/** The panel of one step, kept while the step stays selected. */
function stepPanel(task, box, ctx, actionButton, rerunButton) {
  const heading = h('h2', { id: 'step-title', text: task.name });
  const state = h('span');
  const facts = h('dl', { class: 'facts-grid' });
  const buttons = h('div', { class: 'actions', role: 'group', 'aria-label': 'Step actions' });
  const input = h('pre', { class: 'json', id: 'step-input' });
  const inputNote = h('p', { class: 'hint', hidden: true });
  const output = h('pre', { class: 'json', id: 'step-output' });
  const error = h('pre', { class: 'json error-text', id: 'step-error' });
  const attemptsBody = h('tbody');
  const logPre = h('pre', { class: 'log', id: 'step-log', tabindex: 0, role: 'region', 'aria-label': `Log of ${task.name}` });
  const logNote = h('p', { class: 'hint', id: 'step-log-note' });
  fill(box,
    h('div', { class: 'page-head' }, h('div', {}, heading, state), buttons),
    facts,
    h('div', { class: 'two-cols' },
      h('div', {}, h('h3', { text: 'Input' }), inputNote, input),
      h('div', {}, h('h3', { text: 'Output' }), output)),
    h('h3', { text: 'Error' }), error,
    h('h3', { text: 'Attempts' }),
    tableWrap(h('table', { class: 'list', id: 'step-attempts' },
      h('thead', {}, h('tr', {}, ['#', 'Node', 'Started', 'Ended', 'Took', 'Outcome', 'Error']
        .map((c) => h('th', { scope: 'col', text: c })))),
      attemptsBody)),
    h('h3', { text: 'Log' }), logPre, logNote,
  );
  box.dataset.taskId = task.id;

  // The log: read from where the last read stopped, until caught up.
  const decoder = new TextDecoder();
  let offset = 0;
  let busy = false;
  let again = false;
  let stopped = false;
  let terminal = false;
  async function pullLog() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      while (!stopped && offset < LOG_CAP) {
        const response = await api(`/tasks/${task.id}/logs?offset=${offset}&limit_bytes=262144`, { raw: true });
        const bytes = new Uint8Array(await response.arrayBuffer());
        const next = Number(response.headers.get('x-next-offset'));
        terminal = TERMINAL_TASK.has(response.headers.get('x-task-status'));
        if (stopped) return;
        if (bytes.length > 0) {
          const atBottom = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 8;
          logPre.append(decoder.decode(bytes, { stream: true }));
          if (atBottom) logPre.scrollTop = logPre.scrollHeight;
        }
        if (!Number.isFinite(next) || next <= offset) break;
        offset = next;
      }
      logPre.dataset.bytes = String(offset);
      fill(logNote, offset >= LOG_CAP
        ? ['The log is longer than the page shows; ',
          h('a', { href: `/tasks/${task.id}/logs`, text: 'open it whole' }), '.']
        : terminal ? 'The log is complete.' : 'The log grows while the step runs.');
    } catch (e) {
      if (!stopped) logNote.textContent = `Cannot read the log: ${e.message}`;
    } finally {
      busy = false;
      if (again && !stopped) {
        again = false;
        pullLog();
      }
    }
  }

  function show(t) {
    fill(state, badge(t.status));
    state.dataset.status = t.status;
    const fact = (name, value) => [h('dt', { text: name }), h('dd', {}, value)];
    fill(facts,
      fact('Script', t.script),
      fact('Attempts', `${t.attempts} of ${t.max_attempts}`),
      fact('Node', t.node ?? '—'),
      fact('Started', time(t.started_at)),
      fact('Finished', time(t.finished_at)),
      fact('Exit code', t.exit_code ?? '—'),
      t.retry_at ? fact('Next attempt', time(t.retry_at)) : null,
      t.cancel_requested ? fact('Cancel', 'requested') : null,
      t.kept_from ? fact('Kept from', 'the previous revision (it did not run in this one)') : null,
    );
    const cancellable = !TERMINAL_TASK.has(t.status) && !t.cancel_requested;
    fill(buttons, ctx.can('operator') && cancellable
      ? actionButton('Cancel step', 'cancel-task', `/tasks/${t.id}/cancel`, 'Cancel requested', 'danger')
      : '', rerunButton(t));
    // The stored input keeps `${secrets.x}` as written; values never reach it.
    const unresolved = t.input === null && t.step?.input_template;
    inputNote.hidden = !unresolved;
    inputNote.textContent = unresolved ? 'Not resolved yet: the references are filled in when the step is released.' : '';
    input.textContent = json(unresolved ? t.step.input_template : t.input);
    output.textContent = json(t.output);
    error.textContent = t.error ?? '—';
    const rows = (t.history ?? []).map((r) => h('tr', { dataset: { attempt: r.attempt, outcome: r.outcome } },
      h('td', { class: 'num', text: r.attempt }),
      h('td', { text: r.node ?? '—' }),
      h('td', {}, time(r.started_at)),
      h('td', {}, time(r.ended_at)),
      h('td', { text: r.started_at ? formatDuration(Date.parse(r.ended_at) - Date.parse(r.started_at)) : '—' }),
      h('td', {}, badge(r.outcome)),
      h('td', { class: 'wrap', text: r.error ?? '' })));
    if (t.status === 'running') {
      rows.push(h('tr', { dataset: { attempt: t.attempts, outcome: 'running' } },
        h('td', { class: 'num', text: t.attempts }), h('td', { text: t.node ?? '—' }),
        h('td', {}, time(t.started_at)), h('td', { text: '—' }), h('td', { text: '—' }),
        h('td', {}, badge('running')), h('td')));
    }
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 7, class: 'empty', text: 'No attempt yet.' })));
    fill(attemptsBody, ...rows);
    pullLog();
  }

  return {
    taskId: task.id,
    show,
    pullLog,
    stop() {
      stopped = true;
    },
  };
}
