// The schedules page (#/schedules) in a real browser against a real
// service: what a viewer sees and may not do, an operator's new schedule
// from a template's form with its preview, pause, resume, delete (with a
// confirmation), changes made elsewhere showing without a reload, and a
// schedule's runs. Also the cron describer, on its own.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { describeCron } from '../../crates/orchestrator-api/ui/cron-words.js';
import {
  ADMIN, assertAccessible, call, createToken, launchBrowser, signedInPage, startService,
} from '../harness.mjs';

let service;
let browser;
let operator;
let viewer;

before(async () => {
  service = await startService();
  browser = await launchBrowser();
  operator = await createToken(service, 'sched-operator', 'operator');
  viewer = await createToken(service, 'sched-viewer', 'viewer');
});

after(async () => {
  await browser?.close();
  await service?.stop();
});

async function createSchedule(body) {
  const { status, body: created } = await call(service, operator, 'POST', '/schedules', body);
  assert.equal(status, 201, JSON.stringify(created));
  return created;
}

/** The `datetime` attributes of the times in a list. */
const datetimes = (locator) => locator.locator('time').evaluateAll((els) => els.map((e) => e.getAttribute('datetime')));

test('the cron describer says the documented forms in words, and nothing it cannot', () => {
  const cases = {
    '0 2 * * *': 'every day at 02:00',
    '*/15 * * * *': 'every 15 minutes',
    '* * * * *': 'every minute',
    '5 * * * *': 'every hour at :05',
    '0,30 * * * *': 'every hour at :00 and :30',
    '0 */6 * * *': 'every 6 hours at :00',
    '30 2 * * 1-5': 'on weekdays at 02:30',
    '0 9 * * MON-FRI': 'on weekdays at 09:00',
    '0 10 * * 0,6': 'on weekends at 10:00',
    '0 8 * * 1': 'every Monday at 08:00',
    '0 8 * * 7': 'every Sunday at 08:00',
    '0 8 * * 1,3,5': 'every Monday, Wednesday and Friday at 08:00',
    '0 0 1 * *': 'on day 1 of every month at 00:00',
    '0 0 1,15 * *': 'on days 1 and 15 of every month at 00:00',
    '0 0 L * *': 'on the last day of every month at 00:00',
    '0 12 1 JAN *': 'every year on 1 January at 12:00',
    '0 0 * 6 *': 'every day in June at 00:00',
    '0 9 * * 5#2': 'on the second Friday of the month at 09:00',
    '0 9 * * 5L': 'on the last Friday of the month at 09:00',
    '0 0 1 * 1': 'on day 1 of every month or every Monday at 00:00',
    '*/15 9-17 * * 1-5': 'every 15 minutes from 09:00 to 17:59, on weekdays',
    '0 1,13 * * *': 'every day at 01:00 and 13:00',
    '0 9-17 * * *': 'every hour at :00 from 09:00 to 17:00',
    '@daily': 'every day at 00:00',
    '@hourly': 'every hour at :00',
    '@weekly': 'every Sunday at 00:00',
    '*/10 * * * * *': 'every 10 seconds',
    '* * * * * *': 'every second',
    '0 0 2 * * *': 'every day at 02:00',
    // What it cannot say plainly (or what is not valid) is left to the raw expression.
    '*/7 * * * *': null,
    '0 0 15W * *': null,
    '61 * * * *': null,
    '* * *': null,
    '*/10 5 * * * *': null,
    '@reboot': null,
  };
  for (const [cron, words] of Object.entries(cases)) assert.equal(describeCron(cron), words, cron);
});

test('a viewer sees each schedule in words with its next runs, and no action', async () => {
  const nightly = await createSchedule({
    name: 'nightly berlin', template: 'ui-slow', vars: { ticks: 1 }, cron: '0 2 * * *', timezone: 'Europe/Berlin',
  });
  for (const colorScheme of ['light', 'dark']) {
    const page = await signedInPage(browser, service, viewer, { colorScheme });
    await page.goto(`${service.base}/ui#/schedules`);
    const row = page.locator(`#schedules tr[data-schedule-id="${nightly.id}"]`);
    await row.waitFor();
    await row.getByText('every day at 02:00').waitFor();
    await row.getByText('Europe/Berlin', { exact: true }).waitFor();
    // The next three runs are the service's, not the page's.
    assert.deepEqual(await datetimes(row.locator('ol.next-runs')), nightly.next_runs);
    assert.equal(nightly.next_runs.length, 3);
    assert.equal(await row.getByRole('button').count(), 0);
    assert.equal(await page.getByRole('link', { name: 'New schedule' }).count(), 0);
    await assertAccessible(page, `schedules ${colorScheme}`);

    await row.getByRole('link', { name: 'nightly berlin' }).click();
    await page.waitForURL(/#\/schedules\/[0-9a-f-]+$/);
    await page.locator('#schedule-runs').waitFor();
    await page.getByRole('heading', { name: 'nightly berlin' }).waitFor();
    assert.equal(await page.getByRole('button', { name: /Pause|Delete/ }).count(), 0);
    await assertAccessible(page, `schedule ${colorScheme}`);
    if (colorScheme === 'light') {
      await page.goto(`${service.base}/ui#/schedules?new=1`);
      await page.getByText('Creating a schedule needs the operator role; you are viewer.').waitFor();
    }
    assert.deepEqual(page.errors, []);
    await page.context().close();
  }
  await call(service, ADMIN, 'DELETE', `/schedules/${nightly.id}`);
});

test('an operator creates a schedule from the template form, with the service\'s preview', async () => {
  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/schedules`);
  await page.getByRole('link', { name: 'New schedule' }).click();
  await page.locator('#schedule-form').waitFor();
  await page.getByLabel('Template').selectOption('ui-slow');
  await page.locator('[data-field="vars.ticks"]').waitFor();
  await page.getByLabel('ticks').fill('1');
  await page.getByLabel('Name (optional)').fill('quarter hours');

  // A bad expression: the service's message next to the field, no preview.
  const cron = page.getByLabel('Cron expression');
  await cron.fill('* * *');
  await page.getByRole('button', { name: 'Preview next runs' }).click();
  await page.locator('#input-cron-error', { hasText: 'cron: `* * *` has 3 fields' }).waitFor();
  assert.equal(await page.locator('#schedule-preview li').count(), 0);

  await cron.fill('*/15 * * * *');
  await page.getByLabel('Time zone').fill('Asia/Kolkata');
  await page.getByText('Runs every 15 minutes.').waitFor();
  await page.getByRole('button', { name: 'Preview next runs' }).click();
  await page.locator('#schedule-preview li').nth(2).waitFor();
  const shown = await datetimes(page.locator('#schedule-preview'));
  const { body: preview } = await call(service, operator, 'POST', '/schedules/preview', { cron: '*/15 * * * *', timezone: 'Asia/Kolkata' });
  // The page shows the service's answer (both taken within a quarter hour).
  assert.equal(shown.length, 3);
  assert.ok(shown[0] === preview.next_runs[0] || shown[1] === preview.next_runs[0], `${shown} vs ${preview.next_runs}`);
  await assertAccessible(page, 'new schedule light');

  await page.getByRole('button', { name: 'Create schedule' }).click();
  await page.waitForURL(/#\/schedules\/[0-9a-f-]+$/);
  await page.getByRole('heading', { name: 'quarter hours' }).waitFor();
  const id = page.url().split('/').at(-1);
  const { body: stored } = await call(service, viewer, 'GET', `/schedules/${id}`);
  assert.equal(stored.template, 'ui-slow');
  assert.deepEqual(stored.vars, { ticks: 1 });
  assert.equal(stored.cron, '*/15 * * * *');
  assert.equal(stored.timezone, 'Asia/Kolkata');
  assert.equal(stored.overlap, 'skip');
  // Its runs are the creating token's submissions, and the page says so.
  assert.equal(stored.submitted_by, 'sched-operator');
  await page.locator('.facts-grid', { hasText: 'sched-operator' }).waitFor();
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await call(service, ADMIN, 'DELETE', `/schedules/${id}`);
});

test('a template picked while the first one still loads keeps its own inputs', async () => {
  const page = await signedInPage(browser, service, operator);
  // Every template but the picked one answers late: the first template,
  // chosen as the form loads, answers after the pick.
  let late = 0;
  const held = [];
  await page.route(/\/templates\/(?!ui-slow)[^/?]+$/, async (route) => {
    late += 1;
    await new Promise((resolve) => { held.push(resolve); });
    await route.continue();
  });
  await page.goto(`${service.base}/ui#/schedules?new=1`);
  const select = page.getByLabel('Template');
  await page.locator('#schedule-template option[value="ui-slow"]').waitFor({ state: 'attached' });
  await select.selectOption('ui-slow');
  await page.locator('[data-field="vars.ticks"]').waitFor();
  // Now the first template's answer arrives; it must change nothing.
  assert.ok(late >= 1, 'the first template was asked for');
  const answered = page.waitForResponse((r) => /\/templates\/(?!ui-slow)[^/?]+$/.test(r.url()));
  held.splice(0).forEach((release) => release());
  await answered;
  await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => resolve())));
  assert.equal(await select.inputValue(), 'ui-slow');
  assert.equal(await page.locator('[data-field="vars.ticks"]').count(), 1);
  assert.deepEqual(page.errors, []);
  await page.context().close();
});

test('an operator pauses, resumes and deletes (after a confirmation); changes elsewhere show live', async () => {
  const s = await createSchedule({ name: 'hourly thing', template: 'ui-slow', vars: { ticks: 1 }, cron: '0 * * * *' });
  const page = await signedInPage(browser, service, operator, { colorScheme: 'dark' });
  await page.goto(`${service.base}/ui#/schedules`);
  const row = page.locator(`#schedules tr[data-schedule-id="${s.id}"]`);
  await row.waitFor();
  await row.getByText('every hour at :00').waitFor();

  await row.getByRole('button', { name: 'Pause hourly thing' }).click();
  await page.locator(`#schedules tr[data-schedule-id="${s.id}"][data-paused="true"]`).waitFor();
  await row.getByText('paused', { exact: true }).first().waitFor();
  assert.equal((await call(service, viewer, 'GET', `/schedules/${s.id}`)).body.paused, true);
  await row.getByRole('button', { name: 'Resume hourly thing' }).click();
  await page.locator(`#schedules tr[data-schedule-id="${s.id}"][data-paused="false"]`).waitFor();
  assert.equal((await call(service, viewer, 'GET', `/schedules/${s.id}`)).body.paused, false);
  await assertAccessible(page, 'schedules operator dark');

  // Made elsewhere: the page hears `schedule_changed` and shows it without a reload.
  await call(service, ADMIN, 'PATCH', `/schedules/${s.id}`, { paused: true });
  await page.locator(`#schedules tr[data-schedule-id="${s.id}"][data-paused="true"]`).waitFor();
  const other = await createSchedule({ name: 'made elsewhere', template: 'ui-slow', cron: '0 3 * * *' });
  await page.locator(`#schedules tr[data-schedule-id="${other.id}"]`).waitFor();

  // Delete asks first; keeping it keeps it.
  await row.getByRole('button', { name: 'Delete hourly thing' }).click();
  const dialog = page.getByRole('dialog', { name: 'Delete the schedule hourly thing?' });
  await dialog.waitFor();
  await assertAccessible(page, 'delete dialog dark');
  await dialog.getByRole('button', { name: 'Keep it' }).click();
  await dialog.waitFor({ state: 'detached' });
  assert.equal((await call(service, viewer, 'GET', `/schedules/${s.id}`)).status, 200);
  await row.getByRole('button', { name: 'Delete hourly thing' }).click();
  await dialog.getByRole('button', { name: 'Delete schedule' }).click();
  await row.waitFor({ state: 'detached' });
  assert.equal((await call(service, viewer, 'GET', `/schedules/${s.id}`)).status, 404);
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await call(service, ADMIN, 'DELETE', `/schedules/${other.id}`);
});

test('a schedule\'s runs show live, each with its workflow and status', async () => {
  const s = await createSchedule({ name: 'every second', template: 'ui-slow', vars: { ticks: 1 }, cron: '* * * * * *', overlap: 'skip' });
  const page = await signedInPage(browser, service, operator);
  await page.goto(`${service.base}/ui#/schedules/${s.id}`);
  await page.getByRole('heading', { name: 'every second' }).waitFor();
  // The first due run starts within a second or two; the page hears of it.
  const started = page.locator('#schedule-runs tr[data-state="started"]').first();
  await started.waitFor();
  await started.getByRole('link').waitFor();
  await page.locator('#schedule-runs tr[data-state="started"] .badge[data-status="completed"]').first().waitFor({ timeout: 30000 });
  await call(service, ADMIN, 'PATCH', `/schedules/${s.id}`, { paused: true });
  await page.getByText('paused', { exact: true }).first().waitFor();

  // The list shows the last run as the service has it: its state, and its workflow if it started one.
  const { body: listed } = await call(service, viewer, 'GET', '/schedules');
  const lastRun = listed.schedules.find((x) => x.id === s.id).last_run;
  await page.goto(`${service.base}/ui#/schedules`);
  const last = page.locator(`#schedules tr[data-schedule-id="${s.id}"] .run[data-state="${lastRun.state}"]`);
  await last.waitFor();
  if (lastRun.workflow_id) {
    await last.getByRole('link').click();
    await page.waitForURL(new RegExp(`#/workflows/${lastRun.workflow_id}$`));
  }
  assert.deepEqual(page.errors, []);
  await page.context().close();
  await call(service, ADMIN, 'DELETE', `/schedules/${s.id}`);
});
