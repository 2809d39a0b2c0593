// The console's entry point: sign-in, the role check, and the hash router.

import { get, saveKey, savedKey, ApiError } from './api.js';
import { el, page, errorLine, showError, leave } from './ui.js';
import { overview } from './overview.js';
import { topics } from './topics.js';
import { subscription } from './subscription.js';
import { tail } from './tail.js';

const routes = [
  [/^#\/overview$/, () => overview()],
  [/^#\/topics$/, () => topics()],
  [/^#\/topics\/([^/]+)\/subscriptions\/([^/]+)$/, (t, s) => subscription(t, s)],
  [/^#\/tail(?:\/([^/]+))?$/, (t) => tail(t)],
];

let shown = null;

async function route() {
  leave();
  const hash = location.hash || '#/overview';
  if (hash !== shown) document.getElementById('toast').textContent = '';
  shown = hash;
  for (const a of document.querySelectorAll('#nav a')) {
    const here = hash === a.getAttribute('href') || hash.startsWith(a.getAttribute('href') + '/');
    if (here) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!(await signedIn())) return;
  for (const [re, show] of routes) {
    const m = re.exec(hash);
    if (m) {
      try {
        await show(...m.slice(1).map((x) => (x === undefined ? x : decodeURIComponent(x))));
      } catch (e) {
        if (!handleAuth(e)) {
          const line = errorLine();
          showError(line, e);
          page('Something went wrong', line);
        }
      }
      return;
    }
  }
  location.hash = '#/overview';
}

/** Whether the credential may read the management API; if not, the sign-in or refusal page. */
async function signedIn() {
  try {
    await get('/topics');
    document.getElementById('nav').hidden = false;
    document.getElementById('signout').hidden = !savedKey();
    return true;
  } catch (e) {
    if (!handleAuth(e)) throw e;
    return false;
  }
}

/** 401: sign in. 403: this credential may not use the console. Other errors: false. */
function handleAuth(e) {
  if (!(e instanceof ApiError) || (e.status !== 401 && e.status !== 403)) return false;
  document.getElementById('nav').hidden = true;
  document.getElementById('signout').hidden = !savedKey();
  if (e.status === 401) signIn(savedKey() ? 'That key was not accepted.' : '');
  else refused(e.message);
  return true;
}

function signIn(problem) {
  const line = errorLine();
  line.textContent = problem;
  const input = el('input', {
    id: 'sas-key', type: 'password', name: 'sas-key', autocomplete: 'off', required: true,
    'aria-describedby': 'sas-help',
  });
  const form = el('form', { class: 'inline', id: 'sign-in' },
    el('label', { for: 'sas-key' }, 'SAS key (inbound__clientAuth__sasKeys__key1 or key2)', input),
    el('button', { type: 'submit', class: 'primary' }, 'Sign in'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    saveKey(input.value.trim());
    route();
  });
  page('Sign in', form, line,
    el('p', { id: 'sas-help', class: 'muted' },
      'The key is kept in this browser tab only (sessionStorage) and sent as the aeg-sas-key header. ' +
      'With a client certificate, the browser presents it and no key is needed.'));
  input.focus();
}

function refused(message) {
  page('Not allowed',
    el('p', { class: 'notice', id: 'refused' },
      'This credential may not read the console: it is not an administrator\'s. ',
      'gridlet said: ', message),
    el('button', { type: 'button', onclick: () => { saveKey(null); route(); } }, 'Use another key'));
}

document.getElementById('signout').addEventListener('click', () => {
  saveKey(null);
  route();
});
window.addEventListener('hashchange', route);
route();
