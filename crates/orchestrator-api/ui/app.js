// The dashboard's entry: who is signed in, the hash router, the header,
// and the sign-in form. Pages are modules with `mount(main, ctx)`, which
// returns `{update(params), unmount()}`.
//
// Signing in: the token typed here goes once to `POST /ui/session` in an
// Authorization header, and the field is emptied. The service answers with
// an HttpOnly cookie (which this script cannot read) and a CSRF token kept
// in memory (api.js). Nothing is written to localStorage, sessionStorage
// or the URL.

import { api, setCsrfToken, whenSessionLost } from './api.js';
import { fill, h } from './dom.js';
import { Live } from './live.js';
import * as workflows from './page-workflows.js';
import * as workflow from './page-workflow.js';
import * as submit from './page-submit.js';
import * as nodes from './page-nodes.js';
import * as audit from './page-audit.js';
import * as schedules from './page-schedules.js';
import * as environments from './page-environments.js';
import * as storage from './page-storage.js';
import * as access from './page-access.js';
import * as approvals from './page-approvals.js';
import * as locks from './page-locks.js';
import * as notifications from './page-notifications.js';
import * as compare from './page-compare.js';

const ROLES = ['viewer', 'operator', 'admin'];

/** Routes: a pattern on the hash path, the page, and the role it needs. */
const ROUTES = [
  { pattern: /^\/workflows$/, page: workflows, name: 'workflows', title: 'Workflows' },
  { pattern: /^\/workflows\/([^/]+)$/, page: workflow, name: 'workflows', keys: ['id'] },
  { pattern: /^\/submit$/, page: submit, name: 'submit', title: 'Submit' },
  { pattern: /^\/nodes$/, page: nodes, name: 'nodes', title: 'Nodes' },
  { pattern: /^\/compare$/, page: compare, name: 'workflows', title: 'Compare two runs' },
  { pattern: /^\/schedules$/, page: schedules, name: 'schedules', title: 'Schedules' },
  { pattern: /^\/schedules\/([^/]+)$/, page: schedules, name: 'schedules', keys: ['id'] },
  { pattern: /^\/approvals$/, page: approvals, name: 'approvals', title: 'Approvals' },
  { pattern: /^\/(?:environments|test)$/, page: environments, name: 'environments', title: 'Test environments' },
  { pattern: /^\/environments\/([^/]+)$/, page: environments, name: 'environments', keys: ['id'] },
  { pattern: /^\/locks$/, page: locks, name: 'locks', title: 'Locks' },
  { pattern: /^\/storage$/, page: storage, name: 'storage', title: 'Storage', role: 'admin' },
  { pattern: /^\/access$/, page: access, name: 'access', title: 'Access', role: 'admin' },
  { pattern: /^\/notifications$/, page: notifications, name: 'notifications', title: 'Notifications', role: 'admin' },
  { pattern: /^\/audit$/, page: audit, name: 'audit', title: 'Audit log', role: 'admin' },
];

const main = document.getElementById('main');
const who = document.getElementById('who');
const toastBox = document.getElementById('toast');
let session = null;
let current = null; // {route, params, instance}

/** How the page gets its updates, shown in the header. */
function showLiveMode(mode) {
  document.body.dataset.live = mode;
  const indicator = document.getElementById('live');
  if (indicator) {
    indicator.textContent = { live: '● live', polling: '↻ every 2 s', off: '' }[mode];
    indicator.title = { live: 'Updates arrive as they happen', polling: 'No event stream: the page re-reads every 2 s', off: '' }[mode];
    indicator.dataset.mode = mode;
  }
}
const live = new Live(showLiveMode);

function can(role) {
  return session !== null && ROLES.indexOf(session.role) >= ROLES.indexOf(role);
}

/** A short message for screen readers and eyes; errors stay longer. */
function toast(message, kind = 'info') {
  const item = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status', text: message });
  toastBox.append(item);
  setTimeout(() => item.remove(), kind === 'error' ? 8000 : 3500);
}

function parseHash() {
  const hash = location.hash.startsWith('#/') ? location.hash.slice(1) : '/workflows';
  const [path, search = ''] = hash.split('?');
  const params = Object.fromEntries(new URLSearchParams(search));
  for (const route of ROUTES) {
    const match = route.pattern.exec(path);
    if (match) {
      (route.keys ?? []).forEach((key, i) => { params[key] = decodeURIComponent(match[i + 1]); });
      return { route, params };
    }
  }
  return { route: null, params };
}

const ctx = (params) => ({
  params,
  session,
  live,
  can,
  toast,
  navigate: (hash) => { location.hash = hash; },
  replace: (hash) => history.replaceState(null, '', hash),
  setTitle: (title) => { document.title = `${title} · orchestrator`; },
});

function render() {
  if (!session) return;
  // Hashes that are not routes (`#main`, from the skip link) leave the page be.
  if (location.hash && !location.hash.startsWith('#/')) return;
  const { route, params } = parseHash();
  for (const link of document.querySelectorAll('nav a[data-nav]')) {
    if (route && link.dataset.nav === route.name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  const samePage = current && route && current.route.page === route.page;
  if (samePage && current.instance.update && current.instance.update(params) !== false) {
    current.params = params;
    return;
  }
  current?.instance.unmount?.();
  current = null;
  if (!route) {
    fill(main, h('h1', { text: 'No such page' }), h('p', {}, h('a', { href: '#/workflows', text: 'Go to the workflows' })));
    return;
  }
  if (route.role && !can(route.role)) {
    live.stop();
    fill(main, h('h1', { text: route.title }), h('p', { class: 'notice', text: `This page needs the ${route.role} role; you are ${session.role}.` }));
    return;
  }
  if (route.title) document.title = `${route.title} · orchestrator`;
  delete main.dataset.loaded;
  current = { route, params, instance: route.page.mount(main, ctx(params)) };
}

function renderWho() {
  const roleLinks = document.querySelectorAll('nav [data-min-role]');
  for (const link of roleLinks) link.hidden = !can(link.dataset.minRole);
  if (!session) {
    fill(who);
    return;
  }
  const signOut = h('button', { type: 'button', class: 'link', id: 'sign-out', text: 'Sign out' });
  signOut.addEventListener('click', async () => {
    try {
      await api('/ui/logout', { method: 'POST' });
    } finally {
      signedOut('Signed out.');
    }
  });
  fill(who,
    h('span', { id: 'live', class: 'live', 'aria-live': 'polite' }),
    h('span', { class: 'user', dataset: { role: session.role } }, session.name, h('span', { class: 'tag', text: session.role })),
    session.auth ? signOut : null,
  );
  showLiveMode(live.mode);
}

function signedIn(answer) {
  session = { name: answer.name, role: answer.role, auth: answer.auth };
  setCsrfToken(answer.csrf_token);
  document.body.dataset.role = session.role;
  renderWho();
  render();
}

function signedOut(message) {
  session = null;
  setCsrfToken(null);
  current?.instance.unmount?.();
  current = null;
  live.stop();
  delete document.body.dataset.role;
  renderWho();
  showSignIn(message);
}

function showSignIn(message) {
  document.title = 'Sign in · orchestrator';
  const token = h('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true,
    'aria-describedby': 'token-hint token-error',
  });
  const error = h('p', { id: 'token-error', class: 'field-error', role: 'alert', hidden: !message, text: message ?? '' });
  const button = h('button', { type: 'submit', class: 'primary', text: 'Sign in' });
  const form = h('form', { class: 'signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title', text: 'Sign in' }),
    h('div', { class: 'field' },
      h('label', { for: 'token', text: 'API token' }), token,
      h('small', { id: 'token-hint', class: 'hint', text: 'Paste an API token once (orchestrator token create, or the bootstrap token). The page keeps only a session cookie, for 12 hours.' }),
      error),
    h('div', { class: 'actions' }, button));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const value = token.value.trim();
    // The token leaves the page in this one request, and the field is emptied.
    token.value = '';
    if (!value) {
      error.textContent = 'Paste a token first.';
      error.hidden = false;
      token.focus();
      return;
    }
    button.disabled = true;
    try {
      signedIn(await api('/ui/session', { method: 'POST', authorization: `Bearer ${value}` }));
    } catch (err) {
      error.textContent = err.status === 401 ? 'This token is unknown or revoked.' : err.message;
      error.hidden = false;
      token.focus();
    } finally {
      button.disabled = false;
    }
  });
  fill(main, form);
  token.focus();
}

whenSessionLost(() => {
  if (session?.auth) signedOut('Your session has ended (expired, signed out elsewhere, or its token was revoked). Sign in again.');
});

window.addEventListener('hashchange', render);

document.querySelector('.skip')?.addEventListener('click', (e) => {
  e.preventDefault();
  main.focus();
});

(async function start() {
  try {
    signedIn(await api('/ui/session'));
  } catch (e) {
    if (e.status === 401) showSignIn();
    else fill(main, h('h1', { text: 'The service cannot be reached' }), h('p', { text: e.message }));
  }
})();
