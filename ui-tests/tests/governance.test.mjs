// The governance pages in a real browser: the approvals inbox (a digest
// and what it covers, who may decide, a decision with a comment, a stale
// digest refused and read again), the locks (a holder and a waiter, live),
// and the notifications (a subscription to a real HTTP receiver on
// loopback, its signing secret shown once, the delivery log, a re-send).
// The service runs a copy of the fixture scripts (a test changes one under
// a waiting gate) and allows the receiver's port in its HTTP allowlist.

import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { appendFileSync, cpSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, repo, screenshot, signedInPage, startService, waitWorkflow,
} from '../harness.mjs';

let service;
let browser;
let scripts;
let receiver;
let receiverPort;
const received = [];
let submitter; // an operator that submits (and so may not approve)
let approver; // another operator
let viewer;

before(async () => {
  receiver = createServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', () => {
      received.push({ path: request.url, headers: request.headers, body });
      response.writeHead(200, { 'Content-Type': 'text/plain' });
      response.end('ok');
    });
  });
  await new Promise((ok) => receiver.listen(0, '127.0.0.1', ok));
  receiverPort = receiver.address().port;
  scripts = mkdtempSync(join(tmpdir(), 'orchestrator-ui-scripts-'));
  cpSync(join(repo, 'crates/orchestrator/tests/fixtures/scripts'), scripts, { recursive: true });
  service = await startService({
    extraConfig: [`http_allow = ["127.0.0.1:${receiverPort}"]`, 'webhook_retry_base_ms = 200'],
    env: { ORCHESTRATOR_SCRIPTS_DIR: scripts },
  });
  browser = await launchBrowser();
  submitter = await createToken(service, 'gov-submitter', 'operator');
  approver = await createToken(service, 'gov-approver', 'operator');
  viewer = await createToken(service, 'gov-viewer', 'viewer');
});

after(async () => {
  await browser?.close();
  await service?.stop();
  await new Promise((ok) => (receiver ? receiver.close(ok) : ok()));
  if (scripts) rmSync(scripts, { recursive: true, force: true });
});

/** Submits the gated template as the submitter; resolves once its gate waits. */
async function gatedWorkflow(env) {
  const submitted = await call(service, submitter, 'POST', '/workflows', { template: 'ui-approval', vars: { env } });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
  const id = submitted.body.id;
  const deadline = Date.now() + 30000;
  for (;;) {
    const gate = await call(service, ADMIN, 'GET', `/workflows/${id}/approval`);
    if (gate.status === 200) return { id, gate: gate.body };
    if (Date.now() > deadline) throw new Error(`the gate never opened: ${JSON.stringify(gate.body)}`);
    await new Promise((ok) => setTimeout(ok, 100));
  }
}

async function openPage(token, hash, options) {
  const page = await signedInPage(browser, service, token, options);
  await page.goto(`${service.base}/ui#${hash}`);
  return page;
}

test('approvals: a gate that opens appears live; a viewer reads it, its submitter may only reject, another operator approves with a comment', async () => {
  // The approver's inbox is open before the gate opens.
  const page = await openPage(approver, '/approvals');
  await page.locator('main[data-loaded="true"]').waitFor();
  await page.evaluate(() => { window.notReloaded = true; });
  const { id, gate } = await gatedWorkflow('lab');
  const row = page.locator(`#approvals tr[data-workflow-id="${id}"]`);
  await row.waitFor();
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
  assert.match(await row.textContent(), /0 of 1/);
  await row.getByRole('link').click();
  await page.waitForURL(new RegExp(`workflow=${id}`));
  await page.locator('#gate-digest').waitFor();
  // The digest and each part it covers, as the service says.
  assert.equal(await page.locator('#gate-digest').textContent(), gate.digest);
  const covers = page.locator('#gate-covers');
  assert.match(await covers.locator('tr[data-part="inputs"]').textContent(), new RegExp(gate.covers.inputs));
  assert.match(await covers.locator('tr[data-part="template"]').textContent(), /ui-approval@1/);
  assert.match(await covers.locator('tr[data-part="script"][data-path="ui/ticker.py"]').textContent(), new RegExp(gate.covers.scripts['ui/ticker.py']));
  assert.match(await covers.locator('tr[data-part="output"][data-step="plan"]').textContent(), new RegExp(gate.covers.outputs.plan));
  assert.match(await page.locator('#gate').textContent(), /any operator or admin token; 1 approval needed.*not its submitter \(gov-submitter\)/);
  await assertAccessible(page, 'approvals light');
  await screenshot(page, 'approvals');

  // A viewer sees the same, and no decision.
  const viewerPage = await openPage(viewer, `/approvals?workflow=${id}&step=approve`);
  await viewerPage.locator('#gate-digest').waitFor();
  assert.equal(await viewerPage.locator('#gate-digest').textContent(), gate.digest);
  assert.match(await viewerPage.locator('#gate-no-decision').textContent(), /needs the operator role/);
  assert.equal(await viewerPage.locator('button[data-action="approve"], button[data-action="reject"]').count(), 0);
  assert.deepEqual(viewerPage.errors, []);
  await viewerPage.context().close();

  // Its submitter may reject it, not approve it.
  const submitterPage = await openPage(submitter, `/approvals?workflow=${id}&step=approve`);
  await submitterPage.locator('#gate-digest').waitFor();
  assert.match(await submitterPage.locator('#gate-no-approve').textContent(), /You submitted this workflow/);
  assert.equal(await submitterPage.locator('button[data-action="approve"]').count(), 0);
  assert.equal(await submitterPage.locator('button[data-action="reject"]').count(), 1);
  assert.deepEqual(submitterPage.errors, []);
  await submitterPage.context().close();

  // The page only guesses from the gate's rule; the service judges, and
  // its refusal is shown as it says it (here one answer is stood in for).
  const refusal = 'token `gov-approver` may not decide this gate: only someone-else may';
  await page.route('**/approve', (route) => route.fulfill({
    status: 403, contentType: 'application/json', body: JSON.stringify({ error: { code: 'forbidden', message: refusal } }),
  }), { times: 1 });
  await page.locator('button[data-action="approve"]').click();
  await page.locator('#gate-error', { hasText: refusal }).waitFor();
  await page.unroute('**/approve');

  // Another operator approves, with a comment, the digest it was shown.
  await page.getByLabel('Comment').fill('plan looks right');
  await page.locator('button[data-action="approve"]').click();
  await row.waitFor({ state: 'detached' });
  await page.locator('#gate-gone').waitFor();
  const done = await waitWorkflow(service, id, (w) => ['completed', 'failed', 'cancelled'].includes(w.status));
  assert.equal(done.status, 'completed');
  const audit = await call(service, ADMIN, 'GET', '/audit?action=workflow.approve');
  const record = audit.body.records.find((r) => r.target?.includes(id));
  assert.equal(record.actor, 'gov-approver');
  assert.match(record.target, new RegExp(`digest ${gate.digest}`));
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('approvals: a decision on a stale digest is refused, the gate is read again, and a rejection with a comment cancels the workflow', async () => {
  const { id, gate } = await gatedWorkflow('stale');
  // What the page shows of the gate stays as first read until the
  // decision is sent: a change on disk sends no event, but a re-read the
  // page makes anyway (the stream's snapshot) could otherwise show the
  // new digest first. Frozen from before the page opens, so no read is
  // under way when the script changes.
  const page = await signedInPage(browser, service, approver);
  let frozen = true;
  await page.route((url) => url.pathname.endsWith('/approval'), (route) => (frozen && route.request().method() === 'GET'
    ? route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(gate) })
    : route.continue()));
  page.on('request', (request) => {
    if (request.method() === 'POST' && request.url().endsWith('/approve')) frozen = false;
  });
  await page.goto(`${service.base}/ui#/approvals?workflow=${id}&step=approve`);
  await page.locator('#gate-digest').waitFor();
  assert.equal(await page.locator('#gate-digest').textContent(), gate.digest);
  // The script the gated step runs changes on disk: the digest is no longer the one shown.
  appendFileSync(join(scripts, 'ui/ticker.py'), '\n# changed under a waiting gate\n');
  const fresh = (await call(service, ADMIN, 'GET', `/workflows/${id}/approval`)).body;
  assert.notEqual(fresh.digest, gate.digest);
  await page.locator('button[data-action="approve"]').click();
  const notice = page.locator('#gate-notice');
  await notice.waitFor();
  assert.match(await notice.textContent(), /refused the decision/);
  assert.match(await notice.textContent(), new RegExp(gate.digest));
  await page.locator('#gate-digest', { hasText: fresh.digest }).waitFor();
  assert.equal((await call(service, ADMIN, 'GET', `/workflows/${id}`)).body.status, 'running');
  await assertAccessible(page, 'approvals light, a stale digest');

  // The decision on what is shown now goes through: a rejection, with its comment.
  await page.getByLabel('Comment').fill('not on a friday');
  await page.locator('button[data-action="reject"]').click();
  await page.locator('#gate-gone').waitFor();
  const done = await waitWorkflow(service, id, (w) => ['completed', 'failed', 'cancelled'].includes(w.status));
  assert.equal(done.status, 'cancelled');
  const gateTask = done.tasks.find((t) => t.step?.ref_name === 'approve');
  assert.match(gateTask.error, /rejected by gov-approver: not on a friday/);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('locks: a holder and a waiter with their fencing tokens, live, each linked to its workflow', async () => {
  const first = await call(service, submitter, 'POST', '/workflows', { template: 'ui-locked', vars: { env: 'prod', ticks: 60 } });
  assert.equal(first.status, 202, JSON.stringify(first.body));
  const firstId = first.body.id;
  const page = await openPage(viewer, '/locks');
  const lock = page.locator('section.lock[data-lock="env:prod"]');
  await lock.locator(`tr[data-role="holder"][data-workflow-id="${firstId}"]`).waitFor();
  await page.evaluate(() => { window.notReloaded = true; });

  const second = await call(service, submitter, 'POST', '/workflows', { template: 'ui-locked', vars: { env: 'prod', ticks: 60 } });
  const secondId = second.body.id;
  await lock.locator(`tr[data-role="waiter"][data-workflow-id="${secondId}"]`).waitFor();
  const listed = (await call(service, viewer, 'GET', '/locks')).body.locks.find((l) => l.name === 'env:prod');
  const holderToken = listed.holders[0].token;
  assert.equal(await lock.locator(`tr[data-role="holder"] td.fencing`).textContent(), String(holderToken));
  assert.match(await lock.textContent(), new RegExp(`fencing token ${listed.fencing}`));
  assert.equal(await lock.locator(`tr[data-role="holder"] a`).getAttribute('href'), `#/workflows/${firstId}`);
  assert.equal(await lock.locator(`tr[data-role="waiter"] a`).getAttribute('href'), `#/workflows/${secondId}`);
  await assertAccessible(page, 'locks light');
  await screenshot(page, 'locks');

  // The holder ends: the waiter is granted the next token, without a reload.
  await call(service, ADMIN, 'POST', `/workflows/${firstId}/cancel`);
  await lock.locator(`tr[data-role="holder"][data-workflow-id="${secondId}"][data-token="${holderToken + 1}"]`).waitFor({ timeout: 30000 });
  assert.equal(await lock.locator('tr[data-role="waiter"]').count(), 0);
  await call(service, ADMIN, 'POST', `/workflows/${secondId}/cancel`);
  await page.getByText('No lock is held or waited for.').waitFor({ timeout: 30000 });
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('notifications: a subscription to a real receiver, its secret shown once, the delivery log, a re-send and a delete', async () => {
  const page = await openPage(ADMIN, '/notifications');
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write'], { origin: service.base });
  await page.locator('main[data-loaded="true"]').waitFor();
  const url = `http://127.0.0.1:${receiverPort}/hook`;
  await page.getByLabel('URL').fill(url);
  await page.getByLabel(/workflow\.completed/).check();
  await page.getByLabel('Body template (JSON, optional)').fill('{"text": "${event.summary}", "id": "${event.workflow_id}"}');
  await page.getByLabel('Description (optional)').fill('the test receiver');
  await page.getByRole('button', { name: 'Add subscription' }).click();
  const secretField = page.locator('#webhook-secret');
  await secretField.waitFor();
  const secret = await secretField.inputValue();
  assert.match(secret, /^whsec_/);
  await page.locator('#webhook-issued button[data-action="copy"]').click();
  await page.locator('#webhook-issued', { hasText: 'Copied to the clipboard.' }).waitFor();
  const subs = (await call(service, ADMIN, 'GET', '/webhooks')).body.webhooks;
  assert.equal(subs.length, 1);
  const sub = subs[0];
  assert.deepEqual([sub.url, sub.events, sub.description], [url, ['workflow.completed'], 'the test receiver']);
  assert.ok(!JSON.stringify(subs).includes(secret), 'the list holds the secret');
  const row = page.locator(`#webhooks tr[data-webhook-id="${sub.id}"]`);
  await row.waitFor();
  await assertAccessible(page, 'notifications light, a secret shown once');
  await page.locator('#webhook-issued button[data-action="dismiss"]').click();
  assert.ok(!(await page.content()).includes(secret), 'the secret stayed in the page');

  // A bad target is refused, with the service's message next to the form.
  await page.getByLabel('URL').fill('http://192.0.2.1:9/elsewhere');
  await page.getByLabel(/workflow\.failed/).check();
  await page.getByRole('button', { name: 'Add subscription' }).click();
  await page.locator('#webhook-form-error', { hasText: 'not in the HTTP allowlist' }).waitFor();

  // A workflow completes: the receiver gets the signed body, the log shows it delivered.
  const submitted = await call(service, submitter, 'POST', '/workflows', { template: 'ui-slow', vars: { ticks: 1 } });
  const workflowId = submitted.body.id;
  await waitWorkflow(service, workflowId, (w) => w.status === 'completed');
  const delivery = page.locator('#deliveries tr[data-delivery-id][data-status="delivered"]');
  await delivery.waitFor({ timeout: 30000 });
  const deliveryId = await delivery.getAttribute('data-delivery-id');
  const got = received.filter((r) => r.headers['webhook-id'] === deliveryId);
  assert.equal(got.length, 1);
  assert.deepEqual(JSON.parse(got[0].body), { text: 'workflow `Slow ticker` completed', id: workflowId });
  const signed = `${deliveryId}.${got[0].headers['webhook-timestamp']}.${got[0].body}`;
  const expected = createHmac('sha256', Buffer.from(secret.slice('whsec_'.length), 'base64')).update(signed).digest('base64');
  assert.equal(got[0].headers['webhook-signature'], `v1,${expected}`);
  assert.match(await delivery.textContent(), /1 · last: 200/);

  // Re-send: a new round with the same id.
  await delivery.locator('button[data-action="resend"]').click();
  await page.waitForFunction((id) => {
    const tr = document.querySelector(`#deliveries tr[data-delivery-id="${id}"]`);
    return tr && tr.dataset.status === 'delivered' && /^2 · last: 200/.test(tr.children[4].textContent);
  }, deliveryId, { timeout: 30000 });
  assert.equal(received.filter((r) => r.headers['webhook-id'] === deliveryId).length, 2);
  const log = (await call(service, ADMIN, 'GET', `/webhook-deliveries?webhook=${sub.id}`)).body;
  assert.equal(log.deliveries.find((d) => d.id === deliveryId).attempts.length, 2);

  // The log filtered by subscription, bookmarkable.
  await page.getByLabel('Subscription', { exact: true }).selectOption(sub.id);
  await page.waitForURL(new RegExp(`webhook=${sub.id}`));
  await page.reload();
  await page.locator(`#deliveries tr[data-delivery-id="${deliveryId}"]`).waitFor();
  assert.equal(await page.getByLabel('Subscription', { exact: true }).inputValue(), sub.id);
  await screenshot(page, 'notifications');

  // Delete asks first.
  await row.locator('button[data-action="delete-webhook"]').click();
  await row.locator('button[data-action="delete-webhook-confirm"]').click();
  await row.waitFor({ state: 'detached' });
  assert.deepEqual((await call(service, ADMIN, 'GET', '/webhooks')).body.webhooks, []);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('roles: an operator and a viewer get the notice on Notifications; the governance pages pass axe in the dark theme', async () => {
  for (const [token, role] of [[approver, 'operator'], [viewer, 'viewer']]) {
    const page = await openPage(token, '/notifications');
    await page.getByText(`This page needs the admin role; you are ${role}.`).waitFor();
    assert.equal(await page.getByRole('link', { name: 'Notifications' }).isVisible(), false);
    assert.equal(await page.locator('#webhooks, #deliveries, form').count(), 0);
    assert.deepEqual(page.errors, []);
    await page.context().close();
  }

  // One dark context for the three pages (an admin sees each whole).
  const { id } = await gatedWorkflow('dark');
  const held = await call(service, submitter, 'POST', '/workflows', { template: 'ui-locked', vars: { env: 'dark', ticks: 60 } });
  const page = await openPage(ADMIN, `/approvals?workflow=${id}&step=approve`, { colorScheme: 'dark' });
  await page.locator('#gate-digest').waitFor();
  await assertAccessible(page, 'approvals dark');
  await screenshot(page, 'approvals-dark');
  await page.goto(`${service.base}/ui#/locks`);
  await page.locator('section.lock[data-lock="env:dark"] tr[data-role="holder"]').waitFor();
  await assertAccessible(page, 'locks dark');
  await page.goto(`${service.base}/ui#/notifications`);
  await page.locator('#deliveries tbody tr').first().waitFor();
  await page.locator('main[data-loaded="true"]').waitFor();
  await assertAccessible(page, 'notifications dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await call(service, ADMIN, 'POST', `/workflows/${held.body.id}/cancel`);
  await call(service, ADMIN, 'POST', `/workflows/${id}/cancel`);
});
