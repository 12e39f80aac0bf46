// Two runs side by side (`#/compare?a=ID&b=ID`): the service's comparison
// (`GET /workflows/{a}/compare/{b}`, the same answer as `orchestrator
// workflow diff`) shown as tables of inputs and steps, each difference
// marked in words and with a sign (≠, "only in A") as well as a colour.
// A step's row opens to its script hashes, changed outputs and the first
// line where the two logs part. Also `compareWith(workflow)`, the
// "Compare with…" control of the workflow page.

import { api, query } from './api.js';
import { TERMINAL_WORKFLOW, badge, coalesce, fill, formatDuration, h, tableWrap, time } from './dom.js';

const CHANGE_TEXT = { same: 'same', changed: 'differs', only_a: 'only in A', only_b: 'only in B' };
const CHANGE_SIGN = { same: '=', changed: '≠', only_a: 'A', only_b: 'B' };
// What ends or changes a run: the comparison is read again then.
const KINDS = ['workflow_status_changed', 'completed', 'failed', 'cancelled', 'reset'];

export function mount(main, ctx) {
  let params = ctx.params;
  let answer = null;
  let generation = 0;
  const open = new Set(); // step keys whose details are shown

  const heading = h('h1', { text: 'Compare two runs' });
  const chooser = h('form', { class: 'filters compare-choose', 'aria-label': 'Runs to compare' });
  const summary = h('p', { class: 'compare-summary', id: 'compare-summary', 'aria-live': 'polite' });
  const body = h('div', { id: 'compare' });
  fill(main, h('p', { class: 'crumbs' }, h('a', { href: '#/workflows', text: '← Workflows' })),
    heading, chooser, summary, body);

  const field = (name, label) => {
    const input = h('input', { id: `compare-${name}`, name, type: 'text', autocomplete: 'off', spellcheck: 'false', size: 38 });
    return [h('label', { for: `compare-${name}`, text: label }), input];
  };
  const [labelA, inputA] = field('a', 'Run A');
  const [labelB, inputB] = field('b', 'Run B');
  fill(chooser, labelA, inputA, labelB, inputB, h('button', { type: 'submit', class: 'secondary', text: 'Compare' }));
  chooser.addEventListener('submit', (e) => {
    e.preventDefault();
    go({ a: inputA.value.trim(), b: inputB.value.trim() });
  });

  function go(next) {
    ctx.navigate(`#/compare${query({ a: next.a, b: next.b, only: next.only ? 1 : '' })}`);
  }

  async function refresh() {
    const mine = ++generation;
    inputA.value = params.a ?? '';
    inputB.value = params.b ?? '';
    if (!params.a || !params.b) {
      answer = null;
      summary.textContent = '';
      fill(body, h('p', { class: 'hint', text: 'Give two workflow ids, or open a workflow and use “Compare with…”.' }));
      main.dataset.loaded = 'true';
      return;
    }
    let next;
    try {
      next = await api(`/workflows/${encodeURIComponent(params.a)}/compare/${encodeURIComponent(params.b)}`);
    } catch (e) {
      if (mine !== generation) return;
      answer = null;
      summary.textContent = '';
      fill(body, h('p', { class: 'notice', role: 'alert', id: 'compare-error', text: `Cannot compare: ${e.message}` }));
      main.dataset.loaded = 'true';
      return;
    }
    if (mine !== generation) return;
    answer = next;
    render();
    main.dataset.loaded = 'true';
  }
  const soon = coalesce(refresh, 300);

  function render() {
    const c = answer;
    const onlyDiff = Boolean(params.only);
    ctx.setTitle(`Compare ${c.a.name} with ${c.b.name}`);
    summary.textContent = summaryText(c);
    summary.dataset.same = String(c.summary.same);
    const toggle = h('input', { id: 'compare-only', type: 'checkbox', checked: onlyDiff });
    toggle.addEventListener('change', () => go({ ...params, only: toggle.checked }));
    const swap = h('a', { href: `#/compare${query({ a: c.b.id, b: c.a.id, only: onlyDiff ? 1 : '' })}`, text: 'Swap A and B' });
    fill(body,
      runsTable(c),
      h('div', { class: 'actions compare-tools' },
        h('span', { class: 'field check' }, toggle, h('label', { for: 'compare-only', text: 'Only what differs' })),
        swap),
      inputsSection(c, onlyDiff),
      stepsSection(c, onlyDiff),
      h('p', { class: 'hint', text: limitsText(c) }),
    );
  }

  function runsTable(c) {
    const row = (label, cell) => h('tr', {}, h('th', { scope: 'row', text: label }), cell(c.a, 'a'), cell(c.b, 'b'));
    const differs = (same) => (same ? {} : { class: 'differs' });
    const templateSame = !c.template_changed;
    return h('section', { 'aria-labelledby': 'compare-runs-title' },
      h('h2', { id: 'compare-runs-title', text: 'Runs' }),
      tableWrap(h('table', { class: 'list compare', id: 'compare-runs' },
        h('thead', {}, h('tr', {}, h('td'), h('th', { scope: 'col', text: 'A' }), h('th', { scope: 'col', text: 'B' }))),
        h('tbody', {},
          row('Workflow', (r, side) => h('td', {}, h('a', { href: `#/workflows/${r.id}`, dataset: { run: side }, text: r.name }),
            h('div', { class: 'mono hint', text: r.id }))),
          row('Status', (r) => h('td', { ...differs(c.a.status === c.b.status) }, badge(r.status))),
          row('Template', (r) => h('td', { ...differs(templateSame), dataset: { field: 'template' } },
            marker(templateSame ? 'same' : 'changed'), h('div', { class: 'mono wrap', text: r.template_revision }))),
          row('Reference', (r) => h('td', { text: r.ref ? `${r.ref} rev ${r.revision}` : '—' })),
          row('Created', (r) => h('td', {}, time(r.created_at))),
          row('Took', (r) => h('td', { text: formatDuration(r.duration_ms) })),
        ))));
  }

  function inputsSection(c, onlyDiff) {
    const rows = c.inputs.filter((k) => !onlyDiff || k.change !== 'same').map((k) => keyRow(k, k.key));
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 4, class: 'empty', text: onlyDiff ? 'No input differs.' : 'No inputs.' })));
    return h('section', { 'aria-labelledby': 'compare-inputs-title' },
      h('h2', { id: 'compare-inputs-title', text: 'Inputs' }),
      tableWrap(h('table', { class: 'list compare', id: 'compare-inputs' },
        h('thead', {}, h('tr', {}, ['Input', 'A', 'B', 'Compared'].map((t) => h('th', { scope: 'col', text: t })))),
        h('tbody', {}, rows))));
  }

  function stepsSection(c, onlyDiff) {
    const rows = [];
    for (const step of c.steps) {
      if (onlyDiff && step.change === 'same') continue;
      rows.push(...stepRows(step));
    }
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 7, class: 'empty', text: 'No step differs.' })));
    return h('section', { 'aria-labelledby': 'compare-steps-title' },
      h('h2', { id: 'compare-steps-title', text: 'Steps' }),
      h('p', { class: 'hint', text: 'Steps are matched by name, for_each instances by their values. Open a step for its script hashes, outputs and first differing log line.' }),
      tableWrap(h('table', { class: 'list compare', id: 'compare-steps' },
        h('thead', {}, h('tr', {}, ['Step', 'Status A', 'Status B', 'Took A', 'Took B', 'What differs', 'Compared']
          .map((t) => h('th', { scope: 'col', text: t })))),
        h('tbody', {}, rows))));
  }

  function stepRows(step) {
    const detailsId = `compare-step-${cssSafe(step.key)}`;
    const expanded = open.has(step.key);
    const toggle = h('button', {
      type: 'button', class: 'link', 'aria-expanded': String(expanded), 'aria-controls': detailsId,
      dataset: { action: 'expand' }, text: `${expanded ? '▾' : '▸'} ${step.key}`,
    });
    toggle.addEventListener('click', () => {
      if (open.has(step.key)) open.delete(step.key);
      else open.add(step.key);
      render();
      document.querySelector(`[aria-controls="${detailsId}"]`)?.focus();
    });
    const statusCell = (run, changed) => h('td', changed ? { class: 'differs' } : {},
      run ? badge(run.status) : h('span', { class: 'hint', text: 'no such step' }));
    const row = h('tr', { class: step.change === 'same' ? '' : 'differs', dataset: { step: step.key, change: step.change } },
      h('th', { scope: 'row' }, toggle),
      statusCell(step.a, step.status_changed), statusCell(step.b, step.status_changed),
      h('td', { text: formatDuration(step.a?.duration_ms) }),
      h('td', { text: formatDuration(step.b?.duration_ms) }),
      h('td', { class: 'wrap', dataset: { field: 'what' }, text: whatDiffers(step) }),
      h('td', {}, marker(step.change)));
    const details = h('tr', { id: detailsId, class: 'compare-details', hidden: !expanded, dataset: { details: step.key } },
      h('td', { colspan: 7 }, expanded ? stepDetails(step) : ''));
    return [row, details];
  }

  function stepDetails(step) {
    const script = (run) => (run
      ? [run.script, run.script_hash ? h('div', { class: 'mono hint wrap', text: `sha256 ${run.script_hash}` }) : '']
      : h('span', { class: 'hint', text: 'no such step' }));
    const log = (run) => (run ? h('a', { href: `/tasks/${run.task_id}/logs`, text: 'whole log' }) : '—');
    const kept = (run) => (run?.kept_from ? h('div', { class: 'hint', text: 'kept from the earlier revision: it did not run again' }) : '');
    const parts = [
      h('table', { class: 'list compare compare-scripts' },
        h('thead', {}, h('tr', {}, h('td'), h('th', { scope: 'col', text: 'A' }), h('th', { scope: 'col', text: 'B' }))),
        h('tbody', {},
          h('tr', { class: step.script_changed ? 'differs' : '' },
            h('th', { scope: 'row' }, 'Script', step.script_changed ? h('div', {}, marker('changed')) : ''),
            h('td', {}, script(step.a)), h('td', {}, script(step.b))),
          h('tr', {}, h('th', { scope: 'row', text: 'Log' }),
            h('td', {}, log(step.a), kept(step.a)), h('td', {}, log(step.b), kept(step.b))))),
    ];
    if (step.outputs.length > 0 || step.outputs_same > 0) {
      parts.push(h('h3', { text: 'Outputs' }));
      if (step.outputs.length > 0) {
        parts.push(h('table', { class: 'list compare compare-outputs' },
          h('thead', {}, h('tr', {}, ['Output', 'A', 'B', 'Compared'].map((t) => h('th', { scope: 'col', text: t })))),
          h('tbody', {}, step.outputs.map((k) => keyRow(k, k.key || '(whole output)')))));
      }
      if (step.outputs_same > 0) parts.push(h('p', { class: 'hint', text: `${step.outputs_same} other output ${step.outputs_same === 1 ? 'key is' : 'keys are'} the same.` }));
    }
    parts.push(h('h3', { text: 'Log' }), logDetails(step.log));
    return parts;
  }

  function logDetails(log) {
    if (!log) return h('p', { class: 'hint', text: 'The step ran in one run only.' });
    if (log.outcome === 'not_compared') return h('p', { class: 'hint', text: 'Not compared: past the steps whose logs are read.' });
    const capped = log.capped ? ' (compared up to the limit only)' : '';
    if (log.outcome === 'same') {
      return h('p', { class: 'log-same', text: `= The logs are the same over ${log.lines_compared} lines${capped}.` });
    }
    const line = (side, text) => h('div', { class: 'log-line', dataset: { side } },
      h('span', { class: 'log-side', text: `${side.toUpperCase()}:` }),
      h('code', { text: text ?? '(the log ended before this line)' }));
    return h('div', { class: 'log-diff', dataset: { line: log.line } },
      h('p', {}, h('strong', { text: `≠ First differing line: ${log.line}` }), capped),
      line('a', log.a), line('b', log.b));
  }

  refresh();
  ctx.live.watch({ kind: KINDS }, {
    change(event) {
      if (!answer) return;
      const ids = [answer.a.id, answer.b.id];
      const running = ![answer.a.status, answer.b.status].every((st) => TERMINAL_WORKFLOW.has(st));
      if (ids.includes(event.workflow_id) && running) soon();
    },
    refresh: soon,
  });

  return {
    update(next) {
      const same = next.a === params.a && next.b === params.b;
      params = next;
      if (same && answer) render();
      else {
        open.clear();
        refresh();
      }
      return true;
    },
    unmount() {
      soon.cancel();
    },
  };
}

/** A key's row: its name, both values, and how they compare. */
function keyRow(key, label) {
  const value = (v, present) => h('td', { class: 'mono wrap' }, present ? JSON.stringify(v) : h('span', { class: 'hint', text: 'absent' }));
  const differs = key.change !== 'same';
  return h('tr', { class: differs ? 'differs' : '', dataset: { key: key.key, change: key.change } },
    h('th', { scope: 'row', class: 'mono', text: label }),
    value(key.a, 'a' in key), value(key.b, 'b' in key),
    h('td', {}, marker(key.change)));
}

/** The change in words and a sign, so colour is never the only cue. */
function marker(change) {
  return h('span', { class: 'change', dataset: { change } },
    h('span', { class: 'change-sign', 'aria-hidden': 'true', text: CHANGE_SIGN[change] }),
    ` ${CHANGE_TEXT[change]}`);
}

function whatDiffers(step) {
  if (step.change === 'only_a' || step.change === 'only_b') return `only in ${step.change === 'only_a' ? 'A' : 'B'}`;
  const what = [];
  if (step.status_changed) what.push('status');
  if (step.script_changed) what.push('script');
  if (step.outputs.length > 0) what.push(`output ${step.outputs.map((k) => k.key || '(whole)').join(', ')}`);
  if (step.log?.outcome === 'differs') what.push(`log from line ${step.log.line}`);
  return what.length ? what.join('; ') : '—';
}

function summaryText(c) {
  const s = c.summary;
  if (s.same) return `No difference in ${s.steps} ${s.steps === 1 ? 'step' : 'steps'} (durations aside).`;
  const parts = [];
  if (c.template_changed) parts.push('the template revision differs');
  parts.push(`${s.inputs_changed} ${s.inputs_changed === 1 ? 'input differs' : 'inputs differ'}`);
  parts.push(`${s.steps_differing} of ${s.steps} ${s.steps === 1 ? 'step' : 'steps'} ${s.steps_differing === 1 ? 'differs' : 'differ'}`);
  if (s.logs_capped > 0) parts.push(`${s.logs_capped} ${s.logs_capped === 1 ? 'log was' : 'logs were'} compared up to the limit only`);
  const text = parts.join('; ');
  return `${text.charAt(0).toUpperCase()}${text.slice(1)}.`;
}

function limitsText(c) {
  const l = c.limits;
  return `Logs are compared up to their first ${Math.round(l.log_bytes_per_step / 1024)} KiB and ${l.log_lines_per_step} lines, for up to ${l.logged_steps} steps a run. Script hashes are of the scripts on disk now.`;
}

function cssSafe(text) {
  return text.replace(/[^A-Za-z0-9_-]/g, (ch) => `_${ch.charCodeAt(0).toString(16)}`);
}

/**
 * The workflow page's "Compare with…" control: a disclosure listing the
 * other runs of the same template (newest first, at most 20), each a link
 * to the comparison. The list is read when it is opened.
 */
export function compareWith(workflow) {
  const list = h('ul', { class: 'compare-with-list' });
  const box = h('details', { class: 'compare-with', id: 'compare-with' },
    h('summary', { text: 'Compare with…' }), list);
  let loaded = false;
  box.addEventListener('toggle', async () => {
    if (!box.open || loaded) return;
    loaded = true;
    fill(list, h('li', { class: 'hint', text: 'Loading…' }));
    try {
      const page = await api(`/workflows${query({ template: workflow.kind, limit: 21 })}`);
      const others = page.workflows.filter((w) => w.id !== workflow.id).slice(0, 20);
      fill(list, others.length === 0
        ? h('li', { class: 'hint', text: 'No other run of this template.' })
        : others.map((w) => h('li', {},
          h('a', { href: `#/compare${query({ a: workflow.id, b: w.id })}`, dataset: { compareWith: w.id } },
            w.name, w.ref ? ` · ${w.ref} rev ${w.revision}` : ''),
          ' ', badge(w.status), ' ', time(w.created_at))));
    } catch (e) {
      loaded = false;
      fill(list, h('li', { class: 'error-text', text: `Cannot list the runs: ${e.message}` }));
    }
  });
  return box;
}
