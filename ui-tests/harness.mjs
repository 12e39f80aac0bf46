// What the browser tests stand on: a real `orchestrator serve` (the debug
// build, filesystem backend, a temp data dir, a port the OS picks) running
// the service tests' fixture scripts, and Debian's chromium driven by
// playwright-core. No browser is downloaded: `CHROMIUM` or /usr/bin/chromium.

import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, '..');
export const artifacts = join(here, 'artifacts');

/** The admin token the service is started with (ORCHESTRATOR_BOOTSTRAP_TOKEN). */
export const ADMIN = 'ui-tests-bootstrap-admin-token-0123456789abcdef';

function binary() {
  if (process.env.ORCHESTRATOR_BIN) return process.env.ORCHESTRATOR_BIN;
  const target = process.env.CARGO_TARGET_DIR ?? join(repo, 'target');
  return join(target, 'debug', 'orchestrator');
}

/**
 * Starts the service; resolves once it listens. The port is the one the
 * OS gave (`port = 0`), read from the start-up log line. `extraConfig`:
 * more lines of config.toml (top-level keys, before `[interpreters]`);
 * `env`: more environment variables (which win over the file, as
 * `ORCHESTRATOR_SCRIPTS_DIR` for a scripts dir of the test's own);
 * `scripts: 'real'` runs the repository's own scripts and templates with
 * the interpreters on `PATH` (`nu`, `python3`: what test environments
 * need) instead of the fixtures.
 */
export async function startService({ extraConfig = [], env = {}, scripts } = {}) {
  const real = scripts === 'real';
  const dir = mkdtempSync(join(tmpdir(), 'orchestrator-ui-'));
  const dataDir = join(dir, 'data');
  mkdirSync(dataDir);
  const config = join(dir, 'config.toml');
  writeFileSync(config, [
    `data_dir = ${JSON.stringify(dataDir)}`,
    `scripts_dir = ${JSON.stringify(join(repo, real ? 'scripts' : 'crates/orchestrator/tests/fixtures/scripts'))}`,
    `templates_dir = ${JSON.stringify(real ? join(repo, 'templates') : join(here, 'fixtures/templates'))}`,
    'port = 0',
    'workers = 4',
    'retry_base_ms = 200',
    'retry_max_ms = 400',
    'kill_grace = 1',
    'shutdown_grace = 2',
    // The page polls while the event stream is missing; tests must not
    // trip over the per-token rate limit meant for runaway clients.
    'rate_limit = 0',
    ...extraConfig,
    // The fixture scripts are bash under the built-in `.nu` names.
    ...(real ? [] : ['[interpreters]', 'nu = "bash"']),
    '',
  ].join('\n'));
  const child = spawn(binary(), ['serve', '--config', config], {
    env: { ...process.env, ORCHESTRATOR_BOOTSTRAP_TOKEN: ADMIN, RUST_LOG: 'info', NO_COLOR: '1', ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const base = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`the service did not start:\n${log}`)), 30000);
    child.stderr.on('data', (chunk) => {
      log += chunk;
      const match = /listening on (http:\/\/[0-9.]+:\d+)/.exec(log);
      if (match) {
        clearTimeout(timer);
        ok(match[1]);
      }
    });
    child.on('exit', (code) => fail(new Error(`the service exited with ${code}:\n${log}`)));
    child.on('error', fail);
  });
  // A binary built from another checkout (a shared CARGO_TARGET_DIR) would
  // fail every test in a puzzling way; say so once instead.
  const page = await fetch(`${base}/ui`);
  if (page.status !== 200) {
    child.kill('SIGKILL');
    throw new Error(`${binary()} does not serve the dashboard (GET /ui: ${page.status}); rebuild it from this checkout, or set ORCHESTRATOR_BIN`);
  }
  return {
    base,
    dataDir,
    /** Everything the service logged so far. */
    log: () => log,
    async stop() {
      const exited = new Promise((ok) => child.once('exit', ok));
      child.kill('SIGTERM');
      await Promise.race([exited, new Promise((ok) => setTimeout(ok, 10000))]);
      if (child.exitCode === null) child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** One API call with a bearer token: `{status, body}`. */
export async function call(service, token, method, path, body) {
  const response = await fetch(`${service.base}${path}`, {
    method,
    headers: {
      Authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // logs and empty bodies are text
  }
  return { status: response.status, body: parsed };
}

/** A new API token with `role`; returns the token. */
export async function createToken(service, name, role) {
  const { status, body } = await call(service, ADMIN, 'POST', '/tokens', { name, role });
  if (status !== 201) throw new Error(`cannot create a token: ${status} ${JSON.stringify(body)}`);
  return body.token;
}

/** Polls the API until `done(workflow)`, for setting the stage (not for assertions on the page). */
export async function waitWorkflow(service, id, done, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { body } = await call(service, ADMIN, 'GET', `/workflows/${id}`);
    if (done(body)) return body;
    if (Date.now() > deadline) throw new Error(`workflow never got there: ${JSON.stringify(body)}`);
    await new Promise((ok) => setTimeout(ok, 100));
  }
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
}

/**
 * A new page whose uncaught script errors are collected in `page.errors`:
 * a test ends by checking that there were none.
 */
export async function watchedPage(context) {
  const page = await context.newPage();
  page.errors = [];
  page.on('pageerror', (error) => page.errors.push(error.message));
  return page;
}

/** A page of a new browser context (its own cookies), signed in with `token`. */
export async function signedInPage(browser, service, token, options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, ...options });
  const page = await watchedPage(context);
  await page.goto(`${service.base}/ui`);
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#who .user').waitFor();
  return page;
}

/** Saves a screenshot of the page as a test artifact. */
export async function screenshot(page, name) {
  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true });
}

/** axe-core's source, evaluated in the page (not a <script>: the page's CSP rightly refuses inline scripts). */
const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/** The WCAG 2.x levels A and AA: what every page must meet. */
const AXE_TAGS = ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa'];

/**
 * Checks the page as it is now with axe-core; throws naming each
 * violation, its rule and the elements, so a failure says what to fix.
 * Call it once the page shows what it is for (data loaded, a form open).
 */
export async function assertAccessible(page, what) {
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) await page.evaluate(AXE);
  const violations = await page.evaluate(async (tags) => {
    const result = await window.axe.run(document, { runOnly: { type: 'tag', values: tags }, resultTypes: ['violations'] });
    return result.violations.map((v) => ({
      rule: v.id, impact: v.impact, help: v.help,
      nodes: v.nodes.slice(0, 5).map((n) => `${n.target.join(' ')}: ${n.failureSummary.replace(/\s+/g, ' ')}`),
    }));
  }, AXE_TAGS);
  if (violations.length) {
    const text = violations.map((v) => `- ${v.rule} (${v.impact}): ${v.help}\n    ${v.nodes.join('\n    ')}`).join('\n');
    throw new Error(`${what}: ${violations.length} accessibility violation(s) (WCAG A/AA):\n${text}`);
  }
}
