// The workflow list: one page of the server's listing (never all of it:
// the store may hold tens of thousands), the filters the listing takes
// (status, template, reference), the counts by status from
// `GET /workflows/counts`, and live updates.

import { api, query } from './api.js';
import { badge, coalesce, fill, h, time } from './dom.js';

const PAGE = 50;
const STATUSES = ['scheduled', 'queued', 'running', 'rolling_back', 'completed', 'failed', 'cancelled'];
// Workflow-level events change the list; task events (and logs) do not.
const LIST_KINDS = ['submitted', 'workflow_status_changed', 'completed', 'failed', 'cancelled', 'reset'];

export function mount(main, ctx) {
  let params = ctx.params;
  let templates = [];
  let generation = 0;

  const counts = h('div', { class: 'counts', role: 'group', 'aria-label': 'Workflows by status' });
  const statusSelect = h('select', { id: 'filter-status', name: 'status' },
    h('option', { value: '', text: 'any status' }),
    STATUSES.map((st) => h('option', { value: st, text: st.replace('_', ' ') })));
  const templateSelect = h('select', { id: 'filter-template', name: 'template' },
    h('option', { value: '', text: 'any template' }));
  const refInput = h('input', {
    id: 'filter-ref', name: 'ref', type: 'search', placeholder: 'meta.ref', autocomplete: 'off',
  });
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter workflows' },
    h('label', { for: 'filter-status', text: 'Status' }), statusSelect,
    h('label', { for: 'filter-template', text: 'Template' }), templateSelect,
    h('label', { for: 'filter-ref', text: 'Reference' }), refInput,
    h('button', { type: 'submit', class: 'secondary', text: 'Apply' }));
  const tbody = h('tbody');
  const table = h('table', { class: 'list', id: 'workflows' },
    h('caption', { class: 'visually-hidden', text: 'Workflows, newest first' }),
    h('thead', {}, h('tr', {},
      ['Name', 'Template', 'Status', 'Reference', 'Created', 'Finished', 'Steps']
        .map((c) => h('th', { scope: 'col', text: c })))),
    tbody);
  const summary = h('span', { class: 'page-summary', 'aria-live': 'polite' });
  const previous = h('button', { type: 'button', class: 'secondary', text: '← Newer' });
  const next = h('button', { type: 'button', class: 'secondary', text: 'Older →' });
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' }, previous, summary, next);

  fill(main,
    h('div', { class: 'page-head' },
      h('h1', { text: 'Workflows' }),
      ctx.can('operator') ? h('a', { class: 'button', href: '#/submit', text: 'Submit a workflow' }) : null),
    counts, filters, h('div', { class: 'table-wrap' }, table), pager);

  const go = (changes) => {
    const next = { ...params, ...changes };
    ctx.navigate(`#/workflows${query({ status: next.status, template: next.template, ref: next.ref, offset: Number(next.offset) || '' })}`);
  };
  filters.addEventListener('submit', (e) => {
    e.preventDefault();
    go({ status: statusSelect.value, template: templateSelect.value, ref: refInput.value.trim(), offset: 0 });
  });
  statusSelect.addEventListener('change', () => go({ status: statusSelect.value, offset: 0 }));
  templateSelect.addEventListener('change', () => go({ template: templateSelect.value, offset: 0 }));
  previous.addEventListener('click', () => go({ offset: Math.max(0, (Number(params.offset) || 0) - PAGE) }));
  next.addEventListener('click', () => go({ offset: (Number(params.offset) || 0) + PAGE }));

  function showFilters() {
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

  function renderRows(answer) {
    const rows = answer.workflows.map((w) => h('tr', { dataset: { workflowId: w.id, status: w.status } },
      h('td', {}, h('a', { href: `#/workflows/${w.id}`, text: w.name })),
      h('td', { text: w.template }),
      h('td', {}, badge(w.status)),
      h('td', { text: w.ref ? `${w.ref} (rev ${w.revision})` : '' }),
      h('td', {}, time(w.created_at)),
      h('td', {}, time(w.finished_at)),
      h('td', { class: 'num', text: w.task_count })));
    if (rows.length === 0) {
      rows.push(h('tr', {}, h('td', { colspan: 7, class: 'empty', text: 'No workflow matches.' })));
    }
    fill(tbody, ...rows);
    const offset = answer.offset;
    summary.textContent = answer.total === 0
      ? '0 workflows'
      : `${(offset + 1).toLocaleString()}–${(offset + answer.workflows.length).toLocaleString()} of ${answer.total.toLocaleString()}`;
    previous.disabled = offset === 0;
    next.disabled = offset + answer.workflows.length >= answer.total;
  }

  async function refresh() {
    const mine = ++generation;
    const filter = { template: params.template, ref: params.ref };
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
