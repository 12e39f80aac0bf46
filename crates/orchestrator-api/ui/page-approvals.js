// Approvals: the inbox of approval gates waiting for a decision
// (`GET /approvals`), and the selected gate (`?workflow=<id>&step=<s>`,
// from `GET /workflows/{id}/approval`) with its digest, what the digest
// covers, who may decide, and the decision form. A decision sends the
// digest shown; a stale one is refused (409) and the gate is read again,
// so the decider sees what changed before deciding anew.
//
// Whether a token may decide is the gate's rule, judged by the service:
// the page hides the buttons only where the rule plainly says no (the
// role, the named tokens, a submitter's approval), and shows whatever the
// service refuses.

import { api, query } from './api.js';
import { coalesce, fill, h, tableWrap, time } from './dom.js';

const KINDS = [
  'approval_requested', 'approved', 'rejected', 'approval_invalidated', 'approval_timed_out',
  // A gate also ends when its workflow is cancelled, or is closed again by a retry.
  'cancelled', 'reset', 'workflow_status_changed',
];
const ROLES = ['viewer', 'operator', 'admin'];

/** Who may decide, in words. */
function approversText(gate) {
  const who = gate.approvers.role
    ? `any ${gate.approvers.role}${gate.approvers.role === 'operator' ? ' or admin' : ''} token`
    : `the tokens ${gate.approvers.tokens.join(', ')}`;
  const submitter = gate.allow_submitter
    ? 'its submitter may approve it too'
    : `not its submitter${gate.submitter ? ` (${gate.submitter})` : ''}, who may only reject it`;
  return `${who}; ${gate.required} approval${gate.required === 1 ? '' : 's'} needed, each by a different token; ${submitter}`;
}

/** What the gate's own rule says of this session, before the service judges. */
function mayDecide(gate, session) {
  const roleOk = !gate.approvers.role || ROLES.indexOf(session.role) >= ROLES.indexOf(gate.approvers.role);
  const tokenOk = !gate.approvers.tokens?.length || gate.approvers.tokens.includes(session.name);
  if (!roleOk || !tokenOk) return { approve: false, reject: false, why: `Your token (${session.name}, ${session.role}) may not decide this gate: ${gate.approvers.role ? `it needs the ${gate.approvers.role} role` : `only ${gate.approvers.tokens.join(', ')} may`}.` };
  if (gate.approvals.some((a) => a.by === session.name)) {
    return { approve: false, reject: true, why: 'You approved this gate already; it waits for another token. You may still reject it.' };
  }
  if (!gate.allow_submitter && gate.submitter && gate.submitter === session.name) {
    return { approve: false, reject: true, why: 'You submitted this workflow: this gate does not let its submitter approve it. You may reject it.' };
  }
  return { approve: true, reject: true, why: null };
}

export function mount(main, ctx) {
  let params = ctx.params;
  let generation = 0;
  // What the page must tell of the selected gate (a refused decision, a
  // new digest): kept across live re-reads until another gate is chosen
  // or a decision goes through.
  let notice = null;
  let shown = ''; // the gate and notice on screen, to leave the form be when nothing changed
  ctx.setTitle('Approvals');

  const inboxBody = h('tbody');
  const count = h('span', { class: 'page-summary', 'aria-live': 'polite' });
  const detail = h('section', { class: 'gate-panel', id: 'gate', 'aria-labelledby': 'gate-title' });

  fill(main,
    h('div', { class: 'page-head' }, h('h1', { text: 'Approvals' }), count),
    h('p', { class: 'hint', text: 'Approval gates waiting for a decision, oldest first. Each decision signs a digest of what the gated steps would run with; when that changes, the digest changes and a decision on the old one is refused.' }),
    tableWrap(h('table', { class: 'list', id: 'approvals' },
      h('caption', { class: 'visually-hidden', text: 'Gates waiting for a decision' }),
      h('thead', {}, h('tr', {}, ['Workflow', 'Gate', 'Waiting since', 'Deadline', 'Approvals', 'Digest']
        .map((c) => h('th', { scope: 'col', text: c })))),
      inboxBody)),
    detail,
  );

  const gateHref = (g) => `#/approvals${query({ workflow: g.workflow_id, step: g.step })}`;

  function renderInbox(items) {
    const rows = items.map((g) => {
      const current = params.workflow === g.workflow_id && (!params.step || params.step === g.step);
      return h('tr', { dataset: { workflowId: g.workflow_id, step: g.step }, 'aria-current': current ? 'true' : null },
        h('td', {}, h('a', { href: gateHref(g), text: g.workflow_name })),
        h('td', { class: 'mono', text: g.step }),
        h('td', {}, time(g.opened_at)),
        h('td', {}, time(g.deadline), ` (then ${g.on_timeout})`),
        h('td', { class: 'num', text: `${g.approvals.length} of ${g.required}` }),
        h('td', { class: 'mono', title: g.digest, text: `${g.digest.slice(0, 12)}…` }));
    });
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 6, class: 'empty', text: 'No gate waits for a decision.' })));
    fill(inboxBody, ...rows);
    count.textContent = `${items.length} waiting`;
  }

  /** The selected gate: what it covers, who decides, and the decision form. */
  function renderGate(gate, notice) {
    const hash = (value) => h('code', { class: 'hash', text: value });
    const covers = gate.covers;
    const scripts = Object.entries(covers.scripts ?? {});
    const outputs = Object.entries(covers.outputs ?? {});
    const fact = (name, value) => [h('dt', { text: name }), h('dd', {}, value)];
    const decision = decisionForm(gate);
    fill(detail,
      h('div', { class: 'page-head' },
        h('h2', { id: 'gate-title', text: `${gate.workflow_name}: ${gate.step}` }),
        h('a', { href: `#/workflows/${gate.workflow_id}`, text: 'Open the workflow →' })),
      notice ? h('p', { class: 'notice', id: 'gate-notice', role: 'alert', text: notice }) : null,
      h('dl', { class: 'facts-grid' },
        fact('Waiting since', time(gate.opened_at)),
        fact('Deadline', [time(gate.deadline), ` (then ${gate.on_timeout})`]),
        fact('Submitted by', gate.submitter ?? '—'),
        fact('Approvals', `${gate.approvals.length} of ${gate.required}`)),
      h('p', {}, h('strong', { text: 'Who may decide: ' }), approversText(gate)),
      h('h3', { text: 'Digest' }),
      h('p', {}, h('code', { class: 'hash digest', id: 'gate-digest', text: gate.digest })),
      h('p', { class: 'hint', text: 'SHA-256 of the parts below, as the service reads them now. A decision signs this digest.' }),
      tableWrap(h('table', { class: 'list', id: 'gate-covers' },
        h('caption', { class: 'visually-hidden', text: 'What the digest covers' }),
        h('thead', {}, h('tr', {}, ['Part', 'What', 'SHA-256'].map((c) => h('th', { scope: 'col', text: c })))),
        h('tbody', {},
          h('tr', { dataset: { part: 'inputs' } }, h('th', { scope: 'row', text: 'Inputs' }), h('td', { text: 'the workflow\'s inputs, defaults applied' }), h('td', {}, hash(covers.inputs))),
          h('tr', { dataset: { part: 'template' } }, h('th', { scope: 'row', text: 'Template' }),
            h('td', { class: 'mono', text: covers.template.split(' sha256:')[0] }), h('td', {}, hash(covers.template.split(' sha256:')[1] ?? covers.template))),
          scripts.map(([path, value]) => h('tr', { dataset: { part: 'script', path } },
            h('th', { scope: 'row', text: 'Script' }), h('td', { class: 'mono', text: path }), h('td', {}, hash(value)))),
          outputs.map(([step, value]) => h('tr', { dataset: { part: 'output', step } },
            h('th', { scope: 'row', text: 'Output' }), h('td', { class: 'mono', text: `${step} (covered step)` }), h('td', {}, hash(value)))),
          scripts.length === 0 ? h('tr', {}, h('th', { scope: 'row', text: 'Scripts' }), h('td', { colspan: 2, text: 'none run after the gate' })) : null,
        ))),
      gate.approvals.length ? [
        h('h3', { text: 'Approvals so far' }),
        h('ul', { class: 'verdicts' }, gate.approvals.map((a) => h('li', {},
          `${a.choice} by ${a.by}, `, time(a.at), a.comment ? ` · “${a.comment}”` : '',
          ' · digest ', h('code', { class: 'hash', text: `${a.digest.slice(0, 12)}…` })))),
      ] : null,
      decision,
    );
  }

  function decisionForm(gate) {
    const may = mayDecide(gate, ctx.session);
    if (!may.approve && !may.reject) return h('p', { class: 'hint', id: 'gate-no-decision', text: may.why });
    const comment = h('textarea', { id: 'gate-comment', name: 'comment', rows: 3, maxLength: 2048, 'aria-describedby': 'gate-comment-hint' });
    const error = h('p', { id: 'gate-error', class: 'form-error', role: 'alert', hidden: true });
    const buttons = [];
    const send = (choice) => async () => {
      error.hidden = true;
      for (const b of buttons) b.disabled = true;
      const body = { digest: gate.digest, step: gate.step };
      if (comment.value.trim()) body.comment = comment.value.trim();
      try {
        const outcome = await api(`/workflows/${gate.workflow_id}/${choice}`, { method: 'POST', body });
        ctx.toast(choice === 'approve'
          ? (outcome.status === 'completed' ? `Approved: ${gate.workflow_name} goes on` : `Approval counted (${outcome.approvals} of ${outcome.required})`)
          : `Rejected: the gated steps of ${gate.workflow_name} are skipped`);
        notice = null;
        refresh();
      } catch (e) {
        if (e.status === 409) {
          // Stale, decided meanwhile, or no longer waiting: read it again
          // and say what the service said.
          notice = `The service refused the decision: ${e.message}. The gate as it is now is shown below; check it before deciding again.`;
          refresh();
        } else {
          error.textContent = e.message;
          error.hidden = false;
          for (const b of buttons) b.disabled = false;
        }
      }
    };
    if (may.approve) buttons.push(h('button', { type: 'button', class: 'primary', dataset: { action: 'approve' }, text: 'Approve this digest', on: { click: send('approve') } }));
    if (may.reject) buttons.push(h('button', { type: 'button', class: 'danger', dataset: { action: 'reject' }, text: 'Reject', on: { click: send('reject') } }));
    return h('form', { class: 'decision', 'aria-labelledby': 'decision-title', on: { submit: (e) => e.preventDefault() } },
      h('h3', { id: 'decision-title', text: 'Decision' }),
      may.why ? h('p', { class: 'hint', id: 'gate-no-approve', text: may.why }) : null,
      h('div', { class: 'field' }, h('label', { for: 'gate-comment', text: 'Comment' }), comment,
        h('small', { id: 'gate-comment-hint', class: 'hint', text: 'Why (optional, at most 2048 bytes); a rejection\'s comment becomes the gate\'s error.' })),
      h('div', { class: 'actions' }, buttons),
      error);
  }

  async function refresh() {
    const mine = ++generation;
    const selected = params.workflow;
    try {
      const [inbox, gate] = await Promise.all([
        api('/approvals'),
        selected
          ? api(`/workflows/${encodeURIComponent(selected)}/approval${query({ step: params.step })}`).catch((e) => e)
          : Promise.resolve(null),
      ]);
      if (mine !== generation) return;
      renderInbox(inbox.items);
      if (!selected) {
        fill(detail, h('h2', { id: 'gate-title', text: 'Gate' }),
          h('p', { class: 'hint', text: inbox.items.length ? 'Choose a gate above to see what its digest covers and to decide.' : 'Nothing to decide.' }));
      } else if (gate instanceof Error) {
        fill(detail, h('h2', { id: 'gate-title', text: 'Gate' }),
          notice ? h('p', { class: 'notice', id: 'gate-notice', role: 'alert', text: notice }) : null,
          h('p', { class: 'notice', id: 'gate-gone', text: gate.status === 409 ? `No gate of this workflow waits for a decision now (${gate.message}).` : gate.message }),
          h('p', {}, h('a', { href: `#/workflows/${selected}`, text: 'Open the workflow →' })));
      } else {
        const key = JSON.stringify([gate, notice]);
        if (key === shown && detail.querySelector('#gate-digest')) {
          main.dataset.loaded = 'true';
          return;
        }
        // Keep a comment being typed across a live re-read.
        const typed = detail.querySelector('#gate-comment')?.value;
        const shownDigest = detail.querySelector('#gate-digest')?.textContent;
        if (!notice && shownDigest && shownDigest !== gate.digest) {
          notice = 'What this gate covers changed: the digest below is new. Check it before deciding.';
        }
        renderGate(gate, notice);
        shown = JSON.stringify([gate, notice]);
        const box = detail.querySelector('#gate-comment');
        if (box && typed) box.value = typed;
      }
      main.dataset.loaded = 'true';
    } catch (e) {
      if (mine === generation) ctx.toast(e.message, 'error');
    }
  }
  const soon = coalesce(refresh, 300);

  refresh();
  ctx.live.watch({ kind: KINDS }, { change: soon, refresh: soon });
  return {
    update(newParams) {
      if (newParams.workflow !== params.workflow || newParams.step !== params.step) notice = null;
      params = newParams;
      refresh();
      return true;
    },
    unmount() {
      soon.cancel();
    },
  };
}
