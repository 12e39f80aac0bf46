// "Re-run from here" on a step of a finished workflow: the page asks for a
// new revision from that step and opens it; the steps before it keep their
// outputs. Every wait is on what the page shows, never a sleep.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { ADMIN, call, createToken, launchBrowser, signedInPage, startService, waitWorkflow } from '../harness.mjs';

let service;
let browser;
let operator;
let viewer;

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  operator = await createToken(service, 'ui-rerun-operator', 'operator');
  viewer = await createToken(service, 'ui-rerun-viewer', 'viewer');
  // ui-gate's check step reads this secret.
  const put = await call(service, ADMIN, 'PUT', '/secrets/ui_password', { value: 'ui-rerun-secret', templates: ['ui-gate'] });
  assert.equal(put.status, 200, JSON.stringify(put.body));
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

test('re-run from a step opens the new revision, in which the steps before it are kept', async () => {
  const gate = '/';
  const submitted = await call(service, operator, 'POST', '/workflows', {
    template: 'ui-gate', vars: { gate }, meta: { ref: 'ui-rerun' },
  });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
  const id = submitted.body.id;
  await waitWorkflow(service, id, (w) => w.status === 'completed');
  const check = submitted.body.tasks.find((t) => t.step.ref_name === 'check').id;

  // A viewer is offered no re-run.
  const viewing = await signedInPage(browser, service, viewer);
  await viewing.goto(`${service.base}/ui#/workflows/${id}?task=${check}`);
  await viewing.locator('#step[data-task-id]').waitFor();
  assert.equal(await viewing.locator('button[data-action="rerun-from"]').count(), 0);
  await viewing.context().close();

  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/workflows/${id}?task=${check}`);
  await page.locator('.head-status[data-status="completed"]').waitFor();
  await page.locator('button[data-action="rerun-from"]').click();
  // The page moves to the new revision, which completes.
  await page.waitForFunction((old) => location.hash.startsWith('#/workflows/') && !location.hash.includes(old), id);
  await page.locator('.head-status[data-status="completed"]').waitFor({ timeout: 60000 });
  const newId = await page.evaluate(() => location.hash.split('/')[2].split('?')[0]);
  const revision = await call(service, operator, 'GET', `/workflows/${newId}`);
  assert.equal(revision.body.revision, 2);
  assert.equal(revision.body.previous_revision, id);
  // Asked for by the operator's token, whose revision it is: the head says so.
  assert.equal(submitted.body.submitted_by, 'ui-rerun-operator');
  assert.equal(revision.body.submitted_by, 'ui-rerun-operator');
  await page.locator('p.facts', { hasText: 'by ui-rerun-operator' }).waitFor();
  const prepare = revision.body.tasks.find((t) => t.step.ref_name === 'prepare');
  assert.ok(prepare.kept_from, 'prepare keeps its output');
  assert.ok(!revision.body.tasks.find((t) => t.step.ref_name === 'check').kept_from, 'check ran again');

  // The kept step says so in its panel.
  await page.goto(`${service.base}/ui#/workflows/${newId}?task=${prepare.id}`);
  await page.locator('#step', { hasText: 'Kept from' }).waitFor();
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
