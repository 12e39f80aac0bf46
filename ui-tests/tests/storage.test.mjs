// The storage page (#/storage, admins only) in a real browser against a
// real service: the store in use, a real live move from the filesystem
// store to another directory (the backend the default build has) with
// its phases, a rollback, and a cancelled move.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, signedInPage, startService,
} from '../harness.mjs';

let service;
let browser;
let targets;

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  targets = mkdtempSync(join(tmpdir(), 'orchestrator-ui-moves-'));
});

after(async () => {
  await browser?.close();
  await service?.stop();
  if (targets) rmSync(targets, { recursive: true, force: true });
});

/** Starts a move through the page's form, confirming it. */
async function startMove(page, directory, batchSize) {
  await page.getByLabel('Backend').selectOption('filesystem');
  await page.getByLabel('Directory').fill(directory);
  await page.getByLabel('Records per batch (optional)').fill(batchSize ? String(batchSize) : '');
  await page.getByRole('button', { name: 'Start the move' }).click();
  await page.getByRole('dialog').getByRole('button', { name: 'Start the move' }).click();
}

test('viewers and operators have no storage page and no link to it', async () => {
  for (const role of ['viewer', 'operator']) {
    const token = await createToken(service, `storage-${role}`, role);
    const page = await signedInPage(browser, service, token);
    assert.equal(await page.getByRole('link', { name: 'Storage' }).count(), 0);
    await page.goto(`${service.base}/ui#/storage`);
    await page.getByText(`This page needs the admin role; you are ${role}.`).waitFor();
    assert.equal(await page.getByRole('button', { name: 'Start the move' }).count(), 0);
    assert.deepEqual(page.errors, []);
    await page.context().close();
  }
});

test('an admin moves the store to another directory live, then rolls back', async () => {
  const page = await signedInPage(browser, service, ADMIN);
  await page.getByRole('link', { name: 'Storage' }).click();
  await page.locator('#storage-backend[data-backend="filesystem"]').waitFor();
  await page.locator('#storage-location', { hasText: service.dataDir }).waitFor();
  // Only what this build has is offered.
  const { body: store } = await call(service, ADMIN, 'GET', '/admin/storage');
  const offered = await page.getByLabel('Backend').locator('option').evaluateAll((os) => os.map((o) => o.value));
  assert.deepEqual(offered, store.backends);
  await page.getByText('This service has not moved its store yet.').waitFor();
  await assertAccessible(page, 'storage light');

  // A relative directory: the service's refusal, next to the form.
  await startMove(page, 'relative/dir');
  await page.locator('#move-error', { hasText: 'the directory must be absolute' }).waitFor();

  const moved = join(targets, 'moved');
  await startMove(page, moved);
  await page.locator('.move-head[data-phase="completed"]').waitFor();
  for (const phase of ['copying', 'mirroring', 'verifying', 'switching', 'completed']) {
    await page.locator(`ol.phases li[data-phase="${phase}"][data-state="done"]`).waitFor();
  }
  await page.locator('#storage-location', { hasText: moved }).waitFor();
  await page.locator('#storage-previous', { hasText: service.dataDir }).waitFor();
  assert.equal((await call(service, ADMIN, 'GET', '/admin/storage')).body.store, `filesystem:${moved}`);
  const { body: health } = await call(service, ADMIN, 'GET', '/health');
  assert.equal(health.status, 'ok', JSON.stringify(health));
  await page.locator(`#storage-moves tr[data-phase="completed"]`).waitFor();

  // Roll back: asked first, then done, and the page shows the store again.
  await page.getByRole('button', { name: `Roll back to filesystem:${service.dataDir}` }).click();
  await page.getByRole('dialog').getByRole('button', { name: 'Roll back' }).click();
  await page.locator('#storage-location', { hasText: service.dataDir }).waitFor();
  await page.locator('#storage-previous', { hasText: moved }).waitFor();
  assert.equal((await call(service, ADMIN, 'GET', '/admin/storage')).body.store, `filesystem:${service.dataDir}`);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an admin cancels a move before its switch; the service stays on its store', async () => {
  // Enough records that a copy one record per batch (each batch synced)
  // lasts longer than a click.
  await Promise.all(Array.from({ length: 300 }, (_, i) => call(service, ADMIN, 'PUT', `/secrets/cancel_me_${i}`, { value: `v${i}` })));
  const page = await signedInPage(browser, service, ADMIN, { colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/storage`);
  await page.locator('#storage-backend').waitFor();
  await startMove(page, join(targets, 'cancelled'), 1);
  await page.locator('.move-head[data-phase="copying"]').waitFor();
  await page.locator('#move-progress').waitFor();
  await page.getByRole('button', { name: 'Cancel the move' }).click();
  await page.locator('.move-head[data-phase="cancelled"]').waitFor();
  await page.locator('#storage-location', { hasText: service.dataDir }).waitFor();
  assert.equal((await call(service, ADMIN, 'GET', '/admin/storage')).body.store, `filesystem:${service.dataDir}`);
  const { body: list } = await call(service, ADMIN, 'GET', '/admin/storage/migrations');
  assert.equal(list.migrations.at(-1).phase, 'cancelled');
  await assertAccessible(page, 'storage dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
