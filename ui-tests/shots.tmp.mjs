import { ADMIN, call, launchBrowser, signedInPage, startService } from './harness.mjs';
const service = await startService();
const browser = await launchBrowser();
try {
  await call(service, ADMIN, 'POST', '/schedules', { name: 'nightly berlin', template: 'ui-slow', vars: { ticks: 1 }, cron: '0 2 * * *', timezone: 'Europe/Berlin' });
  const s = (await call(service, ADMIN, 'POST', '/schedules', { name: 'every second', template: 'ui-slow', vars: { ticks: 1 }, cron: '* * * * * *' })).body;
  await call(service, ADMIN, 'POST', '/schedules', { name: 'weekday quarter hours', template: 'ui-slow', cron: '*/15 9-17 * * 1-5', timezone: 'America/New_York', overlap: 'queue', paused: true });
  await new Promise((r) => setTimeout(r, 4000));
  await call(service, ADMIN, 'PATCH', `/schedules/${s.id}`, { paused: true });
  for (const scheme of ['light', 'dark']) {
    const page = await signedInPage(browser, service, ADMIN, { colorScheme: scheme });
    await page.goto(`${service.base}/ui#/schedules`);
    await page.locator('main[data-loaded="true"]').waitFor();
    await page.screenshot({ path: `/tmp/shots/schedules-${scheme}.png`, fullPage: true });
    await page.goto(`${service.base}/ui#/schedules/${s.id}`);
    await page.locator('#schedule-runs').waitFor();
    await page.screenshot({ path: `/tmp/shots/schedule-${scheme}.png`, fullPage: true });
    await page.goto(`${service.base}/ui#/schedules?new=1`);
    await page.locator('#schedule-preview li').first().waitFor();
    await page.screenshot({ path: `/tmp/shots/new-${scheme}.png`, fullPage: true });
    await page.goto(`${service.base}/ui#/storage`);
    await page.locator('#storage-backend').waitFor();
    if (scheme === 'light') {
      await call(service, ADMIN, 'POST', '/admin/storage/migrations', { target: `filesystem:${service.dataDir}-moved` });
      await page.locator('.move-head[data-phase="completed"]').waitFor();
    }
    await page.screenshot({ path: `/tmp/shots/storage-${scheme}.png`, fullPage: true });
  }
} finally { await browser.close(); await service.stop(); }
