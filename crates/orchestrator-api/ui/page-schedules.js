// Schedules: the list (each expression in words, its zone, the next three
// runs and the last one), one schedule with its runs (`#/schedules/ID`),
// and a new schedule from a template's generated form (`?new=1`) with a
// preview of its next runs. When a schedule is due is the service's to
// say: `next_runs` and `POST /schedules/preview` come from its cron engine
// and zone database; this page only words and formats them.
//
// Live: `schedule_changed` (a schedule, or one of its due runs, was
// stored) re-reads the page; workflow events re-read it when they are
// about a run it shows.

import { api, query } from './api.js';
import { describeCron } from './cron-words.js';
import { badge, coalesce, confirmDialog, fill, h, tableWrap } from './dom.js';
import { field, inputFields, readVars, templateChooser } from './page-submit.js';

const OVERLAP = {
  skip: 'skip (a due run while the previous one goes is skipped)',
  queue: 'queue (it waits for the previous one)',
  cancel_previous: 'cancel previous (it cancels the previous one, then starts)',
};
const CATCH_UP = {
  none: 'none (due times missed while down never start)',
  latest: 'latest (the newest missed one starts)',
  all: 'all (every missed one within the window starts)',
};
const WORKFLOW_KINDS = ['workflow_status_changed', 'completed', 'failed', 'cancelled'];
/** The colour of each claim state: the status it resembles. */
const CLAIM_COLOUR = {
  claimed: 'queued', waiting: 'scheduled', started: 'running', skipped: 'skipped', missed: 'not_started', failed: 'failed',
};

/** The expression in words, with the expression itself beside it. */
function cronWords(cron) {
  const words = describeCron(cron);
  return h('span', { class: 'cron' },
    words ? h('span', { class: 'cron-words', text: words }) : null,
    h('code', { class: 'cron-raw', text: cron }));
}

/** A due time as the schedule's zone shows it, the exact UTC time in its attribute. */
function zoned(iso, timezone) {
  if (!iso) return '—';
  let text;
  try {
    text = new Intl.DateTimeFormat(undefined, {
      timeZone: timezone, weekday: 'short', day: 'numeric', month: 'short', year: 'numeric',
      hour: '2-digit', minute: '2-digit', hourCycle: 'h23', timeZoneName: 'short',
      // Seconds only where they say something (six-field expressions).
      second: new Date(iso).getUTCSeconds() ? '2-digit' : undefined,
    }).format(new Date(iso));
  } catch {
    text = iso; // a zone the browser does not know: the UTC time as it is
  }
  return h('time', { datetime: iso, title: `${iso} (UTC)`, text });
}

function nextRuns(schedule) {
  if (schedule.paused) return h('span', { class: 'hint', text: 'paused' });
  if (!schedule.next_runs?.length) return h('span', { class: 'hint', text: 'no further run' });
  return h('ol', { class: 'next-runs' }, schedule.next_runs.map((t) => h('li', {}, zoned(t, schedule.timezone))));
}

/** A run: when it was due, what became of it, and its workflow with its status. */
function runCell(run, schedule, workflows) {
  if (!run) return h('span', { class: 'hint', text: 'none yet' });
  const workflow = run.workflow_id ? workflows.get(run.workflow_id) : null;
  return h('div', { class: 'run', dataset: { state: run.state } },
    zoned(run.due, schedule.timezone), ' ',
    badge(CLAIM_COLOUR[run.state] ?? 'queued', run.state),
    run.workflow_id ? [' ', h('a', { href: `#/workflows/${run.workflow_id}`, text: workflow?.name ?? 'workflow' }),
      workflow ? [' ', badge(workflow.status)] : null] : null,
    run.missed ? h('span', { class: 'hint', text: ` (${run.missed} missed)` }) : null,
    run.reason ? h('div', { class: 'hint', text: run.reason }) : null);
}

export function mount(main, ctx) {
  let params = ctx.params;
  let generation = 0;
  /** The workflows of the runs shown: their events re-read the page. */
  let shown = new Set();
  let view = null; // what is mounted: 'list', 'one' or 'new'
  const canAct = ctx.can('operator');

  /** The name and status of each workflow of `ids`, by id. */
  async function workflowsOf(ids) {
    const found = new Map();
    await Promise.all([...new Set(ids)].map(async (id) => {
      try {
        const w = await api(`/workflows/${id}`);
        found.set(id, { name: w.name, status: w.status });
      } catch {
        // pruned by retention: the run still shows, without a status
      }
    }));
    return found;
  }

  /** The same for a schedule's runs: one listing by their trace id. */
  async function runWorkflows(schedule) {
    const answer = await api(`/workflows${query({ trace_id: `schedule:${schedule.id}`, limit: 50 })}`);
    return new Map(answer.workflows.map((w) => [w.id, { name: w.name, status: w.status }]));
  }

  async function act(button, action) {
    button.disabled = true;
    try {
      await action();
    } catch (e) {
      ctx.toast(e.message, 'error');
    } finally {
      button.disabled = false;
    }
  }

  /** Pause or resume, and delete, for an operator. */
  function actions(schedule, after) {
    if (!canAct) return null;
    const toggle = h('button', {
      type: 'button', dataset: { action: schedule.paused ? 'resume' : 'pause' },
      text: schedule.paused ? 'Resume' : 'Pause', 'aria-label': `${schedule.paused ? 'Resume' : 'Pause'} ${schedule.name}`,
    });
    toggle.addEventListener('click', () => act(toggle, async () => {
      await api(`/schedules/${schedule.id}`, { method: 'PATCH', body: { paused: !schedule.paused } });
      ctx.toast(`${schedule.paused ? 'Resumed' : 'Paused'} ${schedule.name}`);
      refresh();
    }));
    const remove = h('button', {
      type: 'button', class: 'danger', dataset: { action: 'delete' }, text: 'Delete', 'aria-label': `Delete ${schedule.name}`,
    });
    remove.addEventListener('click', () => act(remove, async () => {
      const sure = await confirmDialog(`Delete the schedule ${schedule.name}?`, 'Delete schedule',
        'No further run starts. Runs already started go on.');
      if (!sure) return;
      await api(`/schedules/${schedule.id}`, { method: 'DELETE' });
      ctx.toast(`Deleted ${schedule.name}`);
      after();
    }));
    return h('div', { class: 'actions' }, toggle, remove);
  }

  // The list.

  function mountList() {
    const tbody = h('tbody');
    fill(main,
      h('div', { class: 'page-head' },
        h('h1', { text: 'Schedules' }),
        canAct ? h('a', { class: 'button', href: '#/schedules?new=1', text: 'New schedule' }) : null),
      h('p', { class: 'hint', text: 'Each schedule runs a registered template again and again, on a cron expression read in its time zone. Times are shown in each schedule\'s zone.' }),
      tableWrap(h('table', { class: 'list', id: 'schedules' },
        h('caption', { class: 'visually-hidden', text: 'Schedules, oldest first' }),
        h('thead', {}, h('tr', {}, ['Name', 'Template', 'When', 'Time zone', 'Next runs', 'Last run', 'Overlap', canAct ? 'Actions' : null]
          .filter(Boolean).map((c) => h('th', { scope: 'col', text: c })))),
        tbody)));
    ctx.setTitle('Schedules');
    return async (mine) => {
      const answer = await api('/schedules');
      const workflows = await workflowsOf(answer.schedules.map((s) => s.last_run?.workflow_id).filter(Boolean));
      if (mine !== generation) return;
      shown = new Set(workflows.keys());
      const rows = answer.schedules.map((s) => h('tr', { dataset: { scheduleId: s.id, paused: String(s.paused) } },
        h('th', { scope: 'row' }, h('a', { href: `#/schedules/${s.id}`, text: s.name }),
          s.paused ? [' ', badge('cancelled', 'paused')] : null),
        h('td', { text: s.template }),
        h('td', {}, cronWords(s.cron)),
        h('td', { text: s.timezone }),
        h('td', {}, nextRuns(s)),
        h('td', {}, runCell(s.last_run, s, workflows)),
        h('td', { text: s.overlap.replace('_', ' ') }),
        canAct ? h('td', {}, actions(s, refresh)) : null));
      if (rows.length === 0) {
        rows.push(h('tr', {}, h('td', { colspan: canAct ? 8 : 7, class: 'empty', text: 'No schedule yet.' })));
      }
      fill(tbody, ...rows);
    };
  }

  // One schedule.

  function mountOne(id) {
    const body = h('div', { id: 'schedule' });
    fill(main, h('p', { class: 'crumbs' }, h('a', { href: '#/schedules', text: '← Schedules' })), body);
    return async (mine) => {
      let s;
      try {
        s = await api(`/schedules/${encodeURIComponent(id)}`);
      } catch (e) {
        if (e.status !== 404 && e.status !== 400) throw e;
        fill(body, h('h1', { text: 'No such schedule' }), h('p', { text: e.message }));
        ctx.setTitle('No such schedule');
        return;
      }
      const workflows = await runWorkflows(s);
      if (mine !== generation) return;
      shown = new Set(workflows.keys());
      ctx.setTitle(`Schedule ${s.name}`);
      const fact = (label, value) => [h('dt', { text: label }), h('dd', {}, value)];
      const rows = s.runs.map((r) => {
        const w = r.workflow_id ? workflows.get(r.workflow_id) : null;
        return h('tr', { dataset: { state: r.state } },
          h('td', {}, zoned(r.due, s.timezone)),
          h('td', {}, badge(CLAIM_COLOUR[r.state] ?? 'queued', r.state)),
          h('td', {}, r.workflow_id ? h('a', { href: `#/workflows/${r.workflow_id}`, text: w?.name ?? r.workflow_id }) : '—'),
          h('td', {}, w ? badge(w.status) : '—'),
          h('td', { class: 'wrap', text: [r.reason, r.missed ? `${r.missed} due time(s) missed` : ''].filter(Boolean).join('; ') }),
          h('td', { class: 'mono', text: r.node }));
      });
      if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 6, class: 'empty', text: 'No due run yet.' })));
      fill(body,
        h('div', { class: 'page-head' },
          h('div', {}, h('h1', { text: s.name }), s.paused ? badge('cancelled', 'paused') : badge('completed', 'active')),
          actions(s, () => ctx.navigate('#/schedules'))),
        h('dl', { class: 'facts-grid' },
          fact('Template', h('a', { href: `#/submit${query({ template: s.template })}`, text: s.template_version ? `${s.template} v${s.template_version}` : s.template })),
          fact('When', cronWords(s.cron)),
          fact('Time zone', s.timezone),
          fact('Overlap', OVERLAP[s.overlap] ?? s.overlap),
          fact('Catch-up', `${CATCH_UP[s.catch_up] ?? s.catch_up}; window ${s.catch_up_window_secs} s`),
          fact('Starts', s.start_at ? zoned(s.start_at, s.timezone) : 'at once'),
          fact('Ends', s.end_at ? zoned(s.end_at, s.timezone) : 'never'),
          fact('Active since', zoned(s.active_since, s.timezone)),
          s.submitted_by ? fact('Runs submitted by', s.submitted_by) : null,
          fact('Inputs', h('code', { text: JSON.stringify(s.vars) }))),
        h('h2', { text: 'Next runs' }), nextRuns(s),
        h('h2', { id: 'runs-title', text: 'Runs' }),
        h('p', { class: 'hint', text: 'The newest 20 due runs, newest first, each with what became of it.' }),
        tableWrap(h('table', { class: 'list', id: 'schedule-runs', 'aria-labelledby': 'runs-title' },
          h('thead', {}, h('tr', {}, ['Due', 'State', 'Workflow', 'Status', 'Why', 'Node'].map((c) => h('th', { scope: 'col', text: c })))),
          h('tbody', {}, rows))));
    };
  }

  // A new schedule.

  function mountNew() {
    ctx.setTitle('New schedule');
    if (!canAct) {
      fill(main, h('h1', { text: 'New schedule' }),
        h('p', { class: 'notice', text: `Creating a schedule needs the operator role; you are ${ctx.session.role}.` }));
      return async () => {};
    }
    let fields = new Map();
    const templateSelect = h('select', { id: 'schedule-template', name: 'template', required: true });
    const about = h('p', { class: 'hint', id: 'schedule-about' });
    const inputsBox = h('fieldset', { class: 'inputs' }, h('legend', { text: 'Inputs' }));
    const name = field('name', 'Name (optional)', h('input', { type: 'text', autocomplete: 'off' }), 'For people; the template\'s name when empty.');
    const cron = field('cron', 'Cron expression', h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false', class: 'mono', value: '0 2 * * *' }),
      'minute hour day month weekday, e.g. 0 2 * * * or */15 * * * 1-5 (six fields: seconds first).', true);
    const cronSaid = h('p', { class: 'cron-said', id: 'schedule-cron-words', 'aria-live': 'polite' });
    const zones = typeof Intl.supportedValuesOf === 'function' ? Intl.supportedValuesOf('timeZone') : [];
    const timezone = field('timezone', 'Time zone', h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false', value: 'UTC', list: 'schedule-zones' }),
      'An IANA zone: UTC, Europe/Berlin, America/New_York ...');
    const overlap = field('overlap', 'When the previous run is still going',
      h('select', {}, Object.entries(OVERLAP).map(([v, t]) => h('option', { value: v, text: t }))));
    const catchUp = field('catch_up', 'After downtime',
      h('select', {}, Object.entries(CATCH_UP).map(([v, t]) => h('option', { value: v, text: t }))));
    const startAt = field('start_at', 'Start at (optional)', h('input', { type: 'text', autocomplete: 'off', placeholder: '2026-12-01T00:00:00Z' }),
      'No due time before this (RFC 3339, e.g. 2026-12-01T00:00:00Z).');
    const endAt = field('end_at', 'End at (optional)', h('input', { type: 'text', autocomplete: 'off', placeholder: '2027-01-01T00:00:00Z' }),
      'No due time after this.');
    const paused = field('paused', 'Create it paused', h('input', { type: 'checkbox' }), 'A paused schedule starts nothing until resumed.');
    const own = [name, cron, timezone, overlap, catchUp, startAt, endAt, paused];
    const formError = h('p', { class: 'form-error', id: 'schedule-error', role: 'alert', hidden: true });
    const previewList = h('ol', { class: 'next-runs', id: 'schedule-preview' });
    const previewNote = h('p', { class: 'hint', id: 'schedule-preview-note', 'aria-live': 'polite' });
    const previewButton = h('button', { type: 'button', dataset: { action: 'preview' }, text: 'Preview next runs' });
    const createButton = h('button', { type: 'submit', class: 'primary', dataset: { action: 'create' }, text: 'Create schedule' });
    const form = h('form', { class: 'submit-form', id: 'schedule-form', novalidate: true, 'aria-labelledby': 'new-title' },
      h('div', { class: 'field' }, h('label', { for: 'schedule-template', text: 'Template' }), templateSelect),
      about,
      inputsBox,
      h('fieldset', { class: 'inputs' }, h('legend', { text: 'When' }),
        name.wrap, cron.wrap, cronSaid, timezone.wrap, h('datalist', { id: 'schedule-zones' }, zones.map((z) => h('option', { value: z }))),
        startAt.wrap, endAt.wrap, overlap.wrap, catchUp.wrap, paused.wrap),
      h('section', { class: 'preview', 'aria-labelledby': 'preview-title' },
        h('h2', { id: 'preview-title', text: 'Next runs' }), previewNote, previewList),
      formError,
      h('div', { class: 'actions' }, previewButton, createButton));
    fill(main,
      h('p', { class: 'crumbs' }, h('a', { href: '#/schedules', text: '← Schedules' })),
      h('h1', { id: 'new-title', text: 'New schedule' }),
      form);

    function clearErrors() {
      formError.hidden = true;
      for (const f of [...fields.values(), ...own]) {
        f.errorEl.hidden = true;
        f.errorEl.textContent = '';
        f.control.removeAttribute('aria-invalid');
      }
    }

    /** Shows a message next to the field it names (`cron: ...`, `vars.x: ...`), else above the buttons. */
    function showError(message, f) {
      const path = message.split(':')[0].trim();
      const input = /^vars\.([^.[\s]+)/.exec(path);
      f ??= (input && fields.get(input[1])) || own.find((o) => o.name === path);
      if (f) {
        f.errorEl.textContent = message;
        f.errorEl.hidden = false;
        f.control.setAttribute('aria-invalid', 'true');
      } else {
        formError.textContent = message;
        formError.hidden = false;
      }
      return f;
    }

    const text = (f) => f.control.value.trim() || undefined;
    const times = () => ({ cron: cron.control.value.trim(), timezone: text(timezone), start_at: text(startAt), end_at: text(endAt) });

    let previewGeneration = 0;
    async function preview() {
      const mine = ++previewGeneration;
      const words = describeCron(cron.control.value);
      cronSaid.textContent = words ? `Runs ${words}.` : '';
      for (const f of [cron, timezone, startAt, endAt]) {
        f.errorEl.hidden = true;
        f.control.removeAttribute('aria-invalid');
      }
      try {
        const answer = await api('/schedules/preview', { method: 'POST', body: times() });
        if (mine !== previewGeneration) return;
        const zone = text(timezone) ?? 'UTC';
        fill(previewList, answer.next_runs.map((t) => h('li', {}, zoned(t, zone))));
        previewNote.textContent = answer.next_runs.length
          ? `The next ${answer.next_runs.length === 1 ? 'run' : `${answer.next_runs.length} runs`}, in ${zone}:`
          : 'It would not run again (past its end).';
      } catch (e) {
        if (mine !== previewGeneration) return;
        fill(previewList);
        previewNote.textContent = 'No preview: see the error above.';
        showError(e.message);
      }
    }
    const previewSoon = coalesce(preview, 400);
    for (const f of [cron, timezone, startAt, endAt]) f.control.addEventListener('input', previewSoon);
    previewButton.addEventListener('click', preview);

    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      clearErrors();
      let vars;
      try {
        vars = readVars(fields);
      } catch (err) {
        showError(err.message, err.field)?.control.focus();
        return;
      }
      const payload = {
        template: templateSelect.value, vars, ...times(), name: text(name),
        overlap: overlap.control.value, catch_up: catchUp.control.value, paused: paused.control.checked,
      };
      createButton.disabled = true;
      try {
        const created = await api('/schedules', { method: 'POST', body: payload });
        ctx.toast(`Created ${created.name}`);
        ctx.navigate(`#/schedules/${created.id}`);
      } catch (err) {
        showError(err.message)?.control.focus();
      } finally {
        createButton.disabled = false;
      }
    });

    const choose = templateChooser(templateSelect, {
      chosen: (refName) => ctx.replace(`#/schedules${query({ new: 1, template: refName })}`),
      show: (template) => {
        about.textContent = [template.name, template.description].filter(Boolean).join(': ');
        fields = inputFields(template);
        fill(inputsBox, h('legend', { text: 'Inputs of every run' }),
          fields.size ? [...fields.values()].map((f) => f.wrap) : h('p', { class: 'hint', text: 'This template takes no input.' }));
        clearErrors();
      },
      failed: (message) => showError(message),
    });

    return async () => {
      if (templateSelect.options.length) return; // loaded once; the form keeps what was typed
      const answer = await api('/templates');
      const newest = new Map();
      for (const t of answer.templates) newest.set(t.ref_name, t);
      fill(templateSelect, [...newest.values()].map((t) => h('option', { value: t.ref_name, text: `${t.ref_name} — ${t.name}` })));
      const wanted = params.template;
      await choose(newest.has(wanted) ? wanted : [...newest.keys()][0] ?? '');
      await preview();
    };
  }

  let load = null;
  function show() {
    const wanted = params.id ? `one:${params.id}` : params.new ? 'new' : 'list';
    if (wanted !== view) {
      view = wanted;
      shown = new Set();
      delete main.dataset.loaded;
      load = params.id ? mountOne(params.id) : params.new ? mountNew() : mountList();
    }
    refresh();
  }

  async function refresh() {
    const mine = ++generation;
    try {
      await load(mine);
      if (mine === generation) main.dataset.loaded = 'true';
    } catch (e) {
      if (mine === generation) ctx.toast(e.message, 'error');
    }
  }
  const soon = coalesce(refresh, 300);

  show();
  ctx.live.watch({ kind: ['schedule_changed', ...WORKFLOW_KINDS] }, {
    change(event) {
      if (view === 'new') return; // the form is not re-read under the typing
      if (event.kind === 'schedule_changed' || shown.has(event.workflow_id)) soon();
    },
    refresh() {
      if (view !== 'new') soon();
    },
  });

  return {
    update(newParams) {
      params = newParams;
      show();
      return true;
    },
    unmount() {
      soon.cancel();
    },
  };
}
