// Building the page: a tiny element factory, and the formatting every page
// shares (times, durations, status badges). No framework: the pages are
// small, and what they build is visible here.

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Sets attributes, properties and listeners on an element, then appends children. */
function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') el.textContent = value;
    else if (key === 'class') el.setAttribute('class', value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'on') for (const [type, fn] of Object.entries(value)) el.addEventListener(type, fn);
    else if (key in el && !(el instanceof SVGElement) && typeof value !== 'string') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

/** Appends nodes, strings (as text), arrays of them; skips null and false. */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** `h('a', {href: '#/x', class: 'y'}, 'text', otherNode)` */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replaces an element's children (flattening arrays, skipping null). */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const dateTime = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });

/** A timestamp for people, or an em dash when there is none. */
export function formatTime(iso) {
  if (!iso) return '—';
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : dateTime.format(date);
}

/** `1.2 s`, `3 min 4 s`, `2 h 5 min`. */
export function formatDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '—';
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const secs = ms / 1000;
  if (secs < 60) return `${secs.toFixed(secs < 10 ? 1 : 0)} s`;
  const mins = Math.floor(secs / 60);
  if (mins < 60) return `${mins} min ${Math.round(secs % 60)} s`;
  return `${Math.floor(mins / 60)} h ${mins % 60} min`;
}

/** `5 s ago`, from an ISO time. */
export function formatAgo(iso, now = Date.now()) {
  if (!iso) return '—';
  return `${formatDuration(now - new Date(iso).getTime())} ago`;
}

/** A `<time>` element: readable text, the exact value in its attribute. */
export function time(iso) {
  return iso ? h('time', { datetime: iso, title: iso, text: formatTime(iso) }) : '—';
}

/**
 * A status as text with its colour; `data-status` is what tests and CSS
 * read. `label` words another state in a status's colour.
 */
export function badge(status, label = status.replace('_', ' ')) {
  return h('span', { class: 'badge', dataset: { status }, text: label });
}

export const TERMINAL_TASK = new Set(['completed', 'failed', 'cancelled', 'skipped', 'not_started']);
export const TERMINAL_WORKFLOW = new Set(['completed', 'failed', 'cancelled']);

/** JSON for reading, or a dash for nothing. */
export function json(value) {
  return value === null || value === undefined ? '—' : JSON.stringify(value, null, 2);
}

/**
 * Calls `fn` once, `ms` after the first of a burst of calls: a stream of
 * events turns into one refresh per `ms` at most, and never waits longer.
 */
export function coalesce(fn, ms) {
  let timer = null;
  const call = () => {
    if (timer !== null) return;
    timer = setTimeout(() => {
      timer = null;
      fn();
    }, ms);
  };
  call.cancel = () => {
    clearTimeout(timer);
    timer = null;
  };
  return call;
}

/**
 * A credential shown this once (a new API token, a webhook's signing
 * secret): a read-only field with a copy button, and a button that
 * removes it. Nothing else keeps the value: once removed, or once the
 * page is left, it is gone for good (the service never shows it again).
 */
export function shownOnce({ id, title, value, hint, onDone }) {
  const field = h('input', {
    id, type: 'text', class: 'mono once-value', readOnly: true, spellcheck: 'false', autocomplete: 'off',
  });
  field.value = value; // the property, not an attribute of the markup
  const status = h('span', { class: 'hint', 'aria-live': 'polite' });
  const copy = h('button', { type: 'button', class: 'primary', dataset: { action: 'copy' }, text: 'Copy' });
  const done = h('button', { type: 'button', class: 'secondary', dataset: { action: 'dismiss' }, text: 'I have stored it' });
  const box = h('section', { class: 'once', role: 'region', 'aria-labelledby': `${id}-title` },
    h('h3', { id: `${id}-title`, text: title }),
    h('p', { class: 'once-warning', text: hint }),
    h('div', { class: 'once-row' }, h('label', { for: id, class: 'visually-hidden', text: title }), field, copy, done),
    status);
  copy.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(field.value);
      status.textContent = 'Copied to the clipboard.';
    } catch {
      // No clipboard API (an insecure origin, a refused permission):
      // select the text, so that Ctrl+C (⌘C) copies it.
      field.focus();
      field.select();
      let copied = false;
      try {
        copied = document.execCommand('copy');
      } catch {
        copied = false;
      }
      status.textContent = copied ? 'Copied to the clipboard.' : 'Selected: press Ctrl+C (⌘C) to copy it.';
    }
  });
  done.addEventListener('click', () => {
    field.value = '';
    box.remove();
    onDone?.();
  });
  return box;
}

/**
 * A button that asks before it acts: a click shows the question with a
 * confirming button (focused) and a way back; only the confirmation calls
 * `act`, whose errors are the caller's to show.
 */
export function confirmButton({ label, question, confirm, action, act }) {
  const wrap = h('span', { class: 'confirm-inline' });
  const start = h('button', { type: 'button', class: 'danger', dataset: { action }, text: label });
  const showStart = () => {
    fill(wrap, start);
  };
  start.addEventListener('click', () => {
    const yes = h('button', { type: 'button', class: 'danger', dataset: { action: `${action}-confirm` }, text: confirm });
    const no = h('button', { type: 'button', class: 'secondary', dataset: { action: `${action}-keep` }, text: 'Keep' });
    yes.addEventListener('click', async () => {
      yes.disabled = true;
      no.disabled = true;
      try {
        await act();
      } finally {
        if (wrap.isConnected) {
          showStart();
        }
      }
    });
    no.addEventListener('click', () => {
      showStart();
      start.focus();
    });
    fill(wrap, h('span', { class: 'confirm-question', role: 'alert', text: question }), yes, no);
    yes.focus();
  });
  showStart();
  return wrap;
}

/**
 * Asks before an action that cannot be undone: a modal `<dialog>` with
 * the question, the action's button and a way back (Escape too). Resolves
 * `true` when the action was chosen.
 */
export function confirmDialog(question, action, detail = '') {
  return new Promise((resolve) => {
    const yes = h('button', { type: 'button', class: 'danger', dataset: { confirm: 'yes' }, text: action });
    const no = h('button', { type: 'button', class: 'secondary', dataset: { confirm: 'no' }, text: 'Keep it' });
    const title = h('h2', { id: 'confirm-title', text: question });
    const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': 'confirm-title' },
      title, detail ? h('p', { text: detail }) : null, h('div', { class: 'actions' }, yes, no));
    const done = (answer) => {
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    yes.addEventListener('click', () => done(true));
    no.addEventListener('click', () => done(false));
    dialog.addEventListener('cancel', (e) => {
      e.preventDefault();
      done(false);
    });
    document.body.append(dialog);
    dialog.showModal();
    no.focus();
  });
}

/**
 * The box a table scrolls sideways in when it is wider than the page. It
 * takes the keyboard focus, so that a keyboard alone can scroll it (WCAG
 * 2.1.1; axe's scrollable-region-focusable).
 */
export function tableWrap(...children) {
  return h('div', { class: 'table-wrap', tabindex: '0' }, ...children);
}
