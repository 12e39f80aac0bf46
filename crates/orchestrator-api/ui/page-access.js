// Access (admins only; the service refuses others anyway): the API
// tokens (create, shown once, revoke) and the secrets with their scopes
// (set, replace, delete). A token is shown once, in the answer to its
// creation, and kept nowhere else by the page; a secret's value leaves
// the page in the one request that stores it, its field is emptied before
// the request is even sent, and the service never returns it.

import { api } from './api.js';
import { confirmButton, fill, h, shownOnce, tableWrap, time } from './dom.js';

const ROLES = ['viewer', 'operator', 'admin'];

/** `a, b\nc` → `['a', 'b', 'c']`. */
function list(text) {
  return text.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);
}

export function mount(main, ctx) {
  ctx.setTitle('Access');
  let editing = null; // the secret whose value is being replaced

  // Tokens.
  const tokenBody = h('tbody');
  const tokenName = h('input', { id: 'token-name', name: 'name', type: 'text', required: true, maxLength: 64, autocomplete: 'off', spellcheck: 'false' });
  const tokenRole = h('select', { id: 'token-role', name: 'role' }, ROLES.map((r) => h('option', { value: r, text: r })));
  tokenRole.value = 'operator';
  const tokenError = h('p', { id: 'token-form-error', class: 'form-error', role: 'alert', hidden: true });
  const tokenForm = h('form', { class: 'inline-form', id: 'token-form', 'aria-labelledby': 'token-form-title' },
    h('h3', { id: 'token-form-title', text: 'New token' }),
    h('div', { class: 'form-row' },
      h('div', { class: 'field' }, h('label', { for: 'token-name', text: 'Name' }), tokenName),
      h('div', { class: 'field' }, h('label', { for: 'token-role', text: 'Role' }), tokenRole),
      h('button', { type: 'submit', class: 'primary', text: 'Create token' })),
    tokenError);
  const issued = h('div', { id: 'token-issued' });

  // Secrets.
  const secretBody = h('tbody');
  const secretName = h('input', { id: 'secret-name', name: 'name', type: 'text', required: true, maxLength: 64, autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'secret-name-hint' });
  const secretValue = h('input', { id: 'secret-value', name: 'value', type: 'password', required: true, autocomplete: 'new-password', spellcheck: 'false', 'aria-describedby': 'secret-value-hint' });
  const secretTemplates = h('input', { id: 'secret-templates', name: 'templates', type: 'text', autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'secret-templates-hint' });
  const secretOrigins = h('input', { id: 'secret-origins', name: 'origins', type: 'text', autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'secret-origins-hint' });
  const secretError = h('p', { id: 'secret-form-error', class: 'form-error', role: 'alert', hidden: true });
  const secretTitle = h('h3', { id: 'secret-form-title', text: 'Set a secret' });
  const secretSubmit = h('button', { type: 'submit', class: 'primary', text: 'Store secret' });
  const secretCancel = h('button', { type: 'button', class: 'secondary', text: 'Cancel', hidden: true });
  const secretForm = h('form', { class: 'inline-form', id: 'secret-form', 'aria-labelledby': 'secret-form-title' },
    secretTitle,
    h('div', { class: 'field' }, h('label', { for: 'secret-name', text: 'Name' }), secretName,
      h('small', { id: 'secret-name-hint', class: 'hint', text: '1 to 64 letters, digits, _, . or -. Templates refer to it as ${secrets.<name>}.' })),
    h('div', { class: 'field' }, h('label', { for: 'secret-value', text: 'Value' }), secretValue,
      h('small', { id: 'secret-value-hint', class: 'hint', text: 'Sent once, sealed by the service, never shown again (not even here): the field is emptied when you store it.' })),
    h('div', { class: 'field' }, h('label', { for: 'secret-templates', text: 'Templates that may use it' }), secretTemplates,
      h('small', { id: 'secret-templates-hint', class: 'hint', text: 'Registered templates by ref_name, comma-separated. An inline template never may. Empty: no template.' })),
    h('div', { class: 'field' }, h('label', { for: 'secret-origins', text: 'Origins http steps may send it to' }), secretOrigins,
      h('small', { id: 'secret-origins-hint', class: 'hint', text: 'scheme://host[:port], comma-separated. Empty: none.' })),
    h('div', { class: 'actions' }, secretSubmit, secretCancel),
    secretError);

  fill(main,
    h('div', { class: 'page-head' }, h('h1', { text: 'Access' }),
      h('a', { href: '#/audit', text: 'Audit log →' })),
    h('p', { class: 'hint', text: 'API tokens and secrets. Every change here is in the audit log.' }),
    h('section', { 'aria-labelledby': 'tokens-title' },
      h('h2', { id: 'tokens-title', text: 'API tokens' }),
      tableWrap(h('table', { class: 'list', id: 'tokens' },
        h('caption', { class: 'visually-hidden', text: 'API tokens, oldest first' }),
        h('thead', {}, h('tr', {}, ['Name', 'Role', 'Created', 'Status', 'Action'].map((c) => h('th', { scope: 'col', text: c })))),
        tokenBody)),
      tokenForm, issued),
    h('section', { 'aria-labelledby': 'secrets-title' },
      h('h2', { id: 'secrets-title', text: 'Secrets' }),
      h('p', { class: 'hint', text: 'Values are never shown. A secret is usable only within its scope: by the workflows of the templates it names, and by http steps towards the origins it names.' }),
      tableWrap(h('table', { class: 'list', id: 'secrets' },
        h('caption', { class: 'visually-hidden', text: 'Secrets, by name' }),
        h('thead', {}, h('tr', {}, ['Name', 'Templates', 'Origins', 'Created', 'Updated', 'Actions'].map((c) => h('th', { scope: 'col', text: c })))),
        secretBody)),
      secretForm),
  );

  const showError = (el, message) => {
    el.textContent = message ?? '';
    el.hidden = !message;
  };

  function renderTokens(tokens) {
    const rows = tokens.map((t) => h('tr', { dataset: { tokenId: t.id, name: t.name, revoked: String(Boolean(t.revoked_at)) } },
      h('th', { scope: 'row' }, t.name, t.name === ctx.session.name ? h('span', { class: 'tag', text: 'you' }) : null),
      h('td', { text: t.role }),
      h('td', {}, time(t.created_at)),
      h('td', {}, t.revoked_at ? ['revoked ', time(t.revoked_at)] : 'active'),
      h('td', {}, t.revoked_at ? '' : confirmButton({
        label: 'Revoke',
        action: 'revoke-token',
        question: t.name === ctx.session.name
          ? `Revoke ${t.name}? You are signed in with it: this ends your session.`
          : `Revoke ${t.name}? Every client using it is refused from now on.`,
        confirm: 'Revoke',
        act: async () => {
          try {
            await api(`/tokens/${encodeURIComponent(t.id)}`, { method: 'DELETE' });
            ctx.toast(`Token ${t.name} revoked`);
            refresh();
          } catch (e) {
            ctx.toast(e.message, 'error');
          }
        },
      }))));
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 5, class: 'empty', text: 'No token.' })));
    fill(tokenBody, ...rows);
  }

  function renderSecrets(secrets) {
    const scopeText = (items) => (items.length ? items.join(', ') : h('span', { class: 'hint', text: 'none' }));
    const rows = secrets.map((s) => h('tr', { dataset: { secret: s.name } },
      h('th', { scope: 'row', class: 'mono', text: s.name }),
      h('td', { class: 'wrap', dataset: { scope: 'templates' } }, scopeText(s.scope?.templates ?? [])),
      h('td', { class: 'wrap', dataset: { scope: 'origins' } }, scopeText(s.scope?.origins ?? [])),
      h('td', {}, time(s.created_at)),
      h('td', {}, time(s.updated_at)),
      h('td', {}, h('div', { class: 'actions' },
        h('button', {
          type: 'button', class: 'secondary', dataset: { action: 'replace-secret' }, text: 'Replace',
          'aria-label': `Replace ${s.name}`, on: { click: () => edit(s) },
        }),
        confirmButton({
          label: 'Delete',
          action: 'delete-secret',
          question: `Delete ${s.name}? Steps that refer to it fail from now on.`,
          confirm: 'Delete',
          act: async () => {
            try {
              await api(`/secrets/${encodeURIComponent(s.name)}`, { method: 'DELETE' });
              ctx.toast(`Secret ${s.name} deleted`);
              if (editing === s.name) stopEditing();
              refresh();
            } catch (e) {
              ctx.toast(e.message, 'error');
            }
          },
        })))));
    if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: 6, class: 'empty', text: 'No secret.' })));
    fill(secretBody, ...rows);
  }

  /** The form, filled in to replace `secret`'s value (and its scope). */
  function edit(secret) {
    editing = secret.name;
    secretTitle.textContent = `Replace ${secret.name}`;
    secretName.value = secret.name;
    secretName.readOnly = true;
    secretValue.value = '';
    secretTemplates.value = (secret.scope?.templates ?? []).join(', ');
    secretOrigins.value = (secret.scope?.origins ?? []).join(', ');
    secretSubmit.textContent = 'Replace secret';
    secretCancel.hidden = false;
    showError(secretError, null);
    secretValue.focus();
  }

  function stopEditing() {
    editing = null;
    secretTitle.textContent = 'Set a secret';
    secretName.readOnly = false;
    secretForm.reset();
    secretSubmit.textContent = 'Store secret';
    secretCancel.hidden = true;
    showError(secretError, null);
  }
  secretCancel.addEventListener('click', stopEditing);

  tokenForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    showError(tokenError, null);
    const button = tokenForm.querySelector('button[type="submit"]');
    button.disabled = true;
    try {
      const answer = await api('/tokens', { method: 'POST', body: { name: tokenName.value, role: tokenRole.value } });
      tokenForm.reset();
      tokenRole.value = 'operator';
      fill(issued, shownOnce({
        id: 'new-token',
        title: `Token ${answer.name} (${answer.role})`,
        value: answer.token,
        hint: 'This is the only time the token is shown: copy it now and store it where its client reads it. The service keeps only its hash.',
        onDone: () => tokenName.focus(),
      }));
      issued.querySelector('button[data-action="copy"]').focus();
      refresh();
    } catch (err) {
      showError(tokenError, err.message);
      tokenName.focus();
    } finally {
      button.disabled = false;
    }
  });

  secretForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    showError(secretError, null);
    const name = secretName.value.trim();
    const value = secretValue.value;
    // The value leaves the page in this one request; the field is emptied
    // now, whatever the answer, so it stays in no element.
    secretValue.value = '';
    if (!value) {
      showError(secretError, 'value: type the secret\'s value');
      secretValue.focus();
      return;
    }
    secretSubmit.disabled = true;
    try {
      await api(`/secrets/${encodeURIComponent(name)}`, {
        method: 'PUT',
        body: { value, templates: list(secretTemplates.value), origins: list(secretOrigins.value) },
      });
      ctx.toast(editing ? `Secret ${name} replaced` : `Secret ${name} stored`);
      stopEditing();
      refresh();
    } catch (err) {
      showError(secretError, `${err.message} (type the value again)`);
      secretValue.focus();
    } finally {
      secretSubmit.disabled = false;
    }
  });

  async function refresh() {
    try {
      const [tokens, secrets] = await Promise.all([api('/tokens'), api('/secrets')]);
      renderTokens(tokens.tokens);
      renderSecrets(secrets.secrets);
      main.dataset.loaded = 'true';
    } catch (e) {
      ctx.toast(e.message, 'error');
    }
  }

  refresh();
  // Tokens and secrets change only through this page or the CLI: no
  // event tells of them, so the page reads them when it opens and after
  // each change it makes.
  ctx.live.stop();
  return {
    update() {
      return true;
    },
    unmount() {},
  };
}
