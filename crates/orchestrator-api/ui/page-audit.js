// The audit log (admins only; the service refuses others anyway): every
// change and every refused call, newest first, filtered and paged by the
// service.

import { api, query } from './api.js';
import { badge, fill, h, tableWrap, time } from './dom.js';

const PAGE = 50;
/** Outcomes in the colours of the statuses they resemble. */
const OUTCOME_COLOUR = { ok: 'completed', denied: 'cancelled', failed: 'failed' };

export function mount(main, ctx) {
  let params = ctx.params;
  const input = (name, label, placeholder) => {
    const control = h('input', { id: `audit-${name}`, name, type: 'search', placeholder, autocomplete: 'off' });
    return { control, parts: [h('label', { for: control.id, text: label }), control] };
  };
  const action = input('action', 'Action', 'workflow.cancel');
  const actor = input('actor', 'Actor', 'token name');
  const target = input('target', 'Target', 'id or name');
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter the audit log' },
    action.parts, actor.parts, target.parts, h('button', { type: 'submit', class: 'secondary', text: 'Apply' }));
  const tbody = h('tbody');
  const summary = h('span', { class: 'page-summary', 'aria-live': 'polite' });
  const previous = h('button', { type: 'button', class: 'secondary', text: '← Newer' });
  const next = h('button', { type: 'button', class: 'secondary', text: 'Older →' });

  fill(main,
    h('h1', { text: 'Audit log' }),
    form,
    tableWrap(h('table', { class: 'list', id: 'audit' },
      h('thead', {}, h('tr', {}, ['Time', 'Actor', 'Role', 'Action', 'Target', 'Outcome', 'Status', 'Request id']
        .map((c) => h('th', { scope: 'col', text: c })))),
      tbody)),
    h('nav', { class: 'pager', 'aria-label': 'Pages' }, previous, summary, next),
  );
  ctx.setTitle('Audit log');

  const go = (changes) => {
    const p = { ...params, ...changes };
    ctx.navigate(`#/audit${query({ action: p.action, actor: p.actor, target: p.target, offset: Number(p.offset) || '' })}`);
  };
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    go({ action: action.control.value.trim(), actor: actor.control.value.trim(), target: target.control.value.trim(), offset: 0 });
  });
  previous.addEventListener('click', () => go({ offset: Math.max(0, (Number(params.offset) || 0) - PAGE) }));
  next.addEventListener('click', () => go({ offset: (Number(params.offset) || 0) + PAGE }));

  async function refresh() {
    action.control.value = params.action ?? '';
    actor.control.value = params.actor ?? '';
    target.control.value = params.target ?? '';
    try {
      const answer = await api(`/audit${query({
        action: params.action, actor: params.actor, target: params.target, limit: PAGE, offset: Number(params.offset) || 0,
      })}`);
      const rows = answer.records.map((r) => h('tr', { dataset: { action: r.action, outcome: r.outcome } },
        h('td', {}, time(r.time)),
        h('td', { text: r.actor }),
        h('td', { text: r.role ?? '—' }),
        h('td', { text: r.action }),
        h('td', { class: 'mono', text: r.target ?? '' }),
        h('td', {}, badge(OUTCOME_COLOUR[r.outcome] ?? 'failed', r.outcome)),
        h('td', { class: 'num', text: r.status }),
        h('td', { class: 'mono', text: r.request_id ?? '' })));
      if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 8, class: 'empty', text: 'No record matches.' })));
      fill(tbody, ...rows);
      summary.textContent = answer.total === 0 ? '0 records'
        : `${answer.offset + 1}–${answer.offset + answer.records.length} of ${answer.total.toLocaleString()}`;
      previous.disabled = answer.offset === 0;
      next.disabled = answer.offset + answer.records.length >= answer.total;
      main.dataset.loaded = 'true';
    } catch (e) {
      ctx.toast(e.message, 'error');
    }
  }

  refresh();
  ctx.live.stop();
  return {
    update(newParams) {
      params = newParams;
      refresh();
      return true;
    },
    unmount() {},
  };
}
