// The nodes sharing the store, with their heartbeats. Heartbeats are not
// engine events, so this page re-reads every few seconds, and ages the
// "last seen" column every second in between.

import { api } from './api.js';
import { badge, fill, formatAgo, h, tableWrap, time } from './dom.js';

const REFRESH_MS = 5000;

export function mount(main, ctx) {
  let nodes = [];
  const tbody = h('tbody');
  fill(main,
    h('h1', { text: 'Nodes' }),
    h('p', { class: 'hint', text: 'Every service instance that shares this store. A node sends a heartbeat every third of its lease; one not heard from within a lease is shown as not alive.' }),
    tableWrap(h('table', { class: 'list', id: 'nodes' },
      h('thead', {}, h('tr', {}, ['Node', 'Address', 'Started', 'Last heartbeat', 'State']
        .map((c) => h('th', { scope: 'col', text: c })))),
      tbody)),
  );
  ctx.setTitle('Nodes');

  function render() {
    const now = Date.now();
    fill(tbody, ...nodes.map((n) => h('tr', { dataset: { nodeId: n.id, alive: String(n.alive) } },
      h('td', {}, n.id, n.this_node ? h('span', { class: 'tag', text: 'this node' }) : null),
      h('td', { text: n.address }),
      h('td', {}, time(n.started_at)),
      h('td', {}, h('time', { datetime: n.last_seen, title: n.last_seen, text: formatAgo(n.last_seen, now) })),
      h('td', {}, n.alive ? badge('completed', 'alive') : badge('failed', 'silent')))));
  }

  async function refresh() {
    try {
      nodes = (await api('/cluster/nodes')).nodes;
      render();
      main.dataset.loaded = 'true';
    } catch (e) {
      ctx.toast(e.message, 'error');
    }
  }

  refresh();
  const poll = setInterval(() => !document.hidden && refresh(), REFRESH_MS);
  const age = setInterval(render, 1000);
  ctx.live.stop();
  return {
    unmount() {
      clearInterval(poll);
      clearInterval(age);
    },
  };
}
