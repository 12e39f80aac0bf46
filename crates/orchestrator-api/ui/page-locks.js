// Locks: the named locks held or waited for (`GET /locks`), each with its
// fencing counter, its holders (workflow, step, mode, fencing token,
// since when, nodes) and its waiters in the order they will be granted.
// Live: a `lock_granted`, `lock_waiting` or `lock_released` event re-reads
// the list (coalesced), and marks the lock it names at once.

import { api } from './api.js';
import { coalesce, fill, h, tableWrap, time } from './dom.js';

const KINDS = ['lock_granted', 'lock_waiting', 'lock_released'];

export function mount(main, ctx) {
  ctx.setTitle('Locks');
  let generation = 0;
  const list = h('div', { id: 'locks', class: 'locks' });
  const summary = h('span', { class: 'page-summary', 'aria-live': 'polite' });
  const lastEvent = h('p', { class: 'hint', id: 'locks-last-event', 'aria-live': 'polite' });

  fill(main,
    h('div', { class: 'page-head' }, h('h1', { text: 'Locks' }), summary),
    h('p', { class: 'hint', text: 'Named locks that templates declare (locks:), held or waited for now. Each grant takes the lock\'s next fencing token; waiters are granted in the order shown.' }),
    lastEvent,
    list,
  );

  // Workflow names by id: read once each (a name never changes), so the
  // links read as names rather than ids.
  const names = new Map();
  // Two runs of one template share a name: the id's end tells them apart.
  const workflowLink = (id) => h('a', { href: `#/workflows/${id}`, title: id },
    names.get(id) ?? '', ' ', h('span', { class: 'mono', text: names.has(id) ? `…${id.slice(-8)}` : id }));
  async function learnNames(locks) {
    const unknown = [...new Set(locks.flatMap((l) => [...l.holders, ...l.waiters].map((x) => x.workflow_id)))]
      .filter((id) => !names.has(id)).slice(0, 50);
    await Promise.all(unknown.map((id) => api(`/workflows/${id}`)
      .then((w) => names.set(id, w.name)).catch(() => names.set(id, id))));
  }

  function renderLock(lock) {
    const holders = lock.holders.map((holder) => h('tr', { dataset: { role: 'holder', workflowId: holder.workflow_id, token: holder.token } },
      h('td', { text: 'holds' }),
      h('td', {}, workflowLink(holder.workflow_id)),
      h('td', { class: 'mono', text: holder.step }),
      h('td', { text: holder.mode }),
      h('td', { class: 'num fencing', text: holder.token }),
      h('td', {}, time(holder.since)),
      h('td', { class: 'mono', text: (holder.nodes ?? []).join(', ') })));
    const waiters = lock.waiters.map((waiter, i) => h('tr', { dataset: { role: 'waiter', workflowId: waiter.workflow_id, position: i } },
      h('td', { text: i === 0 ? 'waits (next)' : `waits (${i + 1}.)` }),
      h('td', {}, workflowLink(waiter.workflow_id)),
      h('td', { class: 'mono', text: waiter.step }),
      h('td', { text: waiter.limit ? `${waiter.mode}, at most ${waiter.limit}` : waiter.mode }),
      h('td', { class: 'num', text: '—' }),
      h('td', {}, time(waiter.since)),
      h('td', { class: 'mono', text: waiter.node ?? '' })));
    const id = `lock-${lock.name.replace(/[^A-Za-z0-9_-]/g, '_')}`;
    return h('section', { class: 'lock', dataset: { lock: lock.name }, 'aria-labelledby': id },
      h('div', { class: 'page-head' },
        h('h2', { id, class: 'mono', text: lock.name }),
        h('span', { class: 'hint', text: `fencing token ${lock.fencing} · ${lock.holders.length} holding · ${lock.waiters.length} waiting` })),
      tableWrap(h('table', { class: 'list' },
        h('caption', { class: 'visually-hidden', text: `Holders and waiters of ${lock.name}` }),
        h('thead', {}, h('tr', {}, ['', 'Workflow', 'Step', 'Mode', 'Fencing token', 'Since', 'Node'].map((c, i) => (i === 0
          ? h('th', { scope: 'col' }, h('span', { class: 'visually-hidden', text: 'Holds or waits' }))
          : h('th', { scope: 'col', text: c }))))),
        h('tbody', {}, holders, waiters))));
  }

  async function refresh() {
    const mine = ++generation;
    try {
      const answer = await api('/locks');
      await learnNames(answer.locks);
      if (mine !== generation) return;
      const locks = answer.locks;
      fill(list, locks.length ? locks.map(renderLock)
        : h('p', { class: 'empty-state', text: 'No lock is held or waited for.' }));
      const waiting = locks.reduce((n, l) => n + l.waiters.length, 0);
      summary.textContent = `${locks.length} lock${locks.length === 1 ? '' : 's'} in use · ${waiting} waiting`;
      main.dataset.loaded = 'true';
    } catch (e) {
      if (mine === generation) ctx.toast(e.message, 'error');
    }
  }
  const soon = coalesce(refresh, 250);

  refresh();
  ctx.live.watch({ kind: KINDS }, {
    change(event) {
      if (event.lock?.name) {
        const what = { lock_granted: 'granted', lock_waiting: 'waited for', lock_released: 'released' }[event.kind] ?? event.kind;
        lastEvent.textContent = `Last change: ${event.lock.name} ${what}${event.lock.token ? ` (token ${event.lock.token})` : ''}.`;
      }
      soon();
    },
    refresh: soon,
  });
  return {
    update() {
      return true;
    },
    unmount() {
      soon.cancel();
    },
  };
}
