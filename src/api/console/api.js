// The management API, called with the operator's credential in a header (never a cookie).
// The SAS key lives in this tab's sessionStorage only; a client certificate, when the browser
// has one, is presented by the browser itself.

const VERSION = 'api-version=2019-01-01-preview';
const KEY = 'gridlet.console.sasKey';

export function savedKey() {
  return sessionStorage.getItem(KEY);
}

export function saveKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Path segment, encoded. */
export const seg = (s) => encodeURIComponent(s);

/** Call the API: resolves to the parsed JSON answer (null when empty), rejects with ApiError. */
export async function call(method, path, body, signal) {
  const headers = { accept: 'application/json' };
  const key = savedKey();
  if (key) headers['aeg-sas-key'] = key;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const url = path + (path.includes('?') ? '&' : '?') + VERSION;
  let r;
  try {
    r = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      signal,
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'Unreachable', 'gridlet could not be reached: ' + e.message);
  }
  const text = await r.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!r.ok) {
    const err = (json && json.error) || {};
    const code = (err.details && err.details.code) || err.code || String(r.status);
    throw new ApiError(r.status, code, err.message || `${r.status} ${r.statusText}`);
  }
  return json;
}

export const get = (path, signal) => call('GET', path, undefined, signal);
export const put = (path, body) => call('PUT', path, body);
export const post = (path, body) => call('POST', path, body);
export const del = (path, body) => call('DELETE', path, body);
