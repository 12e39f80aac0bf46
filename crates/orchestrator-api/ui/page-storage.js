// Storage (admins only; the service refuses others anyway): the store in
// use, a live move to another store (only the backends this build has)
// with its phases and a progress bar driven by `storage_migration`
// events, cancel before the switch, and a rollback while the service
// says it is possible, with its reason when it is not.

import { api } from './api.js';
import { badge, confirmDialog, fill, formatDuration, h, tableWrap, time } from './dom.js';

const PHASES = ['copying', 'mirroring', 'verifying', 'switching', 'completed'];
/** The colour of each phase: the status it resembles. */
const PHASE_COLOUR = {
  copying: 'running', mirroring: 'running', verifying: 'running', switching: 'retry_waiting',
  completed: 'completed', cancelled: 'cancelled', failed: 'failed', abandoned: 'not_started',
};
const BACKEND_WORDS = {
  filesystem: 'Filesystem',
  'surrealdb-embedded': 'Embedded SurrealDB',
  'surrealdb-server': 'SurrealDB server',
};

/** `filesystem:/srv/data` as its backend and where. */
function splitSpec(spec) {
  const at = spec.indexOf(':');
  return at < 0 ? { backend: spec, location: '' } : { backend: spec.slice(0, at), location: spec.slice(at + 1) };
}

const number = (n) => (n ?? 0).toLocaleString();

export function mount(main, ctx) {
  let generation = 0;
  let info = null;
  let moves = [];

  const storeBox = h('div', { id: 'storage-store' });
  const rollbackBox = h('div', { id: 'storage-rollback', 'aria-live': 'polite' });
  const moveBox = h('div', { id: 'storage-move' });
  const historyBody = h('tbody');

  // The form for a move: a backend, then what it needs.
  const backend = h('select', { id: 'move-backend', name: 'backend' });
  const directory = h('input', { id: 'move-directory', name: 'directory', type: 'text', autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'move-directory-hint' });
  const url = h('input', { id: 'move-url', name: 'url', type: 'text', autocomplete: 'off', spellcheck: 'false', placeholder: 'ws://127.0.0.1:8000' });
  const namespace = h('input', { id: 'move-namespace', name: 'namespace', type: 'text', autocomplete: 'off', value: 'orchestrator' });
  const database = h('input', { id: 'move-database', name: 'database', type: 'text', autocomplete: 'off', value: 'orchestrator' });
  const batch = h('input', { id: 'move-batch', name: 'batch_size', type: 'number', min: 1, max: 10000, step: 1, inputmode: 'numeric', 'aria-describedby': 'move-batch-hint' });
  const dirField = h('div', { class: 'field' },
    h('label', { for: 'move-directory', text: 'Directory' }), directory,
    h('small', { id: 'move-directory-hint', class: 'hint', text: 'An absolute path on the service\'s machine. Embedded SurrealDB keeps its files in <directory>/surrealdb.' }));
  const serverFields = h('div', { class: 'server-fields' },
    h('div', { class: 'field' }, h('label', { for: 'move-url', text: 'Server URL' }), url),
    h('div', { class: 'field' }, h('label', { for: 'move-namespace', text: 'Namespace' }), namespace),
    h('div', { class: 'field' }, h('label', { for: 'move-database', text: 'Database' }), database),
    h('p', { class: 'hint', text: 'Signed in to with the service\'s own SurrealDB settings.' }));
  const formError = h('p', { class: 'form-error', id: 'move-error', role: 'alert', hidden: true });
  const startButton = h('button', { type: 'submit', class: 'primary', dataset: { action: 'start-move' }, text: 'Start the move' });
  const form = h('form', { class: 'submit-form', id: 'move-form', novalidate: true, 'aria-labelledby': 'move-title' },
    h('div', { class: 'field' }, h('label', { for: 'move-backend', text: 'Backend' }), backend),
    dirField, serverFields,
    h('div', { class: 'field' }, h('label', { for: 'move-batch', text: 'Records per batch (optional)' }), batch,
      h('small', { id: 'move-batch-hint', class: 'hint', text: 'Default 2000; 1 to 10000.' })),
    formError,
    h('div', { class: 'actions' }, startButton));

  fill(main,
    h('h1', { text: 'Storage' }),
    h('section', { 'aria-labelledby': 'store-title' }, h('h2', { id: 'store-title', text: 'The store in use' }), storeBox, rollbackBox),
    h('section', { 'aria-labelledby': 'current-title' }, h('h2', { id: 'current-title', text: 'The latest move' }), moveBox),
    h('section', { 'aria-labelledby': 'move-title' },
      h('h2', { id: 'move-title', text: 'Move to another store' }),
      h('p', { class: 'hint', text: 'The service keeps serving while it copies every record, mirrors what changes meanwhile, verifies the copy, and switches with a pause of milliseconds. The old store is kept for a rollback.' }),
      form),
    h('section', { 'aria-labelledby': 'history-title' },
      h('h2', { id: 'history-title', text: 'Past moves' }),
      tableWrap(h('table', { class: 'list', id: 'storage-moves' },
        h('thead', {}, h('tr', {}, ['Started', 'From', 'To', 'Phase', 'Records', 'Writes paused', 'Finished']
          .map((c) => h('th', { scope: 'col', text: c })))),
        historyBody))));
  ctx.setTitle('Storage');

  function showBackendFields() {
    const server = backend.value === 'surrealdb-server';
    dirField.hidden = server;
    serverFields.hidden = !server;
  }
  backend.addEventListener('change', showBackendFields);

  function target() {
    if (backend.value === 'surrealdb-server') {
      const base = url.value.trim().replace(/\/+$/, '');
      const path = [namespace.value.trim(), database.value.trim()].filter(Boolean).join('/');
      return `surrealdb-server:${base}${path ? `/${path}` : ''}`;
    }
    return `${backend.value}:${directory.value.trim()}`;
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    formError.hidden = true;
    const spec = target();
    const body = { target: spec };
    if (batch.value.trim()) body.batch_size = Number(batch.value);
    const sure = await confirmDialog(`Move the service to ${spec}?`, 'Start the move',
      'It keeps serving throughout; writes pause for milliseconds at the switch.');
    if (!sure) return;
    startButton.disabled = true;
    try {
      const started = await api('/admin/storage/migrations', { method: 'POST', body });
      ctx.toast(`Moving to ${started.target}`);
      upsert(started);
      render();
    } catch (err) {
      formError.textContent = err.message;
      formError.hidden = false;
    } finally {
      startButton.disabled = false;
    }
  });

  /** How far a status is: an answer that arrives after a newer event must not undo it. */
  const rank = (m) => [PHASES.includes(m.phase) ? PHASES.indexOf(m.phase) : PHASES.length, m.records_copied, m.records_mirrored];
  function upsert(status) {
    const i = moves.findIndex((m) => m.id === status.id);
    if (i < 0) moves.push(status);
    else {
      const [a, b] = [rank(status), rank(moves[i])];
      const newer = a[0] !== b[0] ? a[0] > b[0] : a[1] !== b[1] ? a[1] > b[1] : a[2] >= b[2];
      if (newer) moves[i] = status;
    }
  }

  function renderStore() {
    const { backend: kind, location } = splitSpec(info.store);
    const fact = (label, value) => [h('dt', { text: label }), h('dd', {}, value)];
    fill(storeBox, h('dl', { class: 'facts-grid' },
      fact('Backend', h('span', { id: 'storage-backend', dataset: { backend: kind }, text: BACKEND_WORDS[kind] ?? kind })),
      fact('Location', h('code', { id: 'storage-location', text: location })),
      fact('Previous store', info.previous ? h('code', { id: 'storage-previous', text: info.previous }) : 'none (never moved)'),
      info.previous ? fact('Previous store level', info.level ? 'yes: nothing written since the switch' : 'no: written to since the switch') : null,
      fact('Backends in this build', info.backends.map((b) => BACKEND_WORDS[b] ?? b).join(', '))));
    if (!info.previous) {
      fill(rollbackBox);
    } else if (info.can_roll_back) {
      const button = h('button', { type: 'button', class: 'danger', dataset: { action: 'rollback' }, text: `Roll back to ${info.previous}` });
      button.addEventListener('click', async () => {
        const sure = await confirmDialog(`Roll back to ${info.previous}?`, 'Roll back',
          'Writes made since the switch are brought along; the service then works on the previous store.');
        if (!sure) return;
        button.disabled = true;
        try {
          info = await api('/admin/storage/rollback', { method: 'POST' });
          ctx.toast(`Rolled back to ${info.store}`);
          refresh();
        } catch (err) {
          ctx.toast(err.message, 'error');
          button.disabled = false;
          refresh();
        }
      });
      fill(rollbackBox, h('p', { class: 'hint', text: 'A rollback is possible now.' }), button);
    } else {
      fill(rollbackBox, h('p', { class: 'notice', id: 'storage-rollback-refused' },
        h('strong', { text: 'No rollback now: ' }), info.rollback_refused ?? 'the service refuses it.'));
    }
    const choices = info.backends;
    if ([...backend.options].map((o) => o.value).join() !== choices.join()) {
      const chosen = backend.value;
      fill(backend, choices.map((b) => h('option', { value: b, text: BACKEND_WORDS[b] ?? b })));
      if (choices.includes(chosen)) backend.value = chosen;
      showBackendFields();
    }
  }

  function renderMove() {
    const m = moves.at(-1);
    if (!m) {
      fill(moveBox, h('p', { class: 'hint', text: 'This service has not moved its store yet.' }));
      return;
    }
    const running = !['completed', 'cancelled', 'failed', 'abandoned'].includes(m.phase);
    const at = PHASES.indexOf(m.phase);
    const steps = h('ol', { class: 'phases', 'aria-label': 'Phases' }, PHASES.map((p, i) => {
      const state = at < 0 ? (m.phases?.[`${p}_ms`] !== undefined ? 'done' : 'not-reached')
        : i < at ? 'done' : i === at ? (p === 'completed' ? 'done' : 'current') : 'next';
      const took = m.phases?.[`${p}_ms`];
      return h('li', { dataset: { phase: p, state }, 'aria-current': state === 'current' ? 'step' : false },
        p, took !== undefined ? h('span', { class: 'hint', text: ` ${formatDuration(took)}` }) : null);
    }));
    const total = m.records_total || 0;
    const done = m.phase === 'copying' ? m.records_copied : running || m.phase === 'completed' ? total : m.records_copied;
    const bar = h('progress', { id: 'move-progress', max: Math.max(total, 1), value: Math.min(done, Math.max(total, 1)), 'aria-labelledby': 'move-progress-label' });
    const words = [
      `${number(m.records_copied)} / ${number(total)} records copied`,
      m.records_mirrored ? `${number(m.records_mirrored)} mirrored` : '',
      m.records_verified ? `${number(m.records_verified)} verified` : '',
      m.phase === 'copying' && m.rate ? `${Math.round(m.rate).toLocaleString()}/s` : '',
      m.eta_secs !== undefined && m.eta_secs !== null ? `about ${formatDuration(m.eta_secs * 1000)} left` : '',
      m.switch_stall_ms !== undefined && m.switch_stall_ms !== null ? `writes paused ${m.switch_stall_ms.toFixed(1)} ms at the switch` : '',
    ].filter(Boolean).join(', ');
    let cancel = null;
    if (running && m.phase !== 'switching') {
      cancel = h('button', { type: 'button', class: 'danger', dataset: { action: 'cancel-move' }, text: 'Cancel the move' });
      cancel.addEventListener('click', async () => {
        cancel.disabled = true;
        try {
          await api(`/admin/storage/migrations/${encodeURIComponent(m.id)}/cancel`, { method: 'POST' });
          ctx.toast('Cancelling the move');
        } catch (err) {
          ctx.toast(err.message, 'error');
          cancel.disabled = false;
        }
      });
    }
    fill(moveBox,
      h('p', { class: 'move-head', dataset: { moveId: m.id, phase: m.phase } },
        h('code', { text: m.source }), ' → ', h('code', { text: m.target }), ' ', badge(PHASE_COLOUR[m.phase] ?? 'queued', m.phase)),
      steps,
      h('div', { class: 'progress' },
        h('label', { id: 'move-progress-label', for: 'move-progress', text: 'Progress' }), bar,
        h('span', { id: 'move-words', 'aria-live': 'polite', text: words })),
      m.error ? h('p', { class: 'error-text', id: 'move-error-text', text: m.error }) : null,
      cancel ? h('div', { class: 'actions' }, cancel) : null);
  }

  function renderHistory() {
    const rows = [...moves].reverse().map((m) => h('tr', { dataset: { moveId: m.id, phase: m.phase } },
      h('td', {}, time(m.started_at)),
      h('td', { class: 'mono', text: m.source }),
      h('td', { class: 'mono', text: m.target }),
      h('td', {}, badge(PHASE_COLOUR[m.phase] ?? 'queued', m.phase)),
      h('td', { class: 'num', text: `${number(m.records_copied)} / ${number(m.records_total)}` }),
      h('td', { class: 'num', text: m.switch_stall_ms !== undefined && m.switch_stall_ms !== null ? `${m.switch_stall_ms.toFixed(1)} ms` : '—' }),
      h('td', {}, time(m.finished_at))));
    if (!rows.length) rows.push(h('tr', {}, h('td', { colspan: 7, class: 'empty', text: 'No move yet.' })));
    fill(historyBody, ...rows);
  }

  function render() {
    if (info) renderStore();
    renderMove();
    renderHistory();
  }

  async function refresh() {
    const mine = ++generation;
    try {
      const [store, list] = await Promise.all([api('/admin/storage'), api('/admin/storage/migrations')]);
      if (mine !== generation) return;
      info = store;
      moves = list.migrations;
      render();
      main.dataset.loaded = 'true';
    } catch (e) {
      if (mine !== generation) return;
      if (e.status === 409) {
        fill(storeBox, h('p', { class: 'notice', text: e.message }));
        form.hidden = true;
        main.dataset.loaded = 'true';
      } else {
        ctx.toast(e.message, 'error');
      }
    }
  }

  refresh();
  ctx.live.watch({ kind: ['storage_migration'] }, {
    change(event) {
      if (!event.migration) return;
      upsert(event.migration);
      render();
      // At an end, the store (and whether a rollback is possible) changed too.
      if (['completed', 'cancelled', 'failed', 'abandoned'].includes(event.migration.phase)) refresh();
    },
    refresh,
  });

  return {
    update() {
      return true;
    },
    unmount() {},
  };
}
