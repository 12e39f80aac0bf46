// The Access page (#/access) in a real browser: tokens created (shown
// once, copied), used and revoked; secrets set, replaced and deleted
// without their value ever staying in the page; and the admin role it
// needs. Each action goes through the page; its effect is checked through
// the API.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, screenshot, signedInPage, startService,
} from '../harness.mjs';

let service;
let browser;
let operator;
let viewer;

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  operator = await createToken(service, 'access-operator', 'operator');
  viewer = await createToken(service, 'access-viewer', 'viewer');
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

async function openAccess(token, options) {
  const page = await signedInPage(browser, service, token, options);
  await page.goto(`${service.base}/ui#/access`);
  return page;
}

test('an admin creates a token, sees it once with a copy button, and revokes it after a confirmation', async () => {
  const page = await openAccess(ADMIN);
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write'], { origin: service.base });
  await page.locator('main[data-loaded="true"]').waitFor();
  await page.locator('#tokens tr[data-name="bootstrap"]').waitFor();
  // The audit log is one link away, as before.
  assert.equal(await page.getByRole('link', { name: 'Audit log →' }).getAttribute('href'), '#/audit');

  await page.getByLabel('Name', { exact: true }).first().fill('ci-bot');
  await page.getByLabel('Role').selectOption('viewer');
  await page.getByRole('button', { name: 'Create token' }).click();
  const shown = page.locator('#new-token');
  await shown.waitFor();
  const token = await shown.inputValue();
  assert.match(token, /^orch_/);
  assert.match(await page.locator('#token-issued').textContent(), /only time the token is shown/);
  await page.locator('#token-issued button[data-action="copy"]').click();
  await page.locator('#token-issued', { hasText: 'Copied to the clipboard.' }).waitFor();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), token);
  await page.locator('#tokens tr[data-name="ci-bot"][data-revoked="false"]').waitFor();
  await assertAccessible(page, 'access light, a new token shown');
  await screenshot(page, 'access');

  // The token works, with the role chosen.
  const listed = await call(service, ADMIN, 'GET', '/tokens');
  const record = listed.body.tokens.find((t) => t.name === 'ci-bot');
  assert.equal(record.role, 'viewer');
  assert.equal((await call(service, token, 'GET', '/workflows')).status, 200);
  assert.equal((await call(service, token, 'GET', '/tokens')).status, 403);

  // Dismissed, it is nowhere in the page, nor in storage or the URL; a reload does not bring it back.
  await page.locator('#token-issued button[data-action="dismiss"]').click();
  await page.locator('#new-token').waitFor({ state: 'detached' });
  assert.ok(!(await page.content()).includes(token), 'the token stayed in the page');
  const kept = await page.evaluate((t) => JSON.stringify(localStorage).includes(t) || JSON.stringify(sessionStorage).includes(t)
    || location.href.includes(t), token);
  assert.equal(kept, false);
  await page.reload();
  await page.locator('#tokens tr[data-name="ci-bot"]').waitFor();
  assert.ok(!(await page.content()).includes(token), 'the token came back after a reload');

  // Revoke asks first; "Keep" keeps it.
  const row = page.locator('#tokens tr[data-name="ci-bot"]');
  await row.locator('button[data-action="revoke-token"]').click();
  await row.getByText('Revoke ci-bot? Every client using it is refused from now on.').waitFor();
  await row.locator('button[data-action="revoke-token-keep"]').click();
  assert.equal((await call(service, token, 'GET', '/workflows')).status, 200);
  await row.locator('button[data-action="revoke-token"]').click();
  await row.locator('button[data-action="revoke-token-confirm"]').click();
  await page.locator('#tokens tr[data-name="ci-bot"][data-revoked="true"]').waitFor();
  assert.equal((await call(service, token, 'GET', '/workflows')).status, 401);
  const revoked = (await call(service, ADMIN, 'GET', '/tokens')).body.tokens.find((t) => t.name === 'ci-bot');
  assert.ok(revoked.revoked_at);
  // A revoked token has nothing left to revoke.
  assert.equal(await page.locator('#tokens tr[data-name="ci-bot"] button').count(), 0);

  // A refused creation (a name ending with a space) says why, next to the form.
  await page.getByLabel('Name', { exact: true }).first().fill('ci-bot ');
  await page.getByRole('button', { name: 'Create token' }).click();
  await page.locator('#token-form-error:not([hidden])').waitFor();
  assert.match(await page.locator('#token-form-error').textContent(), /^name: /);
  assert.equal(await page.locator('#new-token').count(), 0);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an admin sets, replaces and deletes a secret; its value never stays in the page', async () => {
  const first = 'ui-access-first-secret-value';
  const second = 'ui-access-second-secret-value';
  const page = await openAccess(ADMIN);
  await page.locator('main[data-loaded="true"]').waitFor();
  // Watch every change of the page for the values, from now on.
  await page.evaluate((values) => {
    window.leaked = [];
    const check = (text) => values.forEach((v) => { if (text && text.includes(v)) window.leaked.push(v); });
    new MutationObserver((changes) => {
      for (const change of changes) {
        check(change.target.textContent);
        for (const node of change.addedNodes) check(node.textContent);
        if (change.type === 'attributes') check(change.target.getAttribute(change.attributeName));
      }
    }).observe(document.getElementById('main'), { subtree: true, childList: true, attributes: true, characterData: true });
  }, [first, second]);

  await page.locator('#secret-name').fill('deploy_key');
  await page.locator('#secret-value').fill(first);
  await page.locator('#secret-templates').fill('ui-gate, ui-slow');
  await page.locator('#secret-origins').fill('https://vault.example.com');
  await page.getByRole('button', { name: 'Store secret' }).click();
  const row = page.locator('#secrets tr[data-secret="deploy_key"]');
  await row.waitFor();
  assert.equal(await page.locator('#secret-value').inputValue(), '');
  assert.equal(await row.locator('[data-scope="templates"]').textContent(), 'ui-gate, ui-slow');
  assert.equal(await row.locator('[data-scope="origins"]').textContent(), 'https://vault.example.com');
  let stored = (await call(service, ADMIN, 'GET', '/secrets')).body.secrets.find((s) => s.name === 'deploy_key');
  assert.deepEqual(stored.scope, { templates: ['ui-gate', 'ui-slow'], origins: ['https://vault.example.com'] });
  const firstUpdate = stored.updated_at;
  await assertAccessible(page, 'access light, a secret listed');

  // Replace: the form comes filled with the name and scope, never a value.
  await row.locator('button[data-action="replace-secret"]').click();
  assert.equal(await page.locator('#secret-name').inputValue(), 'deploy_key');
  assert.equal(await page.locator('#secret-value').inputValue(), '');
  assert.equal(await page.locator('#secret-templates').inputValue(), 'ui-gate, ui-slow');
  await page.locator('#secret-value').fill(second);
  await page.locator('#secret-templates').fill('ui-gate');
  await page.getByRole('button', { name: 'Replace secret' }).click();
  await row.locator('[data-scope="templates"]', { hasText: /^ui-gate$/ }).waitFor();
  assert.equal(await page.locator('#secret-value').inputValue(), '');
  stored = (await call(service, ADMIN, 'GET', '/secrets')).body.secrets.find((s) => s.name === 'deploy_key');
  assert.deepEqual(stored.scope.templates, ['ui-gate']);
  assert.notEqual(stored.updated_at, firstUpdate);

  // A refused one (a bad name) says why, and the value is gone from the field all the same.
  await page.locator('#secret-name').fill('bad/name');
  await page.locator('#secret-value').fill(first);
  await page.getByRole('button', { name: 'Store secret' }).click();
  await page.locator('#secret-form-error:not([hidden])').waitFor();
  assert.equal(await page.locator('#secret-value').inputValue(), '');

  // Delete asks first.
  await row.locator('button[data-action="delete-secret"]').click();
  await row.locator('button[data-action="delete-secret-confirm"]').click();
  await row.waitFor({ state: 'detached' });
  const after = (await call(service, ADMIN, 'GET', '/secrets')).body.secrets;
  assert.equal(after.some((s) => s.name === 'deploy_key'), false);

  assert.deepEqual(await page.evaluate(() => window.leaked), []);
  const html = await page.content();
  assert.ok(!html.includes(first) && !html.includes(second), 'a secret value is in the page');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an operator and a viewer get the admin notice, no Access link and no action', async () => {
  for (const [token, role] of [[operator, 'operator'], [viewer, 'viewer']]) {
    const page = await openAccess(token);
    await page.getByText(`This page needs the admin role; you are ${role}.`).waitFor();
    assert.equal(await page.getByRole('link', { name: 'Access' }).isVisible(), false);
    assert.equal(await page.locator('#tokens, #secrets, form').count(), 0);
    assert.equal(await page.getByRole('button', { name: /create|revoke|store|delete/i }).count(), 0);
    assert.deepEqual(page.errors, []);
    await page.context().close();
  }
});

test('the Access page passes axe in the dark theme', async () => {
  await call(service, ADMIN, 'PUT', '/secrets/dark_secret', { value: 'dark-secret-value-0123', templates: ['ui-gate'] });
  const page = await openAccess(ADMIN, { colorScheme: 'dark' });
  await page.locator('#secrets tr[data-secret="dark_secret"]').waitFor();
  await page.locator('#token-name').fill('dark-bot');
  await page.getByRole('button', { name: 'Create token' }).click();
  await page.locator('#new-token').waitFor();
  await page.locator('#secrets tr[data-secret="dark_secret"] button[data-action="delete-secret"]').click();
  await page.locator('button[data-action="delete-secret-confirm"]').waitFor();
  await assertAccessible(page, 'access dark');
  await screenshot(page, 'access-dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
