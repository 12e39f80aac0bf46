// A thousand-step workflow's page: it opens quickly (the time is printed,
// never asserted: a loaded machine must not fail the build), the 998
// `for_each` instances fold into one node with counts by status, the
// view pans and zooms, a step is found by name, and a status change
// reaches the folded node's counts live.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, signedInPage, startService,
} from '../harness.mjs';

const HOSTS = Array.from({ length: 998 }, (_, i) => `host-${String(i + 1).padStart(4, '0')}`);
let service;
let browser;
let operator;
let viewer;
let id;
let tasks;

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  operator = await createToken(service, 'big-operator', 'operator');
  viewer = await createToken(service, 'big-viewer', 'viewer');
  const submitted = await call(service, operator, 'POST', '/workflows', { template: 'ui-big', vars: { hosts: HOSTS } });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body).slice(0, 400));
  id = submitted.body.id;
  tasks = submitted.body.tasks;
  assert.equal(tasks.length, 1000);
});

after(async () => {
  if (id) await call(service, ADMIN, 'POST', `/workflows/${id}/cancel`);
  await browser?.close();
  await service?.stop();
});

const group = (page) => page.locator('svg.dag .node.group[data-group="install"]');
const view = (page) => page.locator('svg.dag').evaluate((svg) => ({
  k: Number(svg.dataset.scale), x: Number(svg.dataset.x), y: Number(svg.dataset.y),
}));

/** Opens the workflow from the list, in the page, and answers how long until its graph showed (ms). */
async function openTimed(page) {
  await page.locator('#workflows tbody tr[data-workflow-id]').first().waitFor();
  return page.evaluate((workflow) => new Promise((resolve) => {
    const main = document.getElementById('main');
    const t0 = performance.now();
    const done = () => main.dataset.loaded === 'true' && document.querySelector('#dag svg.dag .node');
    new MutationObserver((_, observer) => {
      if (!done()) return;
      observer.disconnect();
      // The next frame: laid out and painted.
      requestAnimationFrame(() => resolve(performance.now() - t0));
    }).observe(main, { attributes: true, attributeFilter: ['data-loaded'] });
    location.hash = `#/workflows/${workflow}`;
  }), id);
}

test('a 1,000-step workflow opens quickly, its 998 instances folded into one node with counts', async (t) => {
  const page = await signedInPage(browser, service, operator);
  const ms = await openTimed(page);
  t.diagnostic(`1,000-step workflow page opened in ${ms.toFixed(0)} ms`);
  console.log(`# 1,000-step workflow page opened in ${ms.toFixed(0)} ms`);
  // The gate, the folded installs, the report.
  assert.equal(await page.locator('svg.dag .node').count(), 3);
  assert.equal(await group(page).getAttribute('aria-expanded'), 'false');
  assert.match(await group(page).textContent(), /install ×998/);
  await page.waitForFunction(() => /^pending:998$|^queued:\d+ pending:\d+$/.test(
    document.querySelector('svg.dag .node.group').dataset.counts,
  ));
  assert.equal(await group(page).locator('desc').textContent(), '998 pending. Activate to unfold.');
  await page.getByRole('button', { name: 'install ×998, folded' }).waitFor();
  // The timeline of a thousand rows waits until asked for.
  assert.equal(await page.locator('#timeline .bar').count(), 0);
  await page.getByText('Show the timeline of 1,000 steps').waitFor();
  await assertAccessible(page, 'big workflow light');

  // Unfolding (here from the keyboard; a click does the same) shows every
  // instance, the first one focused; folding all brings the one node back.
  await group(page).focus();
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelectorAll('svg.dag .node').length === 1000);
  assert.equal(await page.locator('svg.dag .node[data-task-id]').count(), 1000);
  assert.equal(await page.evaluate(() => document.activeElement?.textContent.includes('install host-0001')), true);
  await page.getByRole('button', { name: 'Fold all instances of every step', exact: true }).click();
  await page.waitForFunction(() => document.querySelectorAll('svg.dag .node').length === 3);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('the graph pans by dragging and zooms by wheel and buttons (keyboard too), and fits', async () => {
  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/workflows/${id}`);
  await group(page).waitFor();
  const start = await view(page);
  await page.getByRole('button', { name: 'Zoom in' }).click();
  const zoomed = await view(page);
  assert.ok(zoomed.k > start.k, JSON.stringify({ start, zoomed }));
  // Keyboard: the buttons are buttons.
  await page.getByRole('button', { name: 'Zoom out' }).focus();
  await page.keyboard.press('Enter');
  await page.keyboard.press('Enter');
  assert.ok((await view(page)).k < zoomed.k);
  // The wheel zooms around the pointer.
  const box = await page.locator('.dag-viewport').boundingBox();
  await page.mouse.move(box.x + box.width - 30, box.y + box.height - 30);
  const beforeWheel = await view(page);
  await page.mouse.wheel(0, -300);
  await page.waitForFunction((k) => Number(document.querySelector('svg.dag').dataset.scale) > k, beforeWheel.k);
  // A drag on the background pans.
  const beforeDrag = await view(page);
  await page.mouse.move(box.x + box.width - 20, box.y + 20);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width - 120, box.y + 80, { steps: 5 });
  await page.mouse.up();
  const dragged = await view(page);
  assert.ok(Math.abs(dragged.x - (beforeDrag.x - 100)) < 1 && Math.abs(dragged.y - (beforeDrag.y + 60)) < 1, JSON.stringify({ beforeDrag, dragged }));
  assert.match(await page.locator('svg.dag .dag-view').getAttribute('transform'), /^translate\(.+\) scale\(.+\)$/);
  // Fit puts the whole graph back in sight.
  await page.getByRole('button', { name: 'Fit the graph in the view' }).click();
  const fitted = await view(page);
  assert.notDeepEqual(fitted, dragged);
  const inside = await page.evaluate(() => {
    const frame = document.querySelector('.dag-viewport').getBoundingClientRect();
    return [...document.querySelectorAll('svg.dag .node')].every((n) => {
      const b = n.getBoundingClientRect();
      return b.left >= frame.left - 1 && b.right <= frame.right + 1 && b.top >= frame.top - 8 && b.bottom <= frame.bottom + 1;
    });
  });
  assert.equal(inside, true);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a step is found by name: listed, unfolded, centred and focused', async () => {
  const page = await signedInPage(browser, service, viewer, { colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/workflows/${id}`);
  await group(page).waitFor();
  const find = page.getByRole('searchbox', { name: 'Find a step' });
  // Many matches: counted, the first few listed.
  await find.fill('host-01');
  await page.getByText('100 steps found').waitFor();
  assert.equal(await page.locator('#dag-matches button[data-find-task]').count(), 20);
  await find.fill('install host-0500');
  await page.getByText('1 step found').waitFor();
  await find.press('Enter');
  const target = tasks.find((task) => task.name === 'install host-0500').id;
  const node = page.locator(`svg.dag .node[data-task-id="${target}"]`);
  await node.waitFor();
  assert.equal(await page.evaluate(() => document.activeElement?.dataset.taskId), target);
  assert.match(await node.getAttribute('class'), /\bmatch\b/);
  const centred = await page.evaluate((taskId) => {
    const frame = document.querySelector('.dag-viewport').getBoundingClientRect();
    const b = document.querySelector(`svg.dag .node[data-task-id="${taskId}"]`).getBoundingClientRect();
    return b.left >= frame.left && b.right <= frame.right && b.top >= frame.top && b.bottom <= frame.bottom;
  }, target);
  assert.equal(centred, true);
  // The listed match is a button too; Enter on the node opens its panel.
  await page.keyboard.press('Enter');
  await page.locator(`#step[data-task-id="${target}"]`).waitFor();
  // A viewer has no action here.
  assert.equal(await page.locator('button[data-action]').count(), 0);
  await assertAccessible(page, 'big workflow found step dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('a status change arrives live on the folded node\'s counts', async () => {
  const page = await signedInPage(browser, service, operator, { colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/workflows/${id}`);
  await group(page).waitFor();
  await page.evaluate(() => { window.notReloaded = true; });
  const instance = tasks.find((task) => task.name === 'install host-0007').id;
  const cancelled = await call(service, operator, 'POST', `/tasks/${instance}/cancel`);
  assert.equal(cancelled.status, 200, JSON.stringify(cancelled.body).slice(0, 300));
  await page.waitForFunction(() => {
    const node = document.querySelector('svg.dag .node.group');
    return /\bcancelled:1\b/.test(node.dataset.counts) && /\b1 ⊘/.test(node.querySelector('.status-label').textContent);
  });
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
  assert.equal(await page.evaluate(() => document.body.dataset.live), 'live');
  await assertAccessible(page, 'big workflow dark');
  assert.deepEqual(page.errors, []);
  await page.context().close();
});
