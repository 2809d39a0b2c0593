// One subscription: live state, endpoint health (re-enable), dead letters (paged, bodies as
// text, replay one / a selection / all, purge), and its properties (edit, delete).

import { get, put, post, del, seg } from './api.js';
import {
  el, page, table, count, ago, errorLine, showError, every, toast, traceLink, traceparentOf,
} from './ui.js';

const PAGE = 50;

export async function subscription(topic, name) {
  const base = `/topics/${seg(topic)}/eventSubscriptions/${seg(name)}`;
  const overview = await get('/broker/overview');
  const template = overview.traceUrlTemplate;
  const stats = el('div', { class: 'cards', id: 'sub-stats' });
  const health = el('div', { id: 'sub-health' });
  const queue = el('div', { id: 'sub-queue' });
  const letters = el('section', { id: 'dead-letters', 'aria-labelledby': 'dl-title' });
  const sub = await get(base);
  const main = page(`${topic} / ${name}`,
    el('p', {}, el('a', { href: '#/topics' }, '← Topics and subscriptions')),
    stats, queue, health, letters, editor(base, sub));

  let lastHealth = '';
  await every(2000, async () => {
    const st = await get(`${base}/status`);
    stats.replaceChildren(...[
      card('Backlog', count(st.pending)),
      card('Oldest waiting event', st.oldestWaitingEventTime ? `enqueued ${ago(st.oldestWaitingEventTime)}` : '—'),
      card('Waiting to retry', st.retrying ? `${count(st.retrying)}, next in ${st.nextRetryInSeconds} s` : '0'),
      card('In flight', count(st.inFlight)),
      card('Delivered', count(st.delivered)),
      card('Failed attempts', count(st.failedAttempts)),
      card('Dead letters', count(st.deadLetters), 'dead-letter-count'),
      card('Persisted', st.persisted ? 'yes' : 'no'),
      card('Last error', st.lastError ? `${st.lastError.message}, ${ago(st.lastError.time)}` : 'none', 'last-error'),
    ].filter(Boolean));
    queue.replaceChildren(...(st.queue ? queueView(st.queue) : []));
    const h = JSON.stringify(st.endpointHealth);
    if (h !== lastHealth) {
      lastHealth = h;
      health.replaceChildren(healthView(base, st.endpointHealth));
    }
  });
  await deadLetters(letters, base, template, 0);
  return main;
}

function card(k, v, id) {
  return el('div', { class: 'card' }, el('div', { class: 'k' }, k), el('div', { class: 'v', id }, v));
}

function queueView(q) {
  const counts = Object.entries(q.deliveryCounts);
  return [
    el('h2', {}, 'Queue (pull delivery)'),
    el('div', { class: 'cards' },
      card('Locked', count(q.locked), 'queue-locked'),
      card('Oldest locked event', q.oldestLockedEventTime ? `enqueued ${ago(q.oldestLockedEventTime)}` : '—'),
      card('Next lock expiry', q.nextLockExpiryInSeconds === null ? '—' : `in ${q.nextLockExpiryInSeconds} s`)),
    table('Locked events by delivery count', counts.map(([k]) => ({ label: `delivered ${k}×`, num: true })),
      [counts.map(([, v]) => count(v))]),
  ];
}

function healthView(base, h) {
  if (!h) return el('p', { class: 'muted' }, 'Endpoint health: not tracked for this destination.');
  const line = errorLine();
  const enable = el('button', { type: 'button', class: 'primary', id: 'reenable' }, 'Re-enable endpoint');
  enable.addEventListener('click', async () => {
    try {
      await post(`${base}/endpointHealth/enable`);
      toast('Endpoint re-enabled');
    } catch (e) {
      showError(line, e);
    }
  });
  return el('section', { 'aria-labelledby': 'health-title' },
    el('h2', { id: 'health-title' }, 'Endpoint health'),
    el('p', {},
      'State: ', el('strong', { class: `state-${h.state}`, id: 'health-state' }, h.state),
      ` · ${count(h.consecutiveFailures)} consecutive failures`,
      ` · failure rate ${Math.round((h.failureRate || 0) * 100)} % of ${count(h.recentAttempts)} recent attempts`,
      ` · last success ${h.lastSuccessTime ? ago(h.lastSuccessTime) : 'never'}`,
      h.nextProbeTime ? ` · next probe ${h.nextProbeTime}` : ''),
    h.state !== 'Enabled' ? enable : null,
    line);
}

async function deadLetters(section, base, template, after) {
  const line = errorLine();
  const res = await get(`${base}/deadLetters?top=${PAGE}&after=${after}`);
  const letters = res.value || [];
  const boxes = [];
  const rows = letters.map((l) => {
    const box = el('input', { type: 'checkbox', value: l.id, 'aria-label': `Select dead letter ${l.id}` });
    boxes.push(box);
    const body = el('pre', { class: 'body', hidden: true }, JSON.stringify(l.event, null, 2));
    const show = el('button', { type: 'button', 'aria-expanded': 'false' }, 'Body');
    show.addEventListener('click', () => {
      body.hidden = !body.hidden;
      show.setAttribute('aria-expanded', String(!body.hidden));
    });
    const one = el('button', { type: 'button', 'aria-label': `Replay dead letter ${l.id}` }, 'Replay');
    one.addEventListener('click', () => act(() => post(`${base}/deadLetters/${seg(l.id)}/replay`), 'Replayed 1'));
    return [
      box,
      el('span', {}, el('code', { class: 'event-id' }, l.eventId), el('br'), traceLink(template, traceparentOf(l.event))),
      l.reason,
      l.lastHttpStatusCode === null || l.lastHttpStatusCode === undefined ? '—' : String(l.lastHttpStatusCode),
      count(l.deliveryAttempts),
      ago(l.deadLetteredTime),
      el('span', {}, l.lastError || '—', body),
      el('span', { class: 'actions' }, show, one),
    ];
  });
  const selected = () => boxes.filter((b) => b.checked).map((b) => b.value);
  async function act(f, done) {
    line.textContent = '';
    try {
      const r = await f();
      toast(r && r.replayed !== undefined ? `Replayed ${r.replayed}` : (r && r.deleted !== undefined ? `Purged ${r.deleted}` : done));
      await deadLetters(section, base, template, after);
    } catch (e) {
      showError(line, e);
    }
  }
  const button = (label, id, f, cls) => {
    const b = el('button', { type: 'button', id, class: cls }, label);
    b.addEventListener('click', f);
    return b;
  };
  const actions = el('div', { class: 'actions' },
    button('Replay selected', 'replay-selected', () => act(() => post(`${base}/deadLetters/replay`, { ids: selected() }))),
    button('Replay all', 'replay-all', () => act(() => post(`${base}/deadLetters/replay`))),
    button('Purge selected', 'purge-selected', () => {
      if (confirm('Discard the selected dead letters?')) act(() => del(`${base}/deadLetters`, { ids: selected() }));
    }, 'danger'),
    button('Purge all', 'purge-all', () => {
      if (confirm('Discard every dead letter of this subscription?')) act(() => del(`${base}/deadLetters`));
    }, 'danger'),
    button('Refresh', 'refresh-letters', () => deadLetters(section, base, template, after)));
  const paging = el('div', { class: 'actions' },
    after ? button('First page', 'first-page', () => deadLetters(section, base, template, 0)) : null,
    res.nextAfter ? button('Next page', 'next-page', () => deadLetters(section, base, template, res.nextAfter)) : null);
  const headers = [
    { label: 'Select' }, { label: 'Event' }, { label: 'Reason' }, { label: 'Last status', num: true },
    { label: 'Attempts', num: true }, { label: 'Dead-lettered', narrow: true }, { label: 'Last error' }, { label: 'Actions' },
  ];
  section.replaceChildren(
    el('h2', { id: 'dl-title' }, 'Dead letters'),
    actions, line,
    letters.length ? table(`Dead letters, ${letters.length} shown`, headers, rows)
      : el('p', { class: 'muted', id: 'no-letters' }, 'No dead letters.'),
    paging);
}

function editor(base, sub) {
  const line = errorLine();
  const props = { ...(sub.properties || {}) };
  delete props.topic;
  delete props.topicName;
  delete props.endpointHealth;
  const text = el('textarea', { id: 'sub-json', rows: 14, spellcheck: 'false' }, JSON.stringify(props, null, 2));
  const save = el('button', { type: 'submit', class: 'primary' }, 'Save');
  const form = el('form', { 'aria-labelledby': 'edit-title' },
    el('h2', { id: 'edit-title' }, 'Properties'),
    el('p', { class: 'muted' },
      'Saved with PUT, through the same validation as the API. Secret values are not sent to the page: ' +
      'they show as null or ***; enter them again when you change the destination.'),
    el('label', { for: 'sub-json' }, 'Subscription properties (JSON)', text),
    el('div', { class: 'actions' }, save), line);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    line.textContent = '';
    let body;
    try {
      body = JSON.parse(text.value);
    } catch (e) {
      line.textContent = `Not JSON: ${e.message}`;
      return;
    }
    try {
      await put(base, { properties: body });
      toast('Saved');
    } catch (e) {
      showError(line, e);
    }
  });
  const dline = errorLine();
  const remove = el('button', { type: 'button', class: 'danger', id: 'delete-sub' }, 'Delete subscription');
  remove.addEventListener('click', async () => {
    if (!confirm('Delete this subscription, its backlog and its dead letters?')) return;
    try {
      await del(base);
      location.hash = '#/topics';
    } catch (e) {
      showError(dline, e);
    }
  });
  return el('section', {}, form, el('h2', {}, 'Delete'), remove, dline);
}
