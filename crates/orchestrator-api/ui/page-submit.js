// Submit: a form generated from a template's declared inputs (type,
// default, description; required when there is no default), with check
// mode, priority and a reference. The service validates; its message
// names the field (`vars.servers[1]: ...`), and is shown next to it.

import { api, query } from './api.js';
import { fill, h } from './dom.js';
import { renderDag } from './dag.js';

const PRIORITIES = ['low', 'normal', 'high', 'critical'];

/** How a value of each input type is typed in, and read back. */
const CONTROLS = {
  string: { make: () => h('input', { type: 'text', autocomplete: 'off' }) },
  integer: { make: () => h('input', { type: 'number', step: 1, inputmode: 'numeric' }) },
  number: { make: () => h('input', { type: 'number', step: 'any', inputmode: 'decimal' }) },
  boolean: { make: () => h('input', { type: 'checkbox' }) },
  array: { make: () => h('textarea', { rows: 3, spellcheck: 'false' }), hint: 'One item per line, or a JSON array.' },
  object: { make: () => h('textarea', { rows: 4, spellcheck: 'false', class: 'mono' }), hint: 'A JSON object.' },
  any: { make: () => h('textarea', { rows: 2, spellcheck: 'false', class: 'mono' }), hint: 'Any JSON value; plain text is a string.' },
};

export function mount(main, ctx) {
  let templates = [];
  let fields = new Map();
  const canSubmit = ctx.can('operator');

  const templateSelect = h('select', { id: 'submit-template', name: 'template', required: true });
  const about = h('p', { class: 'hint', id: 'submit-about' });
  const inputsBox = h('fieldset', { class: 'inputs' }, h('legend', { text: 'Inputs' }));
  const checkMode = h('input', { type: 'checkbox', id: 'submit-check-mode', name: 'check_mode' });
  const priority = h('select', { id: 'submit-priority', name: 'priority' },
    PRIORITIES.map((p) => h('option', { value: p, text: p, selected: p === 'normal' })));
  const reference = h('input', { type: 'text', id: 'submit-ref', name: 'ref', autocomplete: 'off' });
  const formError = h('p', { class: 'form-error', id: 'submit-error', role: 'alert', hidden: true });
  const preview = h('div', { class: 'dag-wrap', id: 'submit-preview' });
  const submitButton = h('button', { type: 'submit', class: 'primary', dataset: { action: 'submit' }, text: 'Submit' });
  const validateButton = h('button', { type: 'button', class: 'secondary', text: 'Check and preview' });
  const options = {
    check_mode: field('check_mode', 'Check mode', checkMode, 'Dry run: every script is told to change nothing.'),
    priority: field('priority', 'Priority', priority, 'Dispatch priority of every step.'),
    'meta.ref': field('meta.ref', 'Reference (optional)', reference,
      'Your name for this piece of work; submitting it again with other inputs makes a new revision.'),
  };
  const form = h('form', { class: 'submit-form', novalidate: true, 'aria-describedby': 'submit-about' },
    h('div', { class: 'field' }, h('label', { for: 'submit-template', text: 'Template' }), templateSelect),
    about,
    inputsBox,
    h('fieldset', { class: 'inputs' }, h('legend', { text: 'Options' }),
      options.check_mode.wrap, options.priority.wrap, options['meta.ref'].wrap),
    formError,
    h('div', { class: 'actions' }, validateButton, canSubmit ? submitButton : null),
  );

  fill(main,
    h('h1', { text: 'Submit a workflow' }),
    canSubmit ? null : h('p', { class: 'notice', text: 'Your role can check a submission but not submit it.' }),
    form,
    h('section', { 'aria-labelledby': 'preview-title', hidden: true, id: 'preview-section' },
      h('h2', { id: 'preview-title', text: 'Preview' }), preview),
  );
  ctx.setTitle('Submit');

  function showTemplate(template) {
    about.textContent = [template.name, template.description].filter(Boolean).join(': ');
    fields = inputFields(template);
    const wraps = [...fields.values()].map((f) => f.wrap);
    fill(inputsBox, h('legend', { text: 'Inputs' }),
      wraps.length ? wraps : h('p', { class: 'hint', text: 'This template takes no input.' }));
    clearErrors();
  }

  function body() {
    const vars = readVars(fields);
    const meta = {};
    if (reference.value.trim()) meta.ref = reference.value.trim();
    return {
      template: templateSelect.value,
      vars,
      check_mode: checkMode.checked,
      priority: priority.value,
      meta,
    };
  }

  function clearErrors() {
    formError.hidden = true;
    for (const f of [...fields.values(), ...Object.values(options)]) {
      f.errorEl.hidden = true;
      f.errorEl.textContent = '';
      f.control.removeAttribute('aria-invalid');
    }
  }

  /** Shows a message next to the field it names, else above the buttons. */
  function showError(message, f = fieldFor(message)) {
    if (f) {
      f.errorEl.textContent = message;
      f.errorEl.hidden = false;
      f.control.setAttribute('aria-invalid', 'true');
      f.control.focus();
    } else {
      formError.textContent = message;
      formError.hidden = false;
    }
  }

  /** The field a service message is about: `vars.servers[1]: ...` is `servers`. */
  function fieldFor(message) {
    const path = message.split(':')[0].trim();
    const input = /^vars\.([^.[\s]+)/.exec(path);
    if (input && fields.has(input[1])) return fields.get(input[1]);
    const option = Object.keys(options).find((name) => path === name || path.startsWith(`${name}.`));
    return option ? options[option] : null;
  }

  async function send(path) {
    clearErrors();
    let payload;
    try {
      payload = body();
    } catch (e) {
      showError(e.message, e.field);
      return null;
    }
    try {
      return await api(path, { method: 'POST', body: payload });
    } catch (e) {
      showError(e.message);
      return null;
    }
  }

  validateButton.addEventListener('click', async () => {
    validateButton.disabled = true;
    const answer = await send('/workflows/validate');
    validateButton.disabled = false;
    const section = main.querySelector('#preview-section');
    section.hidden = !answer;
    if (answer) {
      const steps = answer.workflow.tasks.length;
      ctx.toast(`Valid: ${steps} step${steps === 1 ? '' : 's'}`);
      renderDag(preview, answer.workflow, { hrefFor: () => '#/submit', selected: null });
    }
  });

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!canSubmit) return;
    submitButton.disabled = true;
    const answer = await send('/workflows');
    submitButton.disabled = false;
    if (answer) {
      ctx.toast(`Submitted ${answer.name}`);
      ctx.navigate(`#/workflows/${answer.id}`);
    }
  });

  const choose = templateChooser(templateSelect, {
    chosen: (refName) => ctx.replace(`#/submit${query({ template: refName })}`),
    show: showTemplate,
    failed: (message) => showError(message),
  });

  api('/templates').then((answer) => {
    // The newest version of each template: what a named submission runs.
    const newest = new Map();
    for (const t of answer.templates) newest.set(t.ref_name, t);
    templates = [...newest.values()];
    fill(templateSelect, ...templates.map((t) => h('option', { value: t.ref_name, text: `${t.ref_name} — ${t.name}` })));
    const wanted = ctx.params.template;
    choose(templates.some((t) => t.ref_name === wanted) ? wanted : templates[0]?.ref_name ?? '');
    main.dataset.loaded = 'true';
  }).catch((e) => showError(e.message));

  return {
    update(params) {
      if (params.template && params.template !== templateSelect.value) choose(params.template);
      return true;
    },
    unmount() {},
  };
}

// The generated form's parts, shared with the schedules page (a schedule
// runs a template with inputs, typed in the same form).

/**
 * Loads the template picked in `select` and hands it to `show`; returns
 * `choose(refName)`, to pick one from code. Only the latest choice is
 * shown: an answer that arrives after another pick (the first template's,
 * chosen as the form loads, racing a quick pick) is dropped, or the form
 * would show the wrong inputs. Picking again the template that is shown,
 * or on its way, does nothing: its answer would wipe what was typed.
 */
export function templateChooser(select, { chosen: onChosen, show, failed }) {
  let chosen = null;
  async function choose(refName) {
    if (refName === chosen) return;
    chosen = refName;
    select.value = refName;
    onChosen(refName);
    try {
      const template = await api(`/templates/${encodeURIComponent(refName)}`);
      if (chosen === refName) show(template);
    } catch (e) {
      if (chosen !== refName) return;
      chosen = null; // picking it again asks again
      failed(e.message);
    }
  }
  select.addEventListener('change', () => choose(select.value));
  return choose;
}

/** A labelled control with its description and its error slot. */
export function field(name, label, control, hint, required = false) {
  const id = control.id || `input-${name.replace(/[^a-z0-9_-]/gi, '-')}`;
  control.id = id;
  control.name = name;
  const hintEl = h('small', { id: `${id}-hint`, class: 'hint', text: hint ?? '' });
  const errorEl = h('p', { id: `${id}-error`, class: 'field-error', hidden: true });
  control.setAttribute('aria-describedby', `${id}-hint ${id}-error`);
  const isBox = control.type === 'checkbox';
  const wrap = h('div', { class: isBox ? 'field check' : 'field', dataset: { field: name } },
    isBox ? [control, h('label', { for: id, text: label })]
      : [h('label', { for: id }, label, required ? h('span', { class: 'required', text: ' (required)' }) : null), control],
    hintEl, errorEl);
  return { name, control, wrap, errorEl };
}

/**
 * A field per declared input of `template` (type, default, description;
 * required when there is no default): a Map from input name to field,
 * each with its `wrap` to place in a form.
 */
export function inputFields(template) {
  const fields = new Map();
  for (const [name, spec] of Object.entries(template.inputs ?? {})) {
    const kind = CONTROLS[spec.type] ? spec.type : 'any';
    const control = CONTROLS[kind].make();
    const required = !('default' in spec);
    const hint = [spec.description, CONTROLS[kind].hint, spec.format === 'name' ? 'Names: letters, digits, ., _ and -.' : '']
      .filter(Boolean).join(' ');
    const f = field(`vars.${name}`, name, control, hint, required);
    f.kind = kind;
    f.spec = spec;
    if (required) control.setAttribute('aria-required', 'true');
    const value = spec.default;
    if (kind === 'boolean') control.checked = value === true;
    else if (value !== undefined && value !== null) {
      control.value = kind === 'array' && value.every((v) => typeof v === 'string')
        ? value.join('\n')
        : typeof value === 'string' ? value : JSON.stringify(value);
    }
    fields.set(name, f);
  }
  return fields;
}

/**
 * The `vars` typed in `inputFields`' fields; leaves out the empty ones
 * (their defaults apply). Throws an error whose `field` is the field at
 * fault.
 */
export function readVars(fields) {
  const vars = {};
  for (const [name, f] of fields) {
    const value = read(f);
    if (value !== undefined) vars[name] = value;
  }
  return vars;
}

/** The value typed in a field: `undefined` to leave it to the default. */
function read(f) {
  const { control, kind } = f;
  if (kind === 'boolean') return control.checked;
  const text = control.value.trim();
  if (text === '') return undefined;
  if (kind === 'integer' || kind === 'number') {
    const n = Number(text);
    if (!Number.isFinite(n)) throw fieldError(f, 'expected a number');
    return n;
  }
  if (kind === 'array') {
    if (text.startsWith('[')) return parseJson(f, text);
    return text.split('\n').map((line) => line.trim()).filter(Boolean);
  }
  if (kind === 'object') return parseJson(f, text);
  if (kind === 'any') {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return control.value;
}

function parseJson(f, text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw fieldError(f, `not valid JSON: ${e.message}`);
  }
}

function fieldError(f, message) {
  const error = new Error(`${f.name}: ${message}`);
  error.field = f;
  return error;
}
