// The screenshots of docs/dashboard.md, light and dark: a real service
// with some of everything (runs that completed, failed, wait for an
// approval, hold and wait for a lock; a schedule, a token, a secret, a
// webhook subscription with a delivery, a test environment), each page
// opened in Debian's chromium and saved to docs/images/.
//
//   make ui-screenshots            (or: node screenshots.mjs, with ORCHESTRATOR_BIN)
//
// Test environments are real namespaces: run it as root, with `nu` and
// `python3` on PATH, as the browser tests do.

import { createServer } from 'node:http';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

import { ADMIN, call, createToken, launchBrowser, repo, signedInPage, startService, waitWorkflow } from './harness.mjs';

const out = join(repo, 'docs', 'images');
mkdirSync(out, { recursive: true });

const settled = (w) => ['completed', 'failed', 'cancelled'].includes(w.status);

async function submit(service, token, template, vars = {}) {
  const { status, body } = await call(service, token, 'POST', '/workflows', { template, vars });
  if (status !== 201 && status !== 202) throw new Error(`${template}: ${status} ${JSON.stringify(body)}`);
  return body.workflow_id ?? body.id;
}

/** Opens `hash`, waits until the page shows its data, and saves it light and dark. */
async function shoot(pages, service, name, hash, ready) {
  for (const [theme, page] of Object.entries(pages)) {
    await page.goto(`${service.base}/ui${hash}`);
    await page.waitForFunction(() => document.getElementById('main').dataset.loaded === 'true');
    if (ready) await ready(page);
    await page.mouse.move(0, 0);
    const file = join(out, `dashboard-${name}${theme === 'dark' ? '-dark' : ''}.png`);
    await page.screenshot({ path: file, fullPage: false });
    console.log(`wrote ${file}`);
  }
}

async function signedInBoth(browser, service, token) {
  const size = { viewport: { width: 1360, height: 860 } };
  return {
    light: await signedInPage(browser, service, token, { ...size, colorScheme: 'light' }),
    dark: await signedInPage(browser, service, token, { ...size, colorScheme: 'dark' }),
  };
}

async function fixtures(browser) {
  const receiver = createServer((request, response) => {
    request.resume();
    request.on('end', () => response.writeHead(204).end());
  });
  await new Promise((ok) => receiver.listen(0, '127.0.0.1', ok));
  const service = await startService({ extraConfig: [`http_allow = ["127.0.0.1:${receiver.address().port}"]`] });
  try {
    const operator = await createToken(service, 'alice', 'operator');
    await createToken(service, 'dash-viewer', 'viewer');
    await call(service, ADMIN, 'PUT', '/secrets/ui_password', { value: 'not-shown', templates: ['ui-gate'] });
    await call(service, ADMIN, 'POST', '/webhooks', {
      url: `http://127.0.0.1:${receiver.address().port}/hooks`,
      events: ['workflow.completed', 'workflow.failed'],
      description: 'chat notifications',
    });
    await call(service, operator, 'POST', '/schedules', {
      template: 'ui-slow', name: 'nightly ticker', cron: '30 2 * * *', timezone: 'Europe/Madrid', vars: { ticks: 2 },
    });
    await call(service, operator, 'POST', '/schedules', {
      template: 'ui-compare', name: 'every quarter hour', cron: '*/15 * * * *', vars: { env: 'staging' },
    });
    const a = await submit(service, operator, 'ui-compare', { env: 'staging' });
    const b = await submit(service, operator, 'ui-compare', { env: 'production' });
    const failed = await submit(service, operator, 'ui-gate', { gate: '/nonexistent/gate' });
    await submit(service, operator, 'ui-slow', { ticks: 2 });
    for (const id of [a, b, failed]) await waitWorkflow(service, id, settled);
    const gated = await submit(service, ADMIN, 'ui-approval', { env: 'production' });
    const holder = await submit(service, operator, 'ui-locked', { env: 'prod', ticks: 600 });
    const waiter = await submit(service, operator, 'ui-locked', { env: 'prod', ticks: 600 });

    const pages = await signedInBoth(browser, service, ADMIN);
    await shoot(pages, service, 'workflows', '#/workflows', (p) => p.locator('#workflows tbody tr[data-workflow-id]').first().waitFor());
    await shoot(pages, service, 'workflow', `#/workflows/${failed}`, (p) => p.locator('svg.dag .node').first().waitFor());
    await shoot(pages, service, 'compare', `#/compare?a=${a}&b=${b}`);
    await shoot(pages, service, 'submit', '#/submit?template=ui-compare');
    await shoot(pages, service, 'schedules', '#/schedules');
    await shoot(pages, service, 'approvals', `#/approvals?workflow=${gated}&step=approve`);
    await shoot(pages, service, 'locks', '#/locks');
    await shoot(pages, service, 'nodes', '#/nodes');
    await shoot(pages, service, 'storage', '#/storage');
    await shoot(pages, service, 'access', '#/access');
    await shoot(pages, service, 'notifications', '#/notifications');
    await shoot(pages, service, 'audit', '#/audit');
    for (const id of [holder, waiter, gated]) await call(service, ADMIN, 'POST', `/workflows/${id}/cancel`, {});
    for (const page of Object.values(pages)) await page.context().close();
  } finally {
    await service.stop();
    receiver.close();
  }
}

async function environments(browser) {
  const service = await startService({ scripts: 'real' });
  let env;
  try {
    const created = await call(service, ADMIN, 'POST', '/test/environments/create', {
      type: 'cluster', topology: 'containerd_test', wait: true,
    });
    env = created.body.id;
    // Chromium aborts the requests it is making (ERR_NETWORK_CHANGED) for
    // a moment after the host's network changes, as it does when the
    // environment's links appear: let that moment pass before loading a page.
    await new Promise((ok) => setTimeout(ok, 3000));
    const pages = await signedInBoth(browser, service, ADMIN);
    await shoot(pages, service, 'environments', '#/environments?topology=containerd_test');
    await shoot(pages, service, 'environment', `#/environments/${env}`);
    for (const page of Object.values(pages)) await page.context().close();
  } finally {
    if (env) await call(service, ADMIN, 'DELETE', `/test/environments/${env}?wait=true`);
    await service.stop();
  }
}

const browser = await launchBrowser();
try {
  await fixtures(browser);
  if (process.getuid?.() === 0) await environments(browser);
  else console.log('not root: the test environment pages are not shot');
} finally {
  await browser.close();
}
