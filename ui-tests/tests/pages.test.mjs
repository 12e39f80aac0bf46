// Every page, as every role, in both themes: the navigation offers what
// the role may open, each page it offers renders its data without a script
// error, a page above the role says so instead of failing, and each page
// passes axe-core at WCAG A/AA. The pages' own files test what they do;
// this one keeps the whole dashboard honest as pages are added.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, signedInPage, startService, waitWorkflow,
} from '../harness.mjs';

/** Every page of the navigation, with the least role that sees it. */
const PAGES = [
  { nav: 'workflows', hash: '#/workflows', role: 'viewer' },
  { nav: 'submit', hash: '#/submit', role: 'operator' },
  { nav: 'schedules', hash: '#/schedules', role: 'viewer' },
  { nav: 'approvals', hash: '#/approvals', role: 'viewer' },
  { nav: 'environments', hash: '#/environments', role: 'viewer' },
  { nav: 'nodes', hash: '#/nodes', role: 'viewer' },
  { nav: 'locks', hash: '#/locks', role: 'viewer' },
  { nav: 'storage', hash: '#/storage', role: 'admin' },
  { nav: 'access', hash: '#/access', role: 'admin' },
  { nav: 'notifications', hash: '#/notifications', role: 'admin' },
  { nav: 'audit', hash: '#/audit', role: 'admin' },
];
const ROLES = ['viewer', 'operator', 'admin'];
const atLeast = (role, needed) => ROLES.indexOf(role) >= ROLES.indexOf(needed);

let service;
let browser;
const tokens = {};
/** Two finished runs of one template: a workflow's page and their comparison. */
const runs = [];

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  tokens.admin = ADMIN;
  tokens.operator = await createToken(service, 'pages-operator', 'operator');
  tokens.viewer = await createToken(service, 'pages-viewer', 'viewer');
  for (const ticks of [1, 2]) {
    const { status, body } = await call(service, ADMIN, 'POST', '/workflows', { template: 'ui-slow', vars: { ticks } });
    assert.equal(status, 202, JSON.stringify(body));
    await waitWorkflow(service, body.id, (w) => w.status === 'completed');
    runs.push(body.id);
  }
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

/** Opens `hash` in the signed-in page and waits until it shows its data. */
async function open(page, hash) {
  await page.evaluate((target) => { location.hash = target; }, hash);
  // A page may add its state to the hash (`#/submit?template=...`).
  await page.waitForFunction((target) => location.hash.split('?')[0] === target.split('?')[0] && document.getElementById('main').dataset.loaded === 'true', hash);
}

for (const role of ROLES) {
  for (const colorScheme of ['light', 'dark']) {
    test(`as ${role}, ${colorScheme}: the navigation offers the role's pages, and each renders and is accessible`, async () => {
      const page = await signedInPage(browser, service, tokens[role], { colorScheme });
      const offered = await page.locator('nav[aria-label="Main"] a[data-nav]:visible').evaluateAll(
        (links) => links.map((a) => a.dataset.nav),
      );
      assert.deepEqual(offered, PAGES.filter((p) => atLeast(role, p.role)).map((p) => p.nav));
      const pages = [
        ...PAGES.filter((p) => atLeast(role, p.role)),
        // Pages reached from others: one workflow (graph, timeline, a step's panel) and a comparison.
        { nav: 'workflows', hash: `#/workflows/${runs[0]}` },
        { nav: 'workflows', hash: `#/compare?a=${runs[0]}&b=${runs[1]}` },
      ];
      for (const { nav, hash } of pages) {
        await open(page, hash);
        assert.equal(await page.locator('nav a[aria-current="page"]').getAttribute('data-nav'), nav);
        assert.equal(await page.getByRole('heading', { name: 'No such page' }).count(), 0, hash);
        await assertAccessible(page, `${hash} as ${role}, ${colorScheme}`);
      }
      assert.deepEqual(page.errors, []);
      await page.context().close();
    });
  }
}

test('a page above the role says which role it needs; an unknown page says so; #/test is the test environments', async () => {
  const page = await signedInPage(browser, service, tokens.viewer);
  for (const { hash } of PAGES.filter((p) => p.role === 'admin')) {
    await page.evaluate((target) => { location.hash = target; }, hash);
    await page.getByText('This page needs the admin role; you are viewer.').waitFor();
  }
  await page.evaluate(() => { location.hash = '#/no-such-page'; });
  await page.getByRole('heading', { name: 'No such page' }).waitFor();
  await open(page, '#/test');
  assert.equal(await page.locator('nav a[aria-current="page"]').getAttribute('data-nav'), 'environments');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
