// The one way the page talks to the service: same-origin requests that
// carry the session cookie (set by the browser, unreadable here), and on
// every change the CSRF token, which lives in this module's memory only:
// never in storage, never in a URL.

let csrfToken = null;
let onSessionLost = () => {};

/** The CSRF token of the session, from `POST`/`GET /ui/session`. */
export function setCsrfToken(token) {
  csrfToken = token ?? null;
}

/** What to do when the service no longer knows the session (401). */
export function whenSessionLost(fn) {
  onSessionLost = fn;
}

/** An error answer, with the service's stable code and its message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * A request. JSON in and out by default; `raw: true` returns the Response
 * (for logs, which are text). `authorization` is for signing in only.
 */
export async function api(path, { method = 'GET', body, raw = false, authorization } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (authorization) headers.Authorization = authorization;
  if (!['GET', 'HEAD'].includes(method) && csrfToken) headers['X-CSRF-Token'] = csrfToken;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'same-origin',
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'network', `the service cannot be reached (${e.message})`);
  }
  if (!response.ok) {
    let code = `http_${response.status}`;
    let message = response.statusText || 'request failed';
    try {
      const answer = await response.json();
      code = answer.error.code;
      message = answer.error.message;
    } catch {
      // Not the API's error body (a proxy, say): keep the status line.
    }
    const error = new ApiError(response.status, code, message);
    if (response.status === 401 && !authorization) onSessionLost(error);
    throw error;
  }
  if (raw) return response;
  if (response.status === 204) return null;
  return response.json();
}

/** A query string from the set values of an object, with its `?`. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}
