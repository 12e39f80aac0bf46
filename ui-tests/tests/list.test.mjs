// The workflow list: the service's search (`q`: name, template, reference,
// input values, any case) from the page's search box, kept in the hash so
// a reload or a shared link shows the same; and cancelling several
// workflows at once, as an operator (a viewer has no such control).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, signedInPage, startService, waitWorkflow,
} from '../harness.mjs';

let service;
let browser;
let operator;
let viewer;
const ids = {};

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  operator = await createToken(service, 'list-operator', 'operator');
  viewer = await createToken(service, 'list-viewer', 'viewer');
  const put = await call(service, ADMIN, 'PUT', '/secrets/ui_password', { value: 'list-secret', templates: ['ui-gate'] });
  assert.equal(put.status, 200, JSON.stringify(put.body));
  const submit = async (body) => {
    const answer = await call(service, operator, 'POST', '/workflows', body);
    assert.equal(answer.status, 202, JSON.stringify(answer.body));
    return answer.body.id;
  };
  // Two long ones (to cancel) and a short one that fails.
  ids.alpha = await submit({ template: 'ui-slow', vars: { ticks: 400 }, meta: { name: 'Alpha Nightly Build', ref: 'list-ref-alpha' } });
  ids.beta = await submit({ template: 'ui-slow', vars: { ticks: 400 }, meta: { name: 'beta rollout', ref: 'list-ref-beta' } });
  ids.gamma = await submit({ template: 'ui-gate', vars: { gate: '/nowhere/Zebra-Gate-Path' }, meta: { name: 'gamma' } });
  await waitWorkflow(service, ids.gamma, (w) => w.status === 'failed');
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

/** The ids of the rows the list shows now. */
const rowIds = (page) => page.locator('#workflows tbody tr[data-workflow-id]')
  .evaluateAll((rows) => rows.map((r) => r.dataset.workflowId));

/** Waits until the list shows exactly `expected` (ids, newest first). */
async function waitRows(page, expected) {
  await page.waitForFunction((want) => {
    const rows = [...document.querySelectorAll('#workflows tbody tr[data-workflow-id]')].map((r) => r.dataset.workflowId);
    return JSON.stringify(rows) === JSON.stringify(want);
  }, expected, { timeout: 15000 });
}

test('the service searches name, template, reference and input values, any case, within a bound', async () => {
  const search = async (q) => (await call(service, viewer, 'GET', `/workflows?q=${encodeURIComponent(q)}`)).body.workflows.map((w) => w.id);
  assert.deepEqual(await search('ALPHA nightly'), [ids.alpha]);
  assert.deepEqual(await search('ui-gate'), [ids.gamma]);
  assert.deepEqual(await search('List-Ref-Beta'), [ids.beta]);
  assert.deepEqual(await search('zebra-gate'), [ids.gamma]);
  const counts = await call(service, viewer, 'GET', '/workflows/counts?q=ui-slow');
  assert.equal(counts.body.total, 2);
  const long = await call(service, viewer, 'GET', `/workflows?q=${'x'.repeat(201)}`);
  assert.equal(long.status, 400);
  assert.match(long.body.error.message, /^q: 201 characters is more than the maximum of 200/);
});

test('the page searches by each of name, template, reference and input text, and a reload keeps the search', async () => {
  const page = await signedInPage(browser, service, viewer);
  await page.locator('#workflows tbody tr[data-workflow-id]').first().waitFor();
  const search = page.getByRole('searchbox', { name: 'Search' });
  for (const [q, expected] of [
    ['ALPHA nightly', [ids.alpha]],
    ['ui-gate', [ids.gamma]],
    ['list-ref-beta', [ids.beta]],
    ['Zebra-GATE', [ids.gamma]],
  ]) {
    await search.fill(q);
    await search.press('Enter');
    await page.waitForURL((url) => new URLSearchParams(url.hash.split('?')[1]).get('q') === q);
    await waitRows(page, expected);
  }
  // Bookmarkable: the search is in the hash; a reload shows it again.
  await page.reload();
  await waitRows(page, [ids.gamma]);
  assert.equal(await search.inputValue(), 'Zebra-GATE');
  assert.equal(Number(await page.locator('.count[data-status="all"] .count-n').textContent()), 1);
  // A viewer has no checkboxes and no bulk cancel.
  assert.equal(await page.locator('#workflows input[type="checkbox"]').count(), 0);
  assert.equal(await page.locator('#cancel-selected').count(), 0);
  await assertAccessible(page, 'workflows search light (viewer)');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an operator cancels several workflows at once, after a confirmation, and sees each outcome', async () => {
  const page = await signedInPage(browser, service, operator, { colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/workflows?q=list-ref`);
  await waitRows(page, [ids.beta, ids.alpha]);
  const button = page.locator('#cancel-selected');
  assert.equal(await button.isVisible(), false);
  await page.getByRole('checkbox', { name: 'Select Alpha Nightly Build' }).check();
  await button.getByText('Cancel 1 selected').waitFor();
  await page.getByRole('checkbox', { name: 'Select every unfinished workflow on this page' }).check();
  await button.getByText('Cancel 2 selected').waitFor();
  // Thinking better of it changes nothing.
  await button.click();
  await page.getByText('Cancel 2 workflows?').waitFor();
  await assertAccessible(page, 'workflows multi-cancel dark');
  await page.getByRole('button', { name: 'Keep them' }).click();
  assert.equal((await call(service, ADMIN, 'GET', `/workflows/${ids.alpha}`)).body.cancel_requested, false);

  await button.click();
  await page.getByRole('button', { name: 'Yes, cancel them' }).click();
  await page.locator('#cancel-report li[data-outcome="cancelled"]').nth(1).waitFor();
  assert.match(await page.locator('#cancel-report').textContent(), /2 of 2 cancelled/);
  for (const id of [ids.alpha, ids.beta]) {
    await page.locator(`#workflows tr[data-workflow-id="${id}"][data-status="cancelled"]`).waitFor({ timeout: 30000 });
    const { body } = await call(service, ADMIN, 'GET', `/workflows/${id}`);
    assert.equal(body.status, 'cancelled');
  }
  // Finished workflows cannot be ticked, so the button is gone.
  assert.equal(await button.isVisible(), false);
  assert.equal(await page.locator('#workflows tbody input[data-pick]').count(), 0);
  // Each cancel went through the one operation, and the audit log has it.
  const audit = await call(service, ADMIN, 'GET', '/audit?action=workflow.cancel');
  for (const id of [ids.alpha, ids.beta]) {
    assert.ok(audit.body.records.some((r) => r.target?.includes(id)), JSON.stringify(audit.body).slice(0, 400));
  }
  await assertAccessible(page, 'workflows after multi-cancel dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
