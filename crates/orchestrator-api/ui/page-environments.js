// Test environments: the list, a create form that shows a topology's (or
// a taskserv's) nodes and checks before anything is made, the quick test
// (create, run, the result table, delete unless kept: what `orchestrator
// test quick` does), and one environment's page (its nodes, the checks of
// its newest run with their output, its logs, run again, delete). Live
// through `environment_changed` events on the page's one stream; viewers
// read, operators act.

import { api, query } from './api.js';
import { badge, coalesce, confirmDialog, fill, h, json, tableWrap, time } from './dom.js';

/** Each status in the colour of the task status it resembles. */
const ENV_COLOUR = {
  creating: 'running', ready: 'completed', failed: 'failed', cancelled: 'cancelled',
  deleting: 'running', deleted: 'skipped', delete_failed: 'failed',
};
const NODE_COLOUR = {
  creating: 'queued', installing: 'running', installed: 'queued', starting: 'running',
  running: 'completed', failed: 'failed', deleted: 'skipped',
};
const CHECK_COLOUR = { passed: 'completed', failed: 'failed', pending: 'queued', running: 'running' };
const TYPE_LABEL = { single_taskserv: 'one taskserv', server: 'server', cluster: 'cluster' };
const KINDS = ['environment_changed'];

const words = (status) => status.replaceAll('_', ' ');
const statusBadge = (colours, status) => badge(colours[status] ?? 'queued', words(status));

/** `256 MiB, 128 pids, 0.5 CPU` of whichever limits are set. */
function limitsText(limits) {
  if (!limits) return '';
  return [
    limits.memory_mib !== undefined ? `${limits.memory_mib} MiB` : null,
    limits.pids !== undefined ? `${limits.pids} pids` : null,
    limits.cpus !== undefined ? `${limits.cpus} CPU` : null,
  ].filter(Boolean).join(', ');
}

const headRow = (...names) => h('thead', {}, h('tr', {}, names.map((c) => h('th', { scope: 'col', text: c }))));
const emptyRow = (span, text) => h('tr', {}, h('td', { colspan: span, class: 'empty', text }));

export function mount(main, ctx) {
  return ctx.params.id ? mountEnvironment(main, ctx) : mountList(main, ctx);
}

/** A check's result as a table row (the environment's page, the quick test). */
function checkRow(check, open) {
  const details = (check.output !== undefined || check.log_tail)
    ? h('details', { dataset: { check: check.name }, open: open?.has(check.name) },
      h('summary', { text: 'Output and log' }),
      check.output !== undefined ? [h('p', { class: 'sub', text: 'Output' }), h('pre', { class: 'json', text: json(check.output) })] : null,
      check.log_tail ? [h('p', { class: 'sub', text: 'Log (last lines)' }), h('pre', { class: 'log', tabindex: 0, text: check.log_tail })] : null)
    : '—';
  if (open && details !== '—') {
    details.addEventListener('toggle', () => {
      if (details.open) open.add(check.name);
      else open.delete(check.name);
    });
  }
  return h('tr', { dataset: { check: check.name, status: check.status } },
    h('th', { scope: 'row', class: 'mono', text: check.name }),
    h('td', { text: check.node }),
    h('td', { text: check.taskserv }),
    h('td', { text: check.targets.join(', ') }),
    h('td', {}, statusBadge(CHECK_COLOUR, check.status)),
    h('td', { class: 'wrap', text: check.error ?? '' }),
    h('td', {}, details));
}

function checksTable(id, caption) {
  const tbody = h('tbody');
  const table = h('table', { class: 'list', id },
    h('caption', { class: 'visually-hidden', text: caption }),
    headRow('Check', 'From', 'Taskserv', 'Targets', 'Result', 'Error', 'Details'),
    tbody);
  return { wrap: tableWrap(table), tbody };
}

function runSummary(run) {
  if (!run) return 'No run yet.';
  const what = run.status === 'running' ? 'The checks are running' : `The last run ${run.status}`;
  return `${what}: ${run.passed} passed, ${run.failed} failed of ${run.checks.length}.`;
}

// ---------------------------------------------------------------- the list

function mountList(main, ctx) {
  let params = ctx.params;
  let catalog = null;
  let generation = 0;
  let previewGeneration = 0;
  let quickRunning = false;
  const canAct = ctx.can('operator');

  const limitsNote = h('p', { class: 'notice', id: 'env-limits', hidden: true });
  const showDeleted = h('input', { type: 'checkbox', id: 'env-show-deleted' });
  const summary = h('span', { class: 'page-summary', id: 'env-summary', 'aria-live': 'polite' });
  const tbody = h('tbody');

  // What to create: a topology, or one taskserv.
  const kindTopology = h('input', { type: 'radio', name: 'env-kind', id: 'env-kind-topology', value: 'topology', checked: true });
  const kindTaskserv = h('input', { type: 'radio', name: 'env-kind', id: 'env-kind-taskserv', value: 'taskserv' });
  const topologySelect = h('select', { id: 'env-topology', name: 'topology' });
  const taskservSelect = h('select', { id: 'env-taskserv', name: 'taskserv' });
  const topologyField = h('div', { class: 'field' }, h('label', { for: 'env-topology', text: 'Topology' }), topologySelect);
  const taskservField = h('div', { class: 'field', hidden: true }, h('label', { for: 'env-taskserv', text: 'Taskserv' }), taskservSelect);
  const about = h('p', { class: 'hint', id: 'env-about' });
  const previewNodes = h('tbody');
  const previewChecks = h('tbody');
  const preview = h('section', { id: 'env-preview', 'aria-labelledby': 'env-preview-title' },
    h('h3', { id: 'env-preview-title', text: 'What it makes' }),
    about,
    h('h4', { text: 'Nodes' }),
    tableWrap(h('table', { class: 'list', id: 'env-preview-nodes' },
      h('caption', { class: 'visually-hidden', text: 'The nodes it makes' }),
      headRow('Node', 'Roles', 'Taskservs', 'Limits'), previewNodes)),
    h('h4', { text: 'Checks' }),
    h('p', { class: 'hint', text: 'A run checks each taskserv on its own node, then the topology\'s checks across nodes.' }),
    tableWrap(h('table', { class: 'list', id: 'env-preview-checks' },
      h('caption', { class: 'visually-hidden', text: 'The checks a run makes' }),
      headRow('Check', 'From', 'Taskserv', 'Targets'), previewChecks)));

  const nameInput = h('input', { type: 'text', id: 'env-name', name: 'name', autocomplete: 'off', 'aria-describedby': 'env-name-hint' });
  const ttlInput = h('input', { type: 'text', id: 'env-ttl', name: 'ttl', autocomplete: 'off', placeholder: '1h', 'aria-describedby': 'env-ttl-hint' });
  const cleanupBox = h('input', { type: 'checkbox', id: 'env-auto-cleanup', name: 'auto_cleanup', 'aria-describedby': 'env-auto-cleanup-hint' });
  const keepBox = h('input', { type: 'checkbox', id: 'env-keep', name: 'keep', 'aria-describedby': 'env-keep-hint' });
  const formError = h('p', { class: 'form-error', id: 'env-error', role: 'alert', hidden: true });
  const createButton = h('button', { type: 'submit', class: 'primary', dataset: { action: 'create' }, text: 'Create' });
  const quickButton = h('button', { type: 'button', class: 'secondary', dataset: { action: 'quick-test' }, text: 'Quick test' });
  const options = canAct ? h('fieldset', { class: 'inputs' }, h('legend', { text: 'Options' }),
    h('div', { class: 'field' }, h('label', { for: 'env-name', text: 'Name (optional)' }), nameInput,
      h('small', { id: 'env-name-hint', class: 'hint', text: 'A label for people; the topology\'s or taskserv\'s name otherwise.' })),
    h('div', { class: 'field' }, h('label', { for: 'env-ttl', text: 'Time to live (optional)' }), ttlInput,
      h('small', { id: 'env-ttl-hint', class: 'hint', text: 'Seconds, or 90s, 15m, 2h (5 s to 24 h; 1 h by default): torn down then, whatever else happens.' })),
    h('div', { class: 'field check' }, cleanupBox, h('label', { for: 'env-auto-cleanup', text: 'Tear down after its first run' }),
      h('small', { id: 'env-auto-cleanup-hint', class: 'hint', text: 'For Create. The quick test deletes the environment anyway, unless kept.' })),
    h('div', { class: 'field check' }, keepBox, h('label', { for: 'env-keep', text: 'Keep the environment after a quick test' }),
      h('small', { id: 'env-keep-hint', class: 'hint', text: 'Otherwise the quick test deletes it once its checks ran.' }))) : null;

  const form = h('form', { class: 'env-form', id: 'env-create', novalidate: true, 'aria-labelledby': 'env-create-title' },
    h('h2', { id: 'env-create-title', text: canAct ? 'Create a test environment' : 'Topologies and taskservs' }),
    h('fieldset', { class: 'inputs' }, h('legend', { text: 'From' }),
      h('div', { class: 'field check' }, kindTopology, h('label', { for: 'env-kind-topology', text: 'A topology (a cluster of nodes)' })),
      h('div', { class: 'field check' }, kindTaskserv, h('label', { for: 'env-kind-taskserv', text: 'One taskserv, alone on one node' })),
      topologyField, taskservField),
    preview,
    options,
    formError,
    canAct ? h('div', { class: 'actions' }, createButton, quickButton) : null);

  const quickStatus = h('p', { id: 'quick-status', role: 'status', 'aria-live': 'polite' });
  const quickTable = checksTable('quick-checks', 'The quick test\'s checks');
  const quickSummary = h('p', { id: 'quick-summary' });
  const quickSection = h('section', { id: 'quick', 'aria-labelledby': 'quick-title', hidden: true },
    h('h2', { id: 'quick-title', text: 'Quick test' }), quickStatus, quickTable.wrap, quickSummary);

  fill(main,
    h('h1', { text: 'Test environments' }),
    h('p', { class: 'hint', text: 'Isolated nodes made, checked and torn down as workflows, before a change touches real infrastructure.' }),
    limitsNote,
    h('section', { 'aria-labelledby': 'env-list-title' },
      h('div', { class: 'page-head env-head' }, h('h2', { id: 'env-list-title', text: 'Environments' }),
        h('div', { class: 'filters' }, showDeleted, h('label', { for: 'env-show-deleted', text: 'Show deleted ones' }))),
      tableWrap(h('table', { class: 'list', id: 'environments' },
        h('caption', { class: 'visually-hidden', text: 'Test environments, newest first' }),
        headRow('Name', 'Type', 'Status', 'Nodes', 'Created', 'Expires'),
        tbody)),
      h('p', {}, summary)),
    form,
    quickSection,
  );
  ctx.setTitle('Test environments');

  const go = (changes) => {
    const p = { ...params, ...changes };
    ctx.replace(`#/environments${query({ topology: p.topology, taskserv: p.taskserv, deleted: p.deleted })}`);
    params = p;
  };

  showDeleted.addEventListener('change', () => {
    go({ deleted: showDeleted.checked ? '1' : '' });
    refresh();
  });
  const chooseKind = () => {
    const topology = kindTopology.checked;
    topologyField.hidden = !topology;
    taskservField.hidden = topology;
    if (topology) go({ topology: topologySelect.value, taskserv: '' });
    else go({ taskserv: taskservSelect.value, topology: '' });
    showPreview();
  };
  kindTopology.addEventListener('change', chooseKind);
  kindTaskserv.addEventListener('change', chooseKind);
  topologySelect.addEventListener('change', chooseKind);
  taskservSelect.addEventListener('change', chooseKind);

  function taskservCell(names) {
    return names.map((name, i) => {
      const info = catalog?.taskservs.find((t) => t.name === name);
      return [i ? ', ' : '', name, info?.simulated ? h('span', { class: 'tag', text: 'simulated' }) : ''];
    });
  }

  /** The nodes and checks of what is chosen, before anything is made. */
  async function showPreview() {
    const mine = ++previewGeneration;
    let nodes;
    let checks;
    if (kindTopology.checked) {
      const name = topologySelect.value;
      if (!name) return;
      let topology;
      try {
        topology = await api(`/test/topologies/${encodeURIComponent(name)}`);
      } catch (e) {
        if (mine === previewGeneration) ctx.toast(e.message, 'error');
        return;
      }
      if (mine !== previewGeneration) return;
      about.textContent = topology.description ? `${topology.name}: ${topology.description}` : topology.name;
      nodes = topology.nodes.map((n) => ({ ...n, limits: { ...topology.limits, ...n.limits } }));
      checks = [
        ...nodes.flatMap((n) => n.taskservs.map((t) => ({ name: `${t}@${n.name}`, from: n.name, taskserv: t, to: [n.name] }))),
        ...(topology.checks ?? []),
      ];
    } else {
      const name = taskservSelect.value;
      const info = catalog?.taskservs.find((t) => t.name === name);
      if (!info) return;
      about.textContent = `${info.name}, on port ${info.port}${info.description ? `: ${info.description}` : ''}`;
      nodes = [{ name, roles: [], taskservs: [name] }];
      checks = [{ name: `${name}@${name}`, from: name, taskserv: name, to: [name] }];
    }
    fill(previewNodes, nodes.map((n) => h('tr', { dataset: { node: n.name } },
      h('th', { scope: 'row', text: n.name }),
      h('td', { text: n.roles.join(', ') || '—' }),
      h('td', {}, taskservCell(n.taskservs)),
      h('td', { text: limitsText(n.limits) || 'the defaults' }))));
    fill(previewChecks, checks.map((c) => h('tr', { dataset: { check: c.name } },
      h('th', { scope: 'row', class: 'mono', text: c.name }),
      h('td', { text: c.from }),
      h('td', { text: c.taskserv }),
      h('td', { text: c.to.join(', ') }))));
    preview.dataset.subject = kindTopology.checked ? topologySelect.value : taskservSelect.value;
  }

  function showCatalog() {
    fill(topologySelect, catalog.topologies.map((t) => h('option', { value: t.name, text: t.description ? `${t.name} — ${t.description}` : t.name })));
    fill(taskservSelect, catalog.taskservs.map((t) => h('option', { value: t.name, text: `${t.name}${t.simulated ? ' (simulated)' : ''}` })));
    const byTaskserv = params.taskserv && catalog.taskservs.some((t) => t.name === params.taskserv);
    kindTaskserv.checked = Boolean(byTaskserv);
    kindTopology.checked = !byTaskserv;
    if (byTaskserv) taskservSelect.value = params.taskserv;
    else if (params.topology && catalog.topologies.some((t) => t.name === params.topology)) topologySelect.value = params.topology;
    topologyField.hidden = Boolean(byTaskserv);
    taskservField.hidden = !byTaskserv;
    showPreview();
  }

  function requestBody() {
    const body = kindTopology.checked
      ? { type: 'cluster', topology: topologySelect.value }
      : { type: 'single_taskserv', taskserv: taskservSelect.value };
    if (nameInput.value.trim()) body.name = nameInput.value.trim();
    if (ttlInput.value.trim()) body.ttl = /^\d+$/.test(ttlInput.value.trim()) ? Number(ttlInput.value.trim()) : ttlInput.value.trim();
    return body;
  }

  function showError(message) {
    formError.textContent = message;
    formError.hidden = !message;
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!canAct || quickRunning) return;
    showError('');
    createButton.disabled = true;
    try {
      const env = await api('/test/environments/create', { method: 'POST', body: { ...requestBody(), auto_cleanup: cleanupBox.checked } });
      ctx.toast(`Creating ${env.name}`);
      ctx.navigate(`#/environments/${env.id}`);
    } catch (err) {
      showError(err.message);
    } finally {
      createButton.disabled = false;
    }
  });

  // The quick test: the steps of `orchestrator test quick`, each waited
  // for. Unless kept, the environment is created with `auto_cleanup`, so
  // the service tears it down after its run even if this page is closed.
  quickButton.addEventListener('click', async () => {
    if (quickRunning) return;
    quickRunning = true;
    showError('');
    const keep = keepBox.checked;
    createButton.disabled = true;
    quickButton.disabled = true;
    quickSection.hidden = false;
    quickSection.scrollIntoView({ block: 'nearest' });
    quickSection.dataset.state = 'creating';
    fill(quickTable.tbody, emptyRow(7, 'The checks run once the environment is made.'));
    fill(quickSummary);
    quickStatus.textContent = 'Creating the environment: making its nodes, installing and starting its taskservs…';
    let env = null;
    let result = null;
    let failure = null;
    try {
      env = await api('/test/environments/create', { method: 'POST', body: { ...requestBody(), auto_cleanup: !keep, wait: true } });
      quickSection.dataset.env = env.id;
      if (env.status === 'ready') {
        quickSection.dataset.state = 'running';
        quickStatus.textContent = `Running the checks of ${env.name}…`;
        result = await api(`/test/environments/${env.id}/run?wait=true`, { method: 'POST' });
      } else {
        failure = `the environment is ${words(env.status)}; see its logs`;
      }
    } catch (err) {
      failure = err.message;
    }
    let fate = '';
    if (env && !keep) {
      quickSection.dataset.state = 'deleting';
      quickStatus.textContent = `Deleting ${env.name}…`;
      try {
        const deleted = await api(`/test/environments/${env.id}?wait=true`, { method: 'DELETE' });
        fate = `The environment is ${words(deleted.status)}.`;
      } catch (err) {
        fate = `Deleting the environment failed: ${err.message}`;
      }
    } else if (env) {
      fate = 'The environment is kept.';
    }
    const run = result?.last_run;
    fill(quickTable.tbody, run?.checks.length ? run.checks.map((c) => checkRow(c)) : emptyRow(7, 'No check ran.'));
    const passed = run?.status === 'passed';
    quickSection.dataset.state = 'done';
    quickSection.dataset.result = passed ? 'passed' : 'failed';
    quickStatus.textContent = failure ? `The quick test failed: ${failure}.` : runSummary(run);
    fill(quickSummary,
      run ? statusBadge(CHECK_COLOUR, run.status === 'passed' ? 'passed' : 'failed') : null, ' ',
      fate, ' ',
      env ? h('a', { href: `#/environments/${env.id}`, text: `Open ${env.name}` }) : null);
    quickRunning = false;
    createButton.disabled = false;
    quickButton.disabled = false;
    refresh();
  });

  async function refresh() {
    const mine = ++generation;
    try {
      const answer = await api('/test/environments');
      if (mine !== generation) return;
      limitsNote.hidden = !answer.limits?.unavailable;
      limitsNote.textContent = answer.limits?.unavailable
        ? `No environment can be made on this host: ${answer.limits.unavailable}` : '';
      showDeleted.checked = params.deleted === '1';
      const shown = answer.environments.filter((e) => params.deleted === '1' || e.status !== 'deleted');
      const rows = shown.map((e) => h('tr', { dataset: { envId: e.id, status: e.status } },
        h('th', { scope: 'row' }, h('a', { href: `#/environments/${e.id}`, text: e.name })),
        h('td', { text: `${TYPE_LABEL[e.type] ?? e.type}${e.topology ? ` ${e.topology}` : ''}` }),
        h('td', {}, statusBadge(ENV_COLOUR, e.status)),
        h('td', { class: 'num', text: e.nodes.length }),
        h('td', {}, time(e.created_at)),
        h('td', {}, e.status === 'deleted' ? '—' : time(e.expires_at))));
      fill(tbody, rows.length ? rows : emptyRow(6, answer.environments.length ? 'No environment is left; tick "Show deleted ones" to see the others.' : 'No environment yet.'));
      const hidden = answer.environments.length - shown.length;
      summary.textContent = `${shown.length} environment${shown.length === 1 ? '' : 's'}${hidden ? ` (${hidden} deleted not shown)` : ''}`;
      main.dataset.loaded = 'true';
    } catch (e) {
      if (mine === generation) ctx.toast(e.message, 'error');
    }
  }
  const soon = coalesce(refresh, 300);

  api('/test/topologies').then((answer) => {
    catalog = answer;
    showCatalog();
  }).catch((e) => showError(e.message));
  showDeleted.checked = params.deleted === '1';
  refresh();
  ctx.live.watch({ kind: KINDS }, { change: soon, refresh: soon });

  return {
    update(newParams) {
      if (newParams.id) return false;
      const changedList = (newParams.deleted ?? '') !== (params.deleted ?? '');
      const changedSubject = (newParams.topology ?? '') !== (params.topology ?? '')
        || (newParams.taskserv ?? '') !== (params.taskserv ?? '');
      params = newParams;
      if (changedSubject && catalog) showCatalog();
      if (changedList) refresh();
      return true;
    },
    unmount() {
      soon.cancel();
    },
  };
}

// ------------------------------------------------------ one environment

function mountEnvironment(main, ctx) {
  const id = ctx.params.id;
  let params = ctx.params;
  let view = null;
  let generation = 0;
  let logsGeneration = 0;
  const openChecks = new Set();
  const openLogs = new Set();
  const canAct = ctx.can('operator');

  const title = h('h1', { text: 'Test environment' });
  const status = h('span', { class: 'head-status', id: 'env-status', 'aria-live': 'polite' });
  const actions = h('div', { class: 'actions', role: 'group', 'aria-label': 'Environment actions' });
  const facts = h('dl', { class: 'facts-grid', id: 'env-facts' });
  const errorNote = h('p', { class: 'notice', id: 'env-error', hidden: true });
  const nodesBody = h('tbody');
  const runNote = h('p', { id: 'env-run', 'aria-live': 'polite' });
  const checks = checksTable('env-checks', 'The checks of the newest run');
  const logsButton = h('button', { type: 'button', class: 'secondary', dataset: { action: 'logs' }, 'aria-controls': 'env-logs' });
  const logsBox = h('div', { id: 'env-logs' });


  fill(main,
    h('p', { class: 'crumbs' }, h('a', { href: '#/environments', text: '← Test environments' })),
    h('div', { class: 'page-head' }, h('div', {}, title, status), actions),
    facts, errorNote,
    h('section', { 'aria-labelledby': 'env-nodes-title' },
      h('h2', { id: 'env-nodes-title', text: 'Nodes' }),
      tableWrap(h('table', { class: 'list', id: 'env-nodes' },
        h('caption', { class: 'visually-hidden', text: 'The environment\'s nodes' }),
        headRow('Node', 'Address', 'Status', 'Roles', 'Taskservs', 'Limits'),
        nodesBody))),
    h('section', { 'aria-labelledby': 'env-checks-title' },
      h('h2', { id: 'env-checks-title', text: 'Checks' }), runNote, checks.wrap),
    h('section', { 'aria-labelledby': 'env-logs-title' },
      h('div', { class: 'page-head env-head' }, h('h2', { id: 'env-logs-title', text: 'Logs' }), logsButton),
      logsBox),
  );

  async function remove() {
    const sure = await confirmDialog('Delete this environment?', 'Delete it',
      'Its nodes, their processes, namespaces, links, cgroups and files are torn down. A create or run still going is cancelled first.');
    if (!sure) return;
    try {
      await api(`/test/environments/${id}`, { method: 'DELETE' });
      ctx.toast(`Deleting ${view?.name ?? id}`);
    } catch (e) {
      ctx.toast(e.message, 'error');
    } finally {
      refresh();
    }
  }

  const showingLogs = () => params.logs === '1';
  logsButton.addEventListener('click', () => {
    params = { ...params, logs: showingLogs() ? '' : '1' };
    ctx.replace(`#/environments/${id}${query({ logs: params.logs })}`);
    showLogs();
  });

  function setStatus(value) {
    fill(status, statusBadge(ENV_COLOUR, value));
    status.dataset.envStatus = value;
  }

  function renderHead() {
    const e = view;
    ctx.setTitle(e.name);
    title.textContent = e.name;
    setStatus(e.status);
    const fact = (name, value) => [h('dt', { text: name }), h('dd', {}, value)];
    const workflow = (wid, label) => h('a', { href: `#/workflows/${wid}`, text: label });
    fill(facts,
      fact('Type', `${TYPE_LABEL[e.type] ?? e.type}${e.topology ? ` ${e.topology}` : ''}`),
      fact('Provider', e.provider),
      fact('Created', time(e.created_at)),
      fact(e.status === 'deleted' ? 'Was to expire' : 'Expires', time(e.expires_at)),
      fact('Starts its taskservs', e.auto_start ? 'once installed' : 'at its first run'),
      fact('Torn down after a run', e.auto_cleanup ? 'yes' : 'no'),
      fact('Workflows', [
        workflow(e.create_workflow, 'create'),
        e.run_workflows.map((w, i) => [', ', workflow(w, `run ${e.run_workflows.length - i}`)]),
        e.delete_workflow ? [', ', workflow(e.delete_workflow, 'delete')] : '',
      ]),
    );
    errorNote.hidden = !e.error;
    errorNote.textContent = e.error ?? '';
    const buttons = [];
    if (canAct) {
      if (e.status === 'ready') {
        const running = e.last_run?.status === 'running';
        const run = h('button', {
          type: 'button', class: 'primary', dataset: { action: 'run' }, disabled: running,
          text: running ? 'Checks running…' : e.last_run ? 'Run the checks again' : 'Run the checks',
        });
        run.addEventListener('click', async () => {
          run.disabled = true;
          try {
            await api(`/test/environments/${id}/run`, { method: 'POST' });
            ctx.toast('The checks are running');
          } catch (err) {
            ctx.toast(err.message, 'error');
          }
          refresh();
        });
        buttons.push(run);
      }
      if (e.status !== 'deleted' && e.status !== 'deleting') {
        const del = h('button', {
          type: 'button', class: 'danger', dataset: { action: 'delete' },
          text: e.status === 'delete_failed' ? 'Delete again' : 'Delete',
        });
        del.addEventListener('click', remove);
        buttons.push(del);
      }
    }
    fill(actions, ...buttons);
  }

  function renderNodes() {
    const rows = view.nodes.map((n) => h('tr', { dataset: { node: n.name, status: n.status } },
      h('th', { scope: 'row', text: n.name }),
      h('td', { class: 'mono', text: n.address }),
      h('td', {}, statusBadge(NODE_COLOUR, n.status), n.error ? h('p', { class: 'error-text wrap', text: n.error }) : null),
      h('td', { text: n.roles.join(', ') || '—' }),
      h('td', {}, h('ul', { class: 'plain' }, n.services.map((t) => h('li', { dataset: { taskserv: t.name } },
        `${t.name} :${t.port} `,
        t.simulated ? h('span', { class: 'tag', text: 'simulated' })
          : h('span', { class: 'hint', text: t.version ? `version ${t.version}` : 'not started' }))))),
      h('td', { text: limitsText(n.limits) })));
    fill(nodesBody, rows.length ? rows : emptyRow(6, 'No node.'));
  }

  function renderChecks() {
    const run = view.last_run;
    fill(runNote, runSummary(run), run ? [' ', h('a', { href: `#/workflows/${run.workflow_id}`, text: 'Its workflow' })] : '');
    runNote.dataset.status = run?.status ?? 'none';
    fill(checks.tbody, run?.checks.length ? run.checks.map((c) => checkRow(c, openChecks))
      : emptyRow(7, run ? 'This run has no check.' : canAct && view.status === 'ready' ? 'Run the checks to see them here.' : 'The checks show here once they ran.'));
  }

  async function showLogs() {
    logsButton.textContent = showingLogs() ? 'Hide the logs' : 'Show the logs';
    logsButton.setAttribute('aria-expanded', String(showingLogs()));
    if (!showingLogs()) {
      fill(logsBox, h('p', { class: 'hint', text: 'Every step\'s and check\'s output: create, runs, teardown (up to 256 KiB each).' }));
      return;
    }
    const mine = ++logsGeneration;
    let answer;
    try {
      answer = await api(`/test/environments/${id}/logs`);
    } catch (e) {
      if (mine === logsGeneration) fill(logsBox, h('p', { class: 'error-text', text: `Cannot read the logs: ${e.message}` }));
      return;
    }
    if (mine !== logsGeneration || !showingLogs()) return;
    // Runs by number, oldest first, as the entries come.
    const runs = [...new Set(answer.entries.filter((e) => e.workflow === 'run').map((e) => e.workflow_id))];
    fill(logsBox, answer.entries.length ? answer.entries.map((entry) => {
      const key = `${entry.workflow_id}/${entry.step}`;
      const kind = entry.workflow === 'run' ? `run ${runs.indexOf(entry.workflow_id) + 1}` : entry.workflow;
      const item = h('details', { class: 'log-entry', dataset: { workflow: entry.workflow, step: entry.step, status: entry.status }, open: openLogs.has(key) },
        h('summary', {}, h('span', { class: 'log-kind', text: kind }), ` ${entry.step} `, badge(entry.status)),
        entry.error ? h('p', { class: 'error-text', text: entry.error }) : null,
        h('pre', { class: 'log', tabindex: 0, 'aria-label': `Log of ${entry.step}`, text: entry.log || '(empty)' }),
        entry.truncated ? h('p', { class: 'hint', text: 'The log is longer; this is its start.' }) : null);
      item.addEventListener('toggle', () => {
        if (item.open) openLogs.add(key);
        else openLogs.delete(key);
      });
      return item;
    }) : h('p', { class: 'hint', text: 'No log yet.' }));
    logsBox.dataset.entries = String(answer.entries.length);
  }

  async function refresh() {
    const mine = ++generation;
    let answer;
    try {
      answer = await api(`/test/environments/${encodeURIComponent(id)}`);
    } catch (e) {
      if (mine !== generation) return;
      if (e.status === 404 || e.status === 400) {
        ctx.live.stop();
        fill(main, h('h1', { text: 'No such test environment' }), h('p', { text: e.message }),
          h('p', {}, h('a', { href: '#/environments', text: 'Back to the test environments' })));
        main.dataset.loaded = 'true';
      } else {
        ctx.toast(e.message, 'error');
      }
      return;
    }
    if (mine !== generation) return;
    view = answer;
    renderHead();
    renderNodes();
    renderChecks();
    main.dataset.loaded = 'true';
    if (showingLogs()) showLogs();
  }
  const soon = coalesce(refresh, 250);

  showLogs();
  refresh();
  ctx.live.watch({ kind: KINDS }, {
    change(event) {
      if (event.environment_id !== id) return;
      // The new status at once; the re-read brings the nodes and checks.
      if (event.status) setStatus(event.status);
      soon();
    },
    refresh: soon,
  });

  return {
    update(newParams) {
      if (newParams.id !== id) return false;
      const logsChanged = (newParams.logs ?? '') !== (params.logs ?? '');
      params = newParams;
      if (logsChanged) showLogs();
      return true;
    },
    unmount() {
      soon.cancel();
    },
  };
}
