// Notifications (admins only; the service refuses others anyway): the
// webhook subscriptions (list, create, delete), the delivery log with
// each attempt, filtered by subscription (`?webhook=<id>`), and re-sends.
// A subscription's signing secret is shown once, in the answer to its
// creation, as a token is.
//
// Deliveries have no event of their own: the page re-reads the log when
// a workflow event that can make one arrives (on the one stream), and,
// while a delivery is pending, once more at its next attempt.

import { api, query } from './api.js';
import { badge, coalesce, confirmButton, fill, h, shownOnce, tableWrap, time } from './dom.js';

const EVENT_TYPES = [
  ['workflow.completed', 'a workflow completed'],
  ['workflow.failed', 'a workflow failed'],
  ['workflow.cancelled', 'a workflow was cancelled'],
  ['step.failed', 'a step failed for good'],
  ['schedule.missed', 'a schedule missed runs'],
  ['approval.requested', 'an approval gate opened'],
];
/** Workflow events that may store a delivery. */
const KINDS = ['completed', 'failed', 'cancelled', 'workflow_status_changed', 'approval_requested'];
const PAGE = 50;
/** Delivery statuses in the colours of the statuses they resemble. */
const DELIVERY_COLOUR = { pending: 'queued', delivered: 'completed', failed: 'failed' };

export function mount(main, ctx) {
  let params = ctx.params;
  let generation = 0;
  let subscriptions = [];
  let wake = null;
  ctx.setTitle('Notifications');

  const subBody = h('tbody');
  const url = h('input', { id: 'webhook-url', name: 'url', type: 'url', required: true, maxLength: 2048, autocomplete: 'off', spellcheck: 'false', placeholder: 'http://hooks.example.com/incoming', 'aria-describedby': 'webhook-url-hint' });
  const events = EVENT_TYPES.map(([type, words]) => {
    const box = h('input', { type: 'checkbox', id: `webhook-event-${type.replace('.', '-')}`, name: 'events', value: type });
    return { type, box, field: h('div', { class: 'field check' }, box, h('label', { for: box.id }, h('code', { text: type }), ` · ${words}`)) };
  });
  const bodyTemplate = h('textarea', { id: 'webhook-body', name: 'body_template', rows: 4, spellcheck: 'false', class: 'mono', 'aria-describedby': 'webhook-body-hint' });
  const description = h('input', { id: 'webhook-description', name: 'description', type: 'text', maxLength: 1024, autocomplete: 'off' });
  const formError = h('p', { id: 'webhook-form-error', class: 'form-error', role: 'alert', hidden: true });
  const createButton = h('button', { type: 'submit', class: 'primary', text: 'Add subscription' });
  const form = h('form', { class: 'inline-form', id: 'webhook-form', 'aria-labelledby': 'webhook-form-title' },
    h('h3', { id: 'webhook-form-title', text: 'New subscription' }),
    h('div', { class: 'field' }, h('label', { for: 'webhook-url', text: 'URL' }), url,
      h('small', { id: 'webhook-url-hint', class: 'hint', text: 'Its host must be in the service\'s HTTP allowlist (--http-allow). No redirect is followed.' })),
    h('fieldset', { class: 'events' }, h('legend', { text: 'Events' }), events.map((e) => e.field)),
    h('div', { class: 'field' }, h('label', { for: 'webhook-body', text: 'Body template (JSON, optional)' }), bodyTemplate,
      h('small', { id: 'webhook-body-hint', class: 'hint', text: 'An object whose strings may hold ${event.summary}, ${event.workflow_id}, ... Empty: the Standard Webhooks body.' })),
    h('div', { class: 'field' }, h('label', { for: 'webhook-description', text: 'Description (optional)' }), description),
    h('div', { class: 'actions' }, createButton),
    formError);
  const issued = h('div', { id: 'webhook-issued' });

  const filter = h('select', { id: 'delivery-webhook', name: 'webhook' });
  const statusFilter = h('select', { id: 'delivery-status', name: 'status' },
    h('option', { value: '', text: 'any status' }),
    ['pending', 'delivered', 'failed'].map((s) => h('option', { value: s, text: s })));
  const deliveryBody = h('tbody');
  const summary = h('span', { class: 'page-summary', 'aria-live': 'polite' });
  const previous = h('button', { type: 'button', class: 'secondary', text: '← Newer' });
  const next = h('button', { type: 'button', class: 'secondary', text: 'Older →' });
  const reload = h('button', { type: 'button', class: 'secondary', dataset: { action: 'reload-deliveries' }, text: 'Read again' });

  fill(main,
    h('h1', { text: 'Notifications' }),
    h('p', { class: 'hint', text: 'Webhook subscriptions: each event of the types a subscription names is POSTed to its URL, signed (Standard Webhooks), retried until a 2xx answer.' }),
    h('section', { 'aria-labelledby': 'subs-title' },
      h('h2', { id: 'subs-title', text: 'Subscriptions' }),
      tableWrap(h('table', { class: 'list', id: 'webhooks' },
        h('caption', { class: 'visually-hidden', text: 'Webhook subscriptions, oldest first' }),
        h('thead', {}, h('tr', {}, ['URL', 'Events', 'Body', 'Description', 'Created', 'Actions'].map((c) => h('th', { scope: 'col', text: c })))),
        subBody)),
      form, issued),
    h('section', { 'aria-labelledby': 'deliveries-title' },
      h('h2', { id: 'deliveries-title', text: 'Delivery log' }),
      h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter the delivery log', on: { submit: (e) => e.preventDefault() } },
        h('label', { for: 'delivery-webhook', text: 'Subscription' }), filter,
        h('label', { for: 'delivery-status', text: 'Status' }), statusFilter,
        reload),
      tableWrap(h('table', { class: 'list', id: 'deliveries' },
        h('caption', { class: 'visually-hidden', text: 'Deliveries, newest first' }),
        h('thead', {}, h('tr', {}, ['Delivery', 'Event', 'Subscription', 'Status', 'Attempts', 'Created', 'Action'].map((c) => h('th', { scope: 'col', text: c })))),
        deliveryBody)),
      h('nav', { class: 'pager', 'aria-label': 'Pages of the delivery log' }, previous, summary, next)),
  );

  const go = (changes) => {
    const p = { ...params, ...changes };
    ctx.navigate(`#/notifications${query({ webhook: p.webhook, status: p.status, offset: Number(p.offset) || '' })}`);
  };
  filter.addEventListener('change', () => go({ webhook: filter.value, offset: 0 }));
  statusFilter.addEventListener('change', () => go({ status: statusFilter.value, offset: 0 }));
  previous.addEventListener('click', () => go({ offset: Math.max(0, (Number(params.offset) || 0) - PAGE) }));
  next.addEventListener('click', () => go({ offset: (Number(params.offset) || 0) + PAGE }));
  reload.addEventListener('click', () => refresh());

  const showError = (message) => {
    formError.textContent = message ?? '';
    formError.hidden = !message;
  };

  function renderSubscriptions() {
    const rows = subscriptions.map((s) => h('tr', { dataset: { webhookId: s.id } },
      h('th', { scope: 'row', class: 'mono wrap', text: s.url }),
      h('td', {}, s.events.map((e) => h('code', { class: 'event-type', text: e }))),
      h('td', { text: s.body_template ? 'template' : 'standard' }),
      h('td', { class: 'wrap', text: s.description ?? '' }),
      h('td', {}, time(s.created_at)),
      h('td', {}, h('div', { class: 'actions' },
        h('a', { href: `#/notifications${query({ webhook: s.id })}`, text: 'Deliveries', 'aria-label': `Deliveries to ${s.url}` }),
        confirmButton({
          label: 'Delete',
          action: 'delete-webhook',
          question: `Delete the subscription to ${s.url}? Its pending deliveries are not sent.`,
          confirm: 'Delete',
          act: async () => {
            try {
              await api(`/webhooks/${encodeURIComponent(s.id)}`, { method: 'DELETE' });
              ctx.toast('Subscription deleted');
              if (params.webhook === s.id) go({ webhook: '', offset: 0 });
              else refresh();
            } catch (e) {
              ctx.toast(e.message, 'error');
            }
          },
        })))));
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 6, class: 'empty', text: 'No subscription.' })));
    fill(subBody, ...rows);
    fill(filter, h('option', { value: '', text: 'every subscription' }),
      subscriptions.map((s) => h('option', { value: s.id, text: s.url })));
    if (params.webhook && !subscriptions.some((s) => s.id === params.webhook)) {
      filter.append(h('option', { value: params.webhook, text: `${params.webhook} (deleted)` }));
    }
    filter.value = params.webhook ?? '';
    statusFilter.value = params.status ?? '';
  }

  function attemptsCell(d) {
    const last = d.attempts.at(-1);
    const lastText = last
      ? `last: ${last.status_code ?? 'no answer'}${last.error ? ` (${last.error})` : ''}, ${last.duration_ms} ms`
      : 'none yet';
    return h('td', { class: 'wrap' },
      `${d.attempts.length} · ${lastText}`,
      d.next_attempt_at && d.status === 'pending' ? [' · next ', time(d.next_attempt_at)] : null,
      d.attempts.length ? h('details', {}, h('summary', { text: 'every attempt' }),
        h('ol', { class: 'attempts' }, d.attempts.map((a) => h('li', {},
          time(a.at), ` · ${a.status_code ?? 'no answer'}${a.error ? ` · ${a.error}` : ''} · ${a.duration_ms} ms`)))) : null);
  }

  function renderDeliveries(page) {
    const byId = new Map(subscriptions.map((s) => [s.id, s]));
    const rows = page.deliveries.map((d) => h('tr', { dataset: { deliveryId: d.id, status: d.status } },
      h('td', { class: 'mono' }, h('details', {}, h('summary', { text: d.id }), h('pre', { class: 'json', text: d.body }))),
      h('td', {}, h('code', { text: d.event_type })),
      h('td', { class: 'mono wrap', text: byId.get(d.subscription_id)?.url ?? `${d.url} (deleted)` }),
      h('td', {}, badge(DELIVERY_COLOUR[d.status] ?? 'pending', d.status)),
      attemptsCell(d),
      h('td', {}, time(d.created_at)),
      h('td', {}, d.status === 'pending' || !byId.has(d.subscription_id) ? '' : h('button', {
        type: 'button', class: 'secondary', dataset: { action: 'resend' }, text: 'Re-send',
        'aria-label': `Re-send ${d.id}`,
        on: {
          click: async (e) => {
            e.currentTarget.disabled = true;
            try {
              await api(`/webhook-deliveries/${encodeURIComponent(d.id)}/resend`, { method: 'POST' });
              ctx.toast(`Delivery ${d.id} is sent again`);
            } catch (err) {
              ctx.toast(err.message, 'error');
            }
            refresh();
          },
        },
      }))));
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 7, class: 'empty', text: 'No delivery.' })));
    fill(deliveryBody, ...rows);
    summary.textContent = page.total === 0 ? '0 deliveries'
      : `${page.offset + 1}–${page.offset + page.deliveries.length} of ${page.total.toLocaleString()}`;
    previous.disabled = page.offset === 0;
    next.disabled = page.offset + page.deliveries.length >= page.total;
    // A pending delivery changes without an event: look again at its next
    // attempt (one timer for the page, never more).
    clearTimeout(wake);
    const due = page.deliveries.filter((d) => d.status === 'pending')
      .map((d) => (d.next_attempt_at ? Date.parse(d.next_attempt_at) : Date.now()));
    if (due.length) wake = setTimeout(soon, Math.min(Math.max(Math.min(...due) - Date.now(), 0) + 500, 30000));
  }

  async function refresh() {
    const mine = ++generation;
    try {
      const [subs, page] = await Promise.all([
        api('/webhooks'),
        api(`/webhook-deliveries${query({ webhook: params.webhook, status: params.status, limit: PAGE, offset: Number(params.offset) || 0 })}`),
      ]);
      if (mine !== generation) return;
      subscriptions = subs.webhooks;
      renderSubscriptions();
      renderDeliveries(page);
      main.dataset.loaded = 'true';
    } catch (e) {
      if (mine === generation) ctx.toast(e.message, 'error');
    }
  }
  const soon = coalesce(refresh, 500);

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    showError(null);
    const chosen = events.filter((x) => x.box.checked).map((x) => x.type);
    if (chosen.length === 0) {
      showError('events: choose at least one event type');
      events[0].box.focus();
      return;
    }
    const body = { url: url.value.trim(), events: chosen };
    if (bodyTemplate.value.trim()) {
      try {
        body.body_template = JSON.parse(bodyTemplate.value);
      } catch (err) {
        showError(`body_template: not JSON (${err.message})`);
        bodyTemplate.focus();
        return;
      }
    }
    if (description.value.trim()) body.description = description.value.trim();
    createButton.disabled = true;
    try {
      const answer = await api('/webhooks', { method: 'POST', body });
      form.reset();
      fill(issued, shownOnce({
        id: 'webhook-secret',
        title: `Signing secret of ${answer.subscription.url}`,
        value: answer.secret,
        hint: 'This is the only time the signing secret is shown: the receiver verifies webhook-signature with it. To change it, delete the subscription and add it again.',
        onDone: () => url.focus(),
      }));
      issued.querySelector('button[data-action="copy"]').focus();
      refresh();
    } catch (err) {
      showError(err.message);
      url.focus();
    } finally {
      createButton.disabled = false;
    }
  });

  refresh();
  ctx.live.watch({ kind: KINDS }, { change: soon, refresh: soon });
  return {
    update(newParams) {
      params = newParams;
      refresh();
      return true;
    },
    unmount() {
      soon.cancel();
      clearTimeout(wake);
    },
  };
}
