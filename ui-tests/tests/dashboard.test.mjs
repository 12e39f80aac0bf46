// The dashboard in a real browser, against a real service. Every wait is
// on what the page shows (a node's `data-status`, a line of log), never a
// sleep. One service and one browser for the file; each test signs in its
// own context where the role matters.

import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import {
  ADMIN, call, createToken, launchBrowser, screenshot, signedInPage, startService, waitWorkflow, watchedPage,
} from '../harness.mjs';

const SECRET_VALUE = 'hunter2-ui-secret-value';
let service;
let browser;
let operator;
let viewer;

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  operator = await createToken(service, 'ui-operator', 'operator');
  viewer = await createToken(service, 'ui-viewer', 'viewer');
  const put = await call(service, ADMIN, 'PUT', '/secrets/ui_password', { value: SECRET_VALUE, templates: ['ui-gate'] });
  assert.equal(put.status, 200, JSON.stringify(put.body));
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

/** The statuses a graph node shows, in the order it showed them (recorded in the page). */
async function recordStatuses(page) {
  await page.evaluate(() => {
    window.seenStatuses = {};
    const note = (node) => {
      const id = node.dataset.taskId;
      const seen = (window.seenStatuses[id] ??= []);
      if (seen.at(-1) !== node.dataset.status) seen.push(node.dataset.status);
    };
    document.querySelectorAll('svg.dag .node').forEach(note);
    new MutationObserver((changes) => {
      for (const change of changes) {
        if (change.target instanceof Element && change.target.matches('svg.dag .node')) note(change.target);
        for (const added of change.addedNodes ?? []) {
          if (added instanceof Element) added.querySelectorAll?.('.node').forEach(note);
        }
      }
    }).observe(document.getElementById('dag'), {
      subtree: true, childList: true, attributes: true, attributeFilter: ['data-status'],
    });
  });
}

test('signing in keeps the token out of storage, the URL and page scripts', async () => {
  const context = await browser.newContext();
  const page = await watchedPage(context);
  await page.goto(`${service.base}/ui`);
  // A wrong token is refused next to the field.
  await page.getByLabel('API token').fill('orch_0190_not-a-real-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByText('This token is unknown or revoked.').waitFor();

  await page.getByLabel('API token').fill(operator);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#who .user', { hasText: 'ui-operator' }).waitFor();
  assert.equal(await page.getByLabel('API token').count(), 0);

  const leaks = await page.evaluate((token) => ({
    local: JSON.stringify(localStorage).includes(token) || localStorage.length,
    session: JSON.stringify(sessionStorage).includes(token) || sessionStorage.length,
    url: location.href.includes(token),
    cookie: document.cookie,
  }), operator);
  assert.deepEqual(leaks, { local: 0, session: 0, url: false, cookie: '' });
  const [cookie] = await context.cookies();
  assert.equal(cookie.name, 'orch_session');
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, 'Strict');
  assert.ok(!cookie.value.includes(operator));
  assert.ok(!service.log().includes(operator), 'the token reached the service log');

  // A reload keeps the session (the cookie), and the page gets its CSRF token again.
  await page.reload();
  await page.locator('#who .user', { hasText: 'ui-operator' }).waitFor();
  // Signing out ends it.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('API token').waitFor();
  const after = await page.evaluate(async () => (await fetch('/workflows')).status);
  assert.equal(after, 401);
  assert.deepEqual(page.errors, []);
  await context.close();
});

test('a cluster workflow submitted from the form runs to completion without a reload', async () => {
  const page = await signedInPage(browser, service, operator);
  await page.getByRole('link', { name: 'Submit', exact: true }).click();
  await page.getByLabel('Template').selectOption('cluster-create');
  await page.locator('[data-field="vars.infra"] input').waitFor();

  // A bad name: the service's message appears next to the field it names.
  await page.getByLabel('infra').fill('lab');
  await page.getByLabel('cluster').fill('k3s');
  await page.getByLabel('servers').fill('slow-01\nbad name!');
  await page.getByLabel('taskservs').fill('containerd');
  await page.getByRole('button', { name: 'Submit' }).click();
  const fieldError = page.locator('#input-vars-servers-error');
  await fieldError.waitFor();
  assert.match(await fieldError.textContent(), /^vars\.servers\[1\]: .*not a valid name/);
  assert.equal(await page.getByLabel('servers').getAttribute('aria-invalid'), 'true');
  await screenshot(page, 'submit');

  await page.getByLabel('servers').fill('slow-01\nslow-02');
  await page.getByLabel('Priority').selectOption('high');
  await page.getByRole('button', { name: 'Submit' }).click();
  await page.waitForURL(/#\/workflows\/[0-9a-f-]{36}$/);
  await page.evaluate(() => { window.notReloaded = true; });
  await page.locator('svg.dag .node').first().waitFor();
  await recordStatuses(page);
  // 2 servers, 2 installs, 1 join.
  assert.equal(await page.locator('svg.dag .node').count(), 5);
  await page.locator('.head-status[data-status="completed"]').waitFor({ timeout: 60000 });
  await page.waitForFunction(() => document.querySelectorAll('svg.dag .node[data-status="completed"]').length === 5);
  await page.waitForFunction(() => document.querySelectorAll('#timeline .bar').length === 5);
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
  // The page follows the event stream (one per page), not a timer.
  assert.equal(await page.evaluate(() => document.body.dataset.live), 'live');
  const seen = await page.evaluate(() => window.seenStatuses);
  for (const statuses of Object.values(seen)) assert.equal(statuses.at(-1), 'completed');
  // The servers sleep a second: each was seen running, then completed.
  const servers = await page.locator('svg.dag .node', { hasText: 'create server' }).evaluateAll(
    (nodes) => nodes.map((n) => n.dataset.taskId),
  );
  assert.equal(servers.length, 2);
  for (const id of servers) {
    assert.ok(seen[id].indexOf('running') >= 0 && seen[id].indexOf('running') < seen[id].indexOf('completed'), JSON.stringify(seen[id]));
  }
  // The steps after them were seen waiting before they ran.
  assert.ok(Object.values(seen).some((s) => s[0] === 'pending' && s.at(-1) === 'completed'), JSON.stringify(seen));
  // The join step's panel: input (with the servers' outputs), output, attempts and log.
  await page.locator('svg.dag .node', { hasText: 'join cluster k3s' }).click();
  await page.locator('#step-attempts tr[data-outcome="completed"]').waitFor();
  assert.match(await page.locator('#step-output').textContent(), /"joined": true/);
  await screenshot(page, 'workflow');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('picking the template that is shown again keeps what was typed in its form', async () => {
  const page = await signedInPage(browser, service, operator);
  // Every load of the template after the first waits until released.
  let asked = 0;
  const held = [];
  await page.route(/\/templates\/cluster-create$/, async (route) => {
    asked += 1;
    if (asked > 1) await new Promise((resolve) => { held.push(resolve); });
    await route.continue();
  });
  await page.goto(`${service.base}/ui#/submit?template=cluster-create`);
  await page.getByLabel('infra').fill('lab');
  // The same pick again: a browser sends `change` when a script selects
  // the option that is already selected, as Playwright does.
  await page.getByLabel('Template').selectOption('cluster-create');
  // A request the page makes after the pick: once it is seen, a second
  // load of the template would have been seen too.
  await Promise.all([page.waitForRequest(/\/ui\/session$/), page.evaluate(() => fetch('/ui/session'))]);
  if (held.length) {
    const answered = page.waitForResponse(/\/templates\/cluster-create$/);
    held.splice(0).forEach((release) => release());
    await answered;
    await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => resolve())));
  }
  assert.equal(await page.getByLabel('infra').inputValue(), 'lab');
  assert.equal(asked, 1, 'the template was loaded again');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a running step streams its log, and can be cancelled from the page', async () => {
  const submitted = await call(service, operator, 'POST', '/workflows', { template: 'ui-slow' });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
  const id = submitted.body.id;
  const task = submitted.body.tasks[0].id;
  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/workflows/${id}`);
  await page.locator(`svg.dag .node[data-task-id="${task}"][data-status="running"]`).waitFor();
  await page.locator(`svg.dag .node[data-task-id="${task}"]`).click();
  // New lines arrive while the page is open.
  await page.locator('#step-log', { hasText: 'tick 1 ' }).waitFor();
  const before = (await page.locator('#step-log').textContent()).split('\n').length;
  await page.waitForFunction(
    (n) => document.getElementById('step-log').textContent.split('\n').length >= n + 2,
    before,
  );
  await screenshot(page, 'workflow-running');

  await page.locator('button[data-action="cancel-task"]').click();
  await page.locator(`svg.dag .node[data-task-id="${task}"][data-status="cancelled"]`).waitFor({ timeout: 30000 });
  await page.locator('.head-status[data-status="cancelled"]').waitFor({ timeout: 30000 });
  // The step after it never ran.
  assert.equal(await page.locator('svg.dag .node[data-status="skipped"]').count(), 1);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a failed workflow shows every attempt, and is retried from the page', async () => {
  // In the scripts' state dir: the one part of the data dir a sandboxed
  // script can see.
  const gate = join(service.dataDir, 'script-state', 'gate-open');
  const submitted = await call(service, operator, 'POST', '/workflows', { template: 'ui-gate', vars: { gate } });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
  const id = submitted.body.id;
  await waitWorkflow(service, id, (w) => w.status === 'failed');
  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/workflows/${id}`);
  await page.locator('.head-status[data-status="failed"]').waitFor();
  const check = page.locator('svg.dag .node', { hasText: 'check the gate' });
  // Three attempts of the check on the timeline: the retries show.
  const checkId = await check.getAttribute('data-task-id');
  await page.waitForFunction((taskId) => document.querySelectorAll(`#timeline .bar[data-task-id="${taskId}"]`).length === 3, checkId);
  // Keyboard: the graph's steps are links; Enter opens the step's panel.
  await check.focus();
  await page.keyboard.press('Enter');
  await page.locator(`#step[data-task-id="${checkId}"]`).waitFor();
  await page.waitForFunction(() => document.querySelectorAll('#step-attempts tr[data-attempt]').length === 3);
  // The input shows the secret's reference; the value is nowhere on the page.
  assert.match(await page.locator('#step-input').textContent(), /\$\{secrets\.ui_password\}/);
  assert.ok(!(await page.content()).includes(SECRET_VALUE), 'a secret value reached the page');
  await screenshot(page, 'workflow-failed');

  writeFileSync(gate, 'open');
  await page.locator('button[data-action="retry-workflow"]').click();
  await page.locator('.head-status[data-status="completed"]').waitFor({ timeout: 60000 });
  await page.locator(`svg.dag .node[data-task-id="${checkId}"][data-status="completed"]`).waitFor();
  assert.ok(!(await page.content()).includes(SECRET_VALUE), 'a secret value reached the page');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a viewer sees no action buttons, and the service refuses its changes anyway', async () => {
  const submitted = await call(service, operator, 'POST', '/workflows', { template: 'ui-slow', vars: { ticks: 40 } });
  const id = submitted.body.id;
  const task = submitted.body.tasks[0].id;
  const page = await signedInPage(browser, service, viewer);
  await page.goto(`${service.base}/ui#/workflows/${id}?task=${task}`);
  await page.locator(`svg.dag .node[data-task-id="${task}"][data-status="running"]`).waitFor();
  await page.locator('#step[data-task-id]').waitFor();
  await page.locator('#step-log', { hasText: 'tick 1 ' }).waitFor();
  assert.equal(await page.locator('button[data-action]').count(), 0);
  assert.equal(await page.getByRole('button', { name: /cancel|retry/i }).count(), 0);
  assert.equal(await page.getByRole('link', { name: 'Submit', exact: true }).isVisible(), false);
  assert.equal(await page.getByRole('link', { name: 'Audit log' }).isVisible(), false);
  // With its cookie and the right CSRF token, the role still decides.
  const answer = await page.evaluate(async (taskId) => {
    const session = await (await fetch('/ui/session')).json();
    const response = await fetch(`/tasks/${taskId}/cancel`, { method: 'POST', headers: { 'X-CSRF-Token': session.csrf_token } });
    return { status: response.status, body: await response.json() };
  }, task);
  assert.equal(answer.status, 403);
  assert.equal(answer.body.error.message, 'this needs the operator role');
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await call(service, operator, 'POST', `/workflows/${id}/cancel`);
});

test('a forged change with the session cookie but no CSRF token is refused; the page\'s own goes through', async () => {
  const submitted = await call(service, operator, 'POST', '/workflows', { template: 'ui-slow', vars: { ticks: 40 } });
  const id = submitted.body.id;
  const page = await signedInPage(browser, service, operator);
  const tries = await page.evaluate(async (workflow) => {
    const cancel = (headers) => fetch(`/workflows/${workflow}/cancel`, { method: 'POST', headers })
      .then(async (r) => ({ status: r.status, body: await r.json() }));
    return {
      missing: await cancel({}),
      wrong: await cancel({ 'X-CSRF-Token': 'not-the-token' }),
    };
  }, id);
  assert.equal(tries.missing.status, 403);
  assert.equal(tries.missing.body.error.code, 'forbidden');
  assert.match(tries.missing.body.error.message, /X-CSRF-Token is missing/);
  assert.equal(tries.wrong.status, 403);
  assert.match(tries.wrong.body.error.message, /X-CSRF-Token does not match/);
  const still = await call(service, ADMIN, 'GET', `/workflows/${id}`);
  assert.equal(still.body.cancel_requested, false, 'a refused cancel was carried out');
  // The page's own button sends the token, and the cancel goes through.
  await page.goto(`${service.base}/ui#/workflows/${id}`);
  await page.locator('button[data-action="cancel-workflow"]').click();
  await page.locator('.head-status[data-status="cancelled"]').waitFor({ timeout: 30000 });
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the list filters and counts by status, and the other pages render', async () => {
  const page = await signedInPage(browser, service, ADMIN);
  await page.locator('#workflows tbody tr[data-workflow-id]').first().waitFor();
  // A workflow submitted elsewhere appears, and ends, without a reload.
  await page.evaluate(() => { window.notReloaded = true; });
  const submitted = await call(service, operator, 'POST', '/workflows/servers/create', { infra: 'list', servers: ['slow-09'] });
  const row = page.locator(`#workflows tbody tr[data-workflow-id="${submitted.body.workflow_id}"]`);
  await row.waitFor();
  await page.locator(`#workflows tbody tr[data-workflow-id="${submitted.body.workflow_id}"][data-status="completed"]`).waitFor();
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
  const total = Number((await page.locator('.count[data-status="all"] .count-n').textContent()).replace(/\D/g, ''));
  const listed = await call(service, ADMIN, 'GET', '/workflows?limit=0');
  assert.equal(total, listed.body.total);
  await page.locator('.count[data-status="completed"]').click();
  await page.waitForURL(/status=completed/);
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('#workflows tbody tr[data-workflow-id]')];
    return rows.length > 0 && rows.every((r) => r.dataset.status === 'completed');
  });
  // This test's own workflow: the one completed of its template here.
  await page.getByLabel('Template').selectOption('servers-create');
  await page.waitForFunction((id) => {
    const rows = [...document.querySelectorAll('#workflows tbody tr[data-workflow-id]')];
    return rows.length === 1 && rows[0].dataset.workflowId === id && rows[0].textContent.includes('servers-create');
  }, submitted.body.workflow_id);
  await page.goto(`${service.base}/ui#/workflows`);
  await page.locator('#workflows tbody tr[data-workflow-id]').first().waitFor();
  await page.mouse.move(0, 800);
  await screenshot(page, 'workflows');

  await page.getByRole('link', { name: 'Nodes' }).click();
  await page.locator('#nodes tr[data-alive="true"]').waitFor();
  await screenshot(page, 'nodes');

  await page.getByRole('link', { name: 'Audit log' }).click();
  await page.locator('#audit tr[data-action="ui.sign_in"]').first().waitFor();
  await page.locator('#audit tr[data-action="workflow.retry"]').first().waitFor();
  await screenshot(page, 'audit');

  // Dark theme, for the docs (the pointer away from the links).
  await page.mouse.move(0, 800);
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/workflows`);
  await page.locator('#workflows tbody tr[data-workflow-id]').first().waitFor();
  await screenshot(page, 'workflows-dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
