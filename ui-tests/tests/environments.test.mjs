// The test environments page against a real service that makes real
// environments: Linux namespaces and cgroups, so root (CI runs as root),
// with `nu` and `python3` on PATH. The topology is the cheapest that has
// nodes and checks: `containerd_test`, one node running a simulated
// containerd. Every environment a test makes is deleted through the API
// in `after`, so no namespace or cgroup is left on the host.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, screenshot, signedInPage, startService,
} from '../harness.mjs';

const TOPOLOGY = 'containerd_test';

/** Why this machine cannot make environments, or null when it can. */
function cannotRun() {
  if (process.getuid?.() !== 0) return 'test environments need root (CI runs these tests as root)';
  try {
    execFileSync('nu', ['--version'], { stdio: 'ignore' });
  } catch {
    return 'test environments run the Nushell provisioning scripts: `nu` must be on PATH';
  }
  return null;
}
const why = cannotRun();
if (why) console.error(`\n**************** SKIPPED environments.test.mjs: ${why} ****************\n`);
/** The tests' options: skipped, saying why, where environments cannot be made. */
const when = why ? { skip: why } : {};

let service;
let browser;
// One signed-in page per role for the file (signing in is not what is
// tested here); a test switches its colour scheme with `emulateMedia`.
let operatorPage;
let viewerPage;

before(async () => {
  if (why) return;
  service = await startService({ scripts: 'real' });
  browser = await launchBrowser();
  const operator = await createToken(service, 'ui-env-operator', 'operator');
  const viewer = await createToken(service, 'ui-env-viewer', 'viewer');
  [operatorPage, viewerPage] = await Promise.all([
    signedInPage(browser, service, operator),
    signedInPage(browser, service, viewer),
  ]);
});

after(async () => {
  await browser?.close();
  if (service) {
    // Whatever a test made (kept, or left by a failure) is torn down.
    const { body } = await call(service, ADMIN, 'GET', '/test/environments');
    for (const env of body.environments ?? []) {
      if (env.status === 'deleted') continue;
      const deleted = await call(service, ADMIN, 'DELETE', `/test/environments/${env.id}?wait=true`);
      assert.equal(deleted.body.status, 'deleted', JSON.stringify(deleted.body));
    }
    await service.stop();
  }
});

async function environment(id) {
  const { status, body } = await call(service, ADMIN, 'GET', `/test/environments/${id}`);
  assert.equal(status, 200, JSON.stringify(body));
  return body;
}

test('a viewer sees each topology\'s nodes and checks before anything is made, and no action', when, async () => {
  const page = viewerPage;
  await page.goto(`${service.base}/ui#/environments?topology=${TOPOLOGY}`);
  await page.locator('main[data-loaded="true"]').waitFor();
  await page.getByRole('heading', { name: 'Test environments', level: 1 }).waitFor();
  const nodes = page.locator('#env-preview-nodes tbody tr');
  const checks = page.locator('#env-preview-checks tbody tr');
  await page.locator(`#env-preview[data-subject="${TOPOLOGY}"]`).waitFor();
  assert.equal(await nodes.count(), 1);
  assert.match(await nodes.first().textContent(), /containerd.*worker.*containerd.*simulated.*the defaults/);
  assert.deepEqual(await checks.locator('th').allTextContents(), ['containerd@containerd']);

  // Another topology: its nodes, each taskserv's own check, and its checks across nodes.
  await page.getByLabel('Topology', { exact: true }).selectOption('postgres_redis');
  await page.locator('#env-preview[data-subject="postgres_redis"]').waitFor();
  assert.deepEqual(await nodes.locator('th').allTextContents(), ['pg', 'redis']);
  const names = await checks.locator('th').allTextContents();
  assert.deepEqual(names.slice(0, 2), ['postgres@pg', 'redis@redis']);
  assert.ok(names.length > 2, `the cross-node checks: ${names}`);
  assert.match(page.url(), /#\/environments\?topology=postgres_redis$/);

  // One taskserv: one node named after it, its own check; bookmarkable.
  await page.getByLabel('One taskserv, alone on one node').check();
  await page.getByLabel('Taskserv', { exact: true }).selectOption('kubernetes');
  await page.locator('#env-preview[data-subject="kubernetes"]').waitFor();
  assert.match(page.url(), /\?taskserv=kubernetes$/);
  await page.reload();
  await page.locator('#env-preview[data-subject="kubernetes"]').waitFor();
  assert.equal(await page.getByLabel('One taskserv, alone on one node').isChecked(), true);
  assert.deepEqual(await checks.locator('th').allTextContents(), ['kubernetes@kubernetes']);

  // A viewer reads; the actions are not there.
  assert.equal(await page.getByRole('button', { name: 'Create' }).count(), 0);
  assert.equal(await page.getByRole('button', { name: 'Quick test' }).count(), 0);
  assert.equal(await page.getByRole('link', { name: 'Test environments' }).getAttribute('aria-current'), 'page');
  await assertAccessible(page, 'environments (viewer) light');
  await screenshot(page, 'environments-viewer');
  assert.deepEqual(page.errors, []);
});

test('an operator creates from a topology, watches it live, runs its checks, reads the logs and deletes it', when, async () => {
  const page = operatorPage;
  await page.goto(`${service.base}/ui#/test`);
  await page.locator('main[data-loaded="true"]').waitFor();
  await page.locator('#env-preview[data-subject]').waitFor();
  await page.getByLabel('Topology', { exact: true }).selectOption(TOPOLOGY);
  await page.locator(`#env-preview[data-subject="${TOPOLOGY}"]`).waitFor();
  // A bad time to live: the service's message, naming the field, and nothing made.
  await page.getByLabel('Time to live (optional)').fill('2 days');
  await page.getByRole('button', { name: 'Create', exact: true }).click();
  await page.locator('#env-error:not([hidden])').waitFor();
  assert.match(await page.locator('#env-error').textContent(), /^ttl: /);
  assert.equal((await call(service, ADMIN, 'GET', '/test/environments')).body.environments.length, 0);
  await page.getByLabel('Time to live (optional)').fill('');
  await page.getByLabel('Name (optional)').fill('ui-env');
  await page.getByRole('button', { name: 'Create', exact: true }).click();
  await page.waitForURL(/#\/environments\/[0-9a-f-]{36}$/);
  const id = page.url().split('/').at(-1);
  await page.evaluate(() => { window.notReloaded = true; });

  // Ready without a reload: the one event stream says so.
  await page.locator('#env-status[data-env-status="ready"]').waitFor({ timeout: 60000 });
  assert.equal(await page.evaluate(() => document.body.dataset.live), 'live');
  const node = page.locator('#env-nodes tbody tr[data-node="containerd"]');
  await page.locator('#env-nodes tbody tr[data-node="containerd"][data-status="running"]').waitFor();
  const env = await environment(id);
  assert.equal(env.status, 'ready');
  assert.equal(env.name, 'ui-env');
  const row = await node.textContent();
  assert.ok(row.includes(env.nodes[0].address), row);
  assert.match(row, /containerd :10010 simulated/);
  assert.match(row, /512 MiB, 512 pids, 1 CPU/);
  assert.equal(await page.locator('#env-checks tbody tr[data-check]').count(), 0);

  // Run: the checks fill in, live, with their output and log.
  await page.getByRole('button', { name: 'Run the checks' }).click();
  const check = page.locator('#env-checks tbody tr[data-check="containerd@containerd"][data-status="passed"]');
  await check.waitFor({ timeout: 60000 });
  await page.locator('#env-run[data-status="passed"]').waitFor();
  assert.match(await page.locator('#env-run').textContent(), /The last run passed: 1 passed, 0 failed of 1/);
  await check.getByText('Output and log').click();
  await check.locator('pre.log').waitFor();
  assert.match(await check.locator('pre.log').textContent(), /ok: /);
  assert.equal((await environment(id)).last_run.status, 'passed');
  // Run again (a second run of the same environment).
  await page.getByRole('button', { name: 'Run the checks again' }).click();
  await page.waitForFunction(() => document.querySelectorAll('#env-facts a[href^="#/workflows/"]').length === 3);
  await page.locator('#env-run[data-status="passed"]').waitFor({ timeout: 60000 });
  assert.equal((await environment(id)).run_workflows.length, 2);

  // The logs: every step's and check's, kept in the hash across a reload.
  await page.getByRole('button', { name: 'Show the logs' }).click();
  await page.locator('#env-logs details.log-entry').first().waitFor();
  assert.match(page.url(), /\?logs=1$/);
  const steps = await page.locator('#env-logs details.log-entry').evaluateAll((items) => items.map((i) => `${i.dataset.workflow}: ${i.dataset.step}`));
  assert.ok(steps.includes(`create: make the nodes of ui-env`), steps.join('\n'));
  assert.ok(steps.includes('run: check containerd@containerd'), steps.join('\n'));
  await page.locator('#env-logs details.log-entry[data-step="check containerd@containerd"] summary').first().click();
  await assertAccessible(page, 'environment (operator) light');
  await screenshot(page, 'environment');
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
  await page.reload();
  await page.locator('#env-logs details.log-entry').first().waitFor();

  // A viewer sees the same environment, in the dark, without its actions.
  const dark = viewerPage;
  await dark.emulateMedia({ colorScheme: 'dark' });
  await dark.goto(`${service.base}/ui#/environments/${id}`);
  await dark.locator('#env-checks tbody tr[data-status="passed"]').waitFor();
  assert.equal(await dark.locator('#env-nodes tbody tr').count(), 1);
  assert.equal(await dark.getByRole('button', { name: /Run the checks|Delete/ }).count(), 0);
  await assertAccessible(dark, 'environment (viewer) dark');
  assert.deepEqual(dark.errors, []);

  // Delete asks first; "Keep it" keeps it.
  await page.getByRole('button', { name: 'Delete', exact: true }).click();
  const dialog = page.getByRole('dialog', { name: 'Delete this environment?' });
  await dialog.waitFor();
  await assertAccessible(page, 'environment delete dialog light');
  await dialog.getByRole('button', { name: 'Keep it' }).click();
  await dialog.waitFor({ state: 'hidden' });
  assert.equal((await environment(id)).status, 'ready');
  await page.getByRole('button', { name: 'Delete', exact: true }).click();
  await dialog.getByRole('button', { name: 'Delete it' }).click();
  // Both pages follow the teardown through the event stream.
  await page.locator('#env-status[data-env-status="deleted"]').waitFor({ timeout: 60000 });
  await dark.locator('#env-status[data-env-status="deleted"]').waitFor({ timeout: 60000 });
  await page.locator('#env-nodes tbody tr[data-status="deleted"]').waitFor();
  assert.equal((await environment(id)).status, 'deleted');
  assert.equal(await page.getByRole('button', { name: /Run the checks|Delete/ }).count(), 0);

  // The list hides deleted environments unless asked.
  await page.getByRole('link', { name: '← Test environments' }).click();
  await page.locator('#environments').waitFor();
  await page.locator('#env-summary', { hasText: /deleted not shown/ }).waitFor();
  assert.equal(await page.locator(`#environments tr[data-env-id="${id}"]`).count(), 0);
  await page.getByLabel('Show deleted ones').check();
  await page.locator(`#environments tr[data-env-id="${id}"][data-status="deleted"]`).waitFor();
  assert.match(page.url(), /deleted=1/);
  assert.deepEqual(page.errors, []);
});

test('the quick test creates, runs, shows the result table and deletes, or keeps when asked', when, async () => {
  const page = operatorPage;
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/environments?taskserv=kubernetes`);
  await page.locator('#env-preview[data-subject="kubernetes"]').waitFor();
  await assertAccessible(page, 'environments (operator) dark');
  await page.getByRole('button', { name: 'Quick test' }).click();
  const quick = page.locator('#quick');
  // Whether the list shows the environment while the test makes it is a
  // matter of timing (the whole test may end within one coalesced
  // refresh), so what is asserted is the end: the list counts it among the
  // deleted, and another page's list follows the kept one below, live.
  await page.locator('#quick[data-state="done"]').waitFor({ timeout: 90000 });
  assert.equal(await quick.getAttribute('data-result'), 'passed', await quick.textContent());
  const first = await quick.getAttribute('data-env');
  await page.locator('#env-summary', { hasText: /deleted not shown/ }).waitFor();
  assert.equal(await page.locator(`#environments tr[data-env-id="${first}"]`).count(), 0);
  assert.deepEqual(await page.locator('#quick-checks tbody tr[data-status="passed"] th').allTextContents(), ['kubernetes@kubernetes']);
  assert.match(await page.locator('#quick-status').textContent(), /The last run passed: 1 passed, 0 failed of 1/);
  assert.match(await page.locator('#quick-summary').textContent(), /The environment is deleted\./);
  assert.equal((await environment(first)).status, 'deleted');
  await assertAccessible(page, 'environments quick test dark');
  await screenshot(page, 'environments-quick-dark');

  // Kept: the same, and the environment stays ready. A viewer's list,
  // which nothing but the event stream refreshes, shows it live.
  const watcher = viewerPage;
  await watcher.goto(`${service.base}/ui#/environments`);
  await watcher.locator('main[data-loaded="true"]').waitFor();
  await page.getByLabel('Keep the environment after a quick test').check();
  await page.getByRole('button', { name: 'Quick test' }).click();
  await page.waitForFunction((previous) => {
    const section = document.getElementById('quick');
    return section.dataset.state === 'done' && section.dataset.env !== previous;
  }, first, { timeout: 90000 });
  assert.equal(await quick.getAttribute('data-result'), 'passed', await quick.textContent());
  const kept = await quick.getAttribute('data-env');
  assert.match(await page.locator('#quick-summary').textContent(), /The environment is kept\./);
  const env = await environment(kept);
  assert.equal(env.status, 'ready');
  assert.equal(env.auto_cleanup, false);
  await page.locator(`#environments tbody tr[data-env-id="${kept}"][data-status="ready"]`).waitFor();
  await watcher.locator(`#environments tbody tr[data-env-id="${kept}"][data-status="ready"]`).waitFor({ timeout: 30000 });
  assert.deepEqual(watcher.errors, []);
  await page.getByRole('link', { name: `Open ${env.name}` }).click();
  await page.locator('#env-status[data-env-status="ready"]').waitFor();
  assert.deepEqual(page.errors, []);
  // `after` deletes it.
});
