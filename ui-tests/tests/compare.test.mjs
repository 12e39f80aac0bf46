// Comparing two runs (`#/compare?a=..&b=..`): two runs of the ui-compare
// fixture that differ in one input (`env`) and so in one output
// (`ship.target`) and in the second line of ship's log. The page shows
// exactly those differences, marked in words as well as colour; a viewer
// may open it; the workflow page's "Compare with…" leads to it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, signedInPage, startService, waitWorkflow,
} from '../harness.mjs';

let service;
let browser;
let viewer;
let operator;
let dev;
let prod;

async function run(vars) {
  const submitted = await call(service, ADMIN, 'POST', '/workflows', { template: 'ui-compare', vars });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
  await waitWorkflow(service, submitted.body.id, (w) => w.status === 'completed');
  return submitted.body.id;
}

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  viewer = await createToken(service, 'ui-compare-viewer', 'viewer');
  operator = await createToken(service, 'ui-compare-operator', 'operator');
  dev = await run({ env: 'dev' });
  prod = await run({ env: 'prod' });
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

/** The keys of the rows of `table` that differ (data-change other than same). */
async function differing(page, table, attribute) {
  return page.locator(`${table} tbody tr[data-change]:not([data-change="same"])`)
    .evaluateAll((rows, attr) => rows.map((r) => r.dataset[attr]), attribute);
}

test('a viewer sees exactly the differing input, output and first differing log line', async () => {
  const page = await signedInPage(browser, service, viewer);
  await page.goto(`${service.base}/ui#/compare?a=${dev}&b=${prod}`);
  await page.locator('#compare-steps').waitFor();
  assert.equal(await page.locator('#compare-summary').textContent(), '1 input differs; 1 of 2 steps differs.');
  // Both runs are links to their pages.
  assert.equal(await page.locator('a[data-run="a"]').getAttribute('href'), `#/workflows/${dev}`);
  assert.equal(await page.locator('a[data-run="b"]').getAttribute('href'), `#/workflows/${prod}`);

  // Inputs: env differs (in words, not only colour); size is the same.
  assert.deepEqual(await differing(page, '#compare-inputs', 'key'), ['env']);
  const env = page.locator('#compare-inputs tr[data-key="env"]');
  assert.match(await env.textContent(), /"dev".*"prod".*≠ differs/);
  assert.match(await page.locator('#compare-inputs tr[data-key="size"]').textContent(), /= same/);

  // Steps: ship differs in its output and its log; build is the same.
  assert.deepEqual(await differing(page, '#compare-steps', 'step'), ['ship']);
  const ship = page.locator('#compare-steps tr[data-step="ship"]');
  assert.equal(await ship.locator('[data-field="what"]').textContent(), 'output target; log from line 2');

  // Opening the row shows the changed output and the first differing line.
  await ship.getByRole('button', { name: /ship/ }).click();
  const details = page.locator('tr[data-details="ship"]');
  await details.locator('.log-diff').waitFor();
  assert.equal(await ship.getByRole('button', { name: /ship/ }).getAttribute('aria-expanded'), 'true');
  assert.deepEqual(await details.locator('.compare-outputs tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.key)), ['target']);
  assert.equal(await details.locator('.log-diff').getAttribute('data-line'), '2');
  assert.match(await details.locator('.log-diff').textContent(), /First differing line: 2/);
  assert.equal(await details.locator('.log-line[data-side="a"] code').textContent(), 'shipping to dev');
  assert.equal(await details.locator('.log-line[data-side="b"] code').textContent(), 'shipping to prod');
  assert.match(await details.textContent(), /1 other output key is the same/);
  await assertAccessible(page, 'compare light');

  // Only what differs: the same step and input go, and the hash keeps it.
  await page.getByLabel('Only what differs').check();
  await page.waitForFunction(() => location.hash.includes('only=1'));
  await page.locator('#compare-steps tr[data-step="build"]').waitFor({ state: 'detached' });
  assert.equal(await page.locator('#compare-inputs tr[data-key="size"]').count(), 0);
  await page.reload();
  await page.locator('#compare-steps').waitFor();
  assert.equal(await page.getByLabel('Only what differs').isChecked(), true);
  assert.equal(await page.locator('#compare-steps tr[data-step="build"]').count(), 0);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the comparison passes axe in the dark theme (as an admin: the same page, no action on it)', async () => {
  const page = await signedInPage(browser, service, ADMIN, { colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/compare?a=${dev}&b=${prod}`);
  await page.locator('#compare-steps tr[data-step="ship"] button').click();
  await page.locator('tr[data-details="ship"] .log-diff').waitFor();
  await assertAccessible(page, 'compare dark');
  assert.equal(await page.locator('main button.primary, main button.danger').count(), 0);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('"Compare with…" on a workflow lists the other runs of its template and opens the comparison', async () => {
  const other = await call(service, ADMIN, 'POST', '/workflows', { template: 'ui-slow', vars: { ticks: 1 } });
  assert.equal(other.status, 202);
  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/workflows/${dev}`);
  await page.locator('.head-status[data-status="completed"]').waitFor();
  await page.locator('#compare-with summary').click();
  const link = page.locator(`#compare-with a[data-compare-with="${prod}"]`);
  await link.waitFor();
  // Only runs of the same template, never the workflow itself.
  assert.equal(await page.locator('#compare-with a[data-compare-with]').count(), 1);
  // (The workflow page's own axe check is the integrator's sweep: its graph
  // and timeline are another part's.)
  await link.click();
  await page.waitForFunction((b) => location.hash.startsWith('#/compare?') && location.hash.includes(b), prod);
  await page.locator('#compare-steps').waitFor();
  assert.equal(await page.locator('#compare-summary').textContent(), '1 input differs; 1 of 2 steps differs.');

  // Two templates cannot be compared: the page says why.
  await page.goto(`${service.base}/ui#/compare?a=${dev}&b=${other.body.id}`);
  await page.locator('#compare-error').waitFor();
  assert.match(await page.locator('#compare-error').textContent(), /only runs of one template can be compared/);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
