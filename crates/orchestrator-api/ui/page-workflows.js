// The workflow list: one page of the server's listing (never all of it:
// the store may hold tens of thousands), the filters the listing takes
// (status, template, reference, and `q`: text in the name, template,
// reference or an input value, searched by the service), the counts by
// status from `GET /workflows/counts`, and live updates. An operator
// ticks workflows and cancels them together: one `POST
// /workflows/{id}/cancel` each, the outcome of each reported.

import { api, query } from './api.js';
import { TERMINAL_WORKFLOW, badge, coalesce, fill, h, tableWrap, time } from './dom.js';

const PAGE = 50;
const STATUSES = ['scheduled', 'queued', 'running', 'rolling_back', 'completed', 'failed', 'cancelled'];
// Workflow-level events change the list; task events (and logs) do not.
const LIST_KINDS = ['submitted', 'workflow_status_changed', 'completed', 'failed', 'cancelled', 'reset'];
/** The longest search the service takes (`q`, in characters). */
const MAX_SEARCH = 200;
/** Cancels in flight at once: a few, so a large selection does not queue up the browser's connections. */
const CANCEL_PARALLEL = 4;

export function mount(main, ctx) {
  let params = ctx.params;
  let templates = [];
  let generation = 0;
  const mayCancel = ctx.can('operator');
  // Ticked workflows, by id (their names for the report); kept across
  // refreshes and pages, dropped once a workflow has finished.
  const selected = new Map();
  let shown = [];

  const counts = h('div', { class: 'counts', role: 'group', 'aria-label': 'Workflows by status' });
  const statusSelect = h('select', { id: 'filter-status', name: 'status' },
    h('option', { value: '', text: 'any status' }),
    STATUSES.map((st) => h('option', { value: st, text: st.replace('_', ' ') })));
  const templateSelect = h('select', { id: 'filter-template', name: 'template' },
    h('option', { value: '', text: 'any template' }));
  const refInput = h('input', {
    id: 'filter-ref', name: 'ref', type: 'search', placeholder: 'meta.ref', autocomplete: 'off',
  });
  const searchInput = h('input', {
    id: 'filter-q', name: 'q', type: 'search', autocomplete: 'off', maxlength: MAX_SEARCH, spellcheck: 'false',
    placeholder: 'name, template, ref or input', 'aria-describedby': 'filter-q-hint',
  });
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter workflows' },
    h('label', { for: 'filter-q', text: 'Search' }), searchInput,
    h('span', { id: 'filter-q-hint', class: 'visually-hidden', text: 'Finds text in the name, template, reference or an input value, in any case.' }),
    h('label', { for: 'filter-status', text: 'Status' }), statusSelect,
    h('label', { for: 'filter-template', text: 'Template' }), templateSelect,
    h('label', { for: 'filter-ref', text: 'Reference' }), refInput,
    h('button', { type: 'submit', class: 'secondary', text: 'Apply' }));
  const tbody = h('tbody');
  const selectAll = mayCancel
    ? h('input', { type: 'checkbox', id: 'select-all', 'aria-label': 'Select every unfinished workflow on this page' })
    : null;
  const table = h('table', { class: 'list', id: 'workflows' },
    h('caption', { class: 'visually-hidden', text: 'Workflows, newest first' }),
    h('thead', {}, h('tr', {},
      mayCancel ? h('th', { scope: 'col', class: 'pick' }, selectAll) : null,
      ['Name', 'Template', 'Status', 'Reference', 'Created', 'Finished', 'Steps']
        .map((c) => h('th', { scope: 'col', text: c })))),
    tbody);
  const columns = mayCancel ? 8 : 7;
  // Several at once: the button says how many, a confirmation comes first,
  // and the report lists each workflow's outcome.
  const cancelSelected = h('button', { type: 'button', class: 'danger', id: 'cancel-selected', hidden: true });
  const confirmText = h('span', { id: 'cancel-confirm-text' });
  const confirmYes = h('button', { type: 'button', class: 'danger', id: 'cancel-confirm', text: 'Yes, cancel them' });
  const confirmNo = h('button', { type: 'button', class: 'secondary', id: 'cancel-keep', text: 'Keep them' });
  const confirmBox = h('div', { class: 'notice confirm', id: 'cancel-confirm-box', role: 'group', 'aria-labelledby': 'cancel-confirm-text', hidden: true },
    confirmText, ' ', confirmYes, ' ', confirmNo);
  const report = h('div', { class: 'bulk-report', id: 'cancel-report', 'aria-live': 'polite' });
  const bulk = mayCancel ? h('div', { class: 'bulk', role: 'group', 'aria-label': 'Selected workflows' }, cancelSelected, confirmBox, report) : null;
  const summary = h('span', { class: 'page-summary', 'aria-live': 'polite' });
  const previous = h('button', { type: 'button', class: 'secondary', text: '← Newer' });
  const next = h('button', { type: 'button', class: 'secondary', text: 'Older →' });
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' }, previous, summary, next);

  fill(main,
    h('div', { class: 'page-head' },
      h('h1', { text: 'Workflows' }),
      ctx.can('operator') ? h('a', { class: 'button', href: '#/submit', text: 'Submit a workflow' }) : null),
    counts, filters, bulk, tableWrap(table), pager);

  const go = (changes) => {
    const next = { ...params, ...changes };
    ctx.navigate(`#/workflows${query({
      q: next.q, status: next.status, template: next.template, ref: next.ref, offset: Number(next.offset) || '',
    })}`);
  };
  filters.addEventListener('submit', (e) => {
    e.preventDefault();
    go({
      q: searchInput.value.trim(), status: statusSelect.value, template: templateSelect.value, ref: refInput.value.trim(), offset: 0,
    });
  });
  statusSelect.addEventListener('change', () => go({ status: statusSelect.value, offset: 0 }));
  templateSelect.addEventListener('change', () => go({ template: templateSelect.value, offset: 0 }));
  previous.addEventListener('click', () => go({ offset: Math.max(0, (Number(params.offset) || 0) - PAGE) }));
  next.addEventListener('click', () => go({ offset: (Number(params.offset) || 0) + PAGE }));

  function showFilters() {
    searchInput.value = params.q ?? '';
    statusSelect.value = params.status ?? '';
    refInput.value = params.ref ?? '';
    if (params.template && !templates.includes(params.template)) {
      templateSelect.append(h('option', { value: params.template, text: params.template }));
    }
    templateSelect.value = params.template ?? '';
  }

  function renderCounts(answer) {
    const chip = (status, n, label) => h('button', {
      type: 'button',
      class: 'count',
      dataset: { status: status || 'all' },
      'aria-pressed': String((params.status ?? '') === status),
      on: { click: () => go({ status, offset: 0 }) },
    }, h('span', { class: 'count-label', text: label }), h('span', { class: 'count-n', text: n.toLocaleString() }));
    fill(counts,
      chip('', answer.total, 'all'),
      STATUSES.map((st) => chip(st, answer.counts[st] ?? 0, st.replace('_', ' '))),
    );
  }

  function pick(w) {
    if (!mayCancel) return null;
    if (TERMINAL_WORKFLOW.has(w.status)) return h('td', { class: 'pick' });
    return h('td', { class: 'pick' }, h('input', {
      type: 'checkbox', checked: selected.has(w.id), 'aria-label': `Select ${w.name}`, dataset: { pick: w.id },
    }));
  }

  function renderSelection() {
    if (!mayCancel) return;
    cancelSelected.hidden = selected.size === 0;
    cancelSelected.textContent = `Cancel ${selected.size} selected`;
    if (selected.size === 0) confirmBox.hidden = true;
    const open = shown.filter((w) => !TERMINAL_WORKFLOW.has(w.status));
    selectAll.checked = open.length > 0 && open.every((w) => selected.has(w.id));
    selectAll.indeterminate = !selectAll.checked && open.some((w) => selected.has(w.id));
    selectAll.disabled = open.length === 0;
  }

  function renderRows(answer) {
    shown = answer.workflows;
    for (const w of shown) if (TERMINAL_WORKFLOW.has(w.status)) selected.delete(w.id);
    const rows = answer.workflows.map((w) => h('tr', { dataset: { workflowId: w.id, status: w.status } },
      pick(w),
      h('td', {}, h('a', { href: `#/workflows/${w.id}`, text: w.name })),
      h('td', { text: w.template }),
      h('td', {}, badge(w.status)),
      h('td', { text: w.ref ? `${w.ref} (rev ${w.revision})` : '' }),
      h('td', {}, time(w.created_at)),
      h('td', {}, time(w.finished_at)),
      h('td', { class: 'num', text: w.task_count })));
    if (rows.length === 0) {
      rows.push(h('tr', {}, h('td', { colspan: columns, class: 'empty', text: 'No workflow matches.' })));
    }
    fill(tbody, ...rows);
    renderSelection();
    const offset = answer.offset;
    summary.textContent = answer.total === 0
      ? '0 workflows'
      : `${(offset + 1).toLocaleString()}–${(offset + answer.workflows.length).toLocaleString()} of ${answer.total.toLocaleString()}`;
    previous.disabled = offset === 0;
    next.disabled = offset + answer.workflows.length >= answer.total;
  }

  async function refresh() {
    const mine = ++generation;
    const filter = { q: params.q, template: params.template, ref: params.ref };
    try {
      const [list, countAnswer] = await Promise.all([
        api(`/workflows${query({ ...filter, status: params.status, limit: PAGE, offset: Number(params.offset) || 0 })}`),
        api(`/workflows/counts${query(filter)}`),
      ]);
      if (mine !== generation) return; // a newer refresh is under way
      renderRows(list);
      renderCounts(countAnswer);
      main.dataset.loaded = 'true';
    } catch (e) {
      if (mine === generation) ctx.toast(e.message, 'error');
    }
  }
  const soon = coalesce(refresh, 300);

  if (mayCancel) {
    // One listener for every row's checkbox.
    tbody.addEventListener('change', (e) => {
      const id = e.target.dataset?.pick;
      if (!id) return;
      const w = shown.find((x) => x.id === id);
      if (e.target.checked && w) selected.set(id, w.name);
      else selected.delete(id);
      renderSelection();
    });
    selectAll.addEventListener('change', () => {
      for (const w of shown) {
        if (TERMINAL_WORKFLOW.has(w.status)) continue;
        if (selectAll.checked) selected.set(w.id, w.name);
        else selected.delete(w.id);
      }
      for (const box of tbody.querySelectorAll('input[data-pick]')) box.checked = selected.has(box.dataset.pick);
      renderSelection();
    });
    cancelSelected.addEventListener('click', () => {
      const n = selected.size;
      confirmText.textContent = `Cancel ${n} workflow${n === 1 ? '' : 's'}? Their running steps are stopped.`;
      confirmBox.hidden = false;
      confirmYes.focus();
    });
    confirmNo.addEventListener('click', () => {
      confirmBox.hidden = true;
      cancelSelected.focus();
    });
    confirmYes.addEventListener('click', async () => {
      const targets = [...selected];
      confirmBox.hidden = true;
      cancelSelected.disabled = true;
      const outcomes = new Array(targets.length);
      let next = 0;
      const worker = async () => {
        while (next < targets.length) {
          const i = next++;
          const [id, name] = targets[i];
          try {
            await api(`/workflows/${id}/cancel`, { method: 'POST' });
            outcomes[i] = { id, name, ok: true, text: 'cancel requested' };
            selected.delete(id);
          } catch (e) {
            outcomes[i] = { id, name, ok: false, text: e.message };
          }
        }
      };
      await Promise.all(Array.from({ length: Math.min(CANCEL_PARALLEL, targets.length) }, worker));
      const failed = outcomes.filter((o) => !o.ok).length;
      fill(report,
        h('p', { text: `${outcomes.length - failed} of ${outcomes.length} cancelled${failed ? `; ${failed} refused` : ''}.` }),
        h('ul', {}, outcomes.map((o) => h('li', { dataset: { workflowId: o.id, outcome: o.ok ? 'cancelled' : 'refused' } },
          h('a', { href: `#/workflows/${o.id}`, text: o.name }), `: ${o.text}`))),
        h('button', { type: 'button', class: 'link', text: 'Dismiss', on: { click: () => fill(report) } }));
      cancelSelected.disabled = false;
      if (failed) ctx.toast(`${failed} of ${outcomes.length} cancels were refused`, 'error');
      else ctx.toast(`${outcomes.length} workflow${outcomes.length === 1 ? '' : 's'} cancelled`);
      renderSelection();
      refresh();
    });
  }

  api('/templates').then((answer) => {
    templates = [...new Set(answer.templates.map((t) => t.ref_name))];
    fill(templateSelect, h('option', { value: '', text: 'any template' }),
      templates.map((t) => h('option', { value: t, text: t })));
    showFilters();
  }).catch(() => {});

  showFilters();
  refresh();
  ctx.live.watch({ kind: LIST_KINDS }, { change: soon, refresh: soon });

  return {
    update(newParams) {
      params = newParams;
      showFilters();
      refresh();
    },
    unmount() {
      soon.cancel();
    },
  };
}
