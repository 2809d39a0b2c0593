// Topics and their subscriptions: list, live counts, create and delete. Every write goes
// through the same API (and so the same validation) as any other client; its error is shown
// next to the form or row it came from.

import { get, put, del, seg } from './api.js';
import { el, page, table, count, rate, ago, errorLine, showError, every, toast } from './ui.js';

const schemas = ['EventGridSchema', 'CloudEventSchemaV1_0', 'CustomEventSchema'];

export async function topics() {
  const list = el('div', { id: 'topic-list' });
  const main = page('Topics and subscriptions', createTopicForm(), list);
  const previous = new Map();
  let shape = '';
  await every(2000, async () => {
    const all = await get('/topics');
    all.sort((a, b) => a.name.localeCompare(b.name));
    const subs = await Promise.all(all.map((t) => get(`/topics/${seg(t.name)}/eventSubscriptions`)));
    // Rebuild only when topics or subscriptions changed (forms being typed into survive).
    const now = JSON.stringify(all.map((t, i) => [t.name, subs[i].map((s) => s.name)]));
    if (now !== shape) {
      shape = now;
      list.replaceChildren(...all.map((t, i) => topicSection(t, subs[i])));
      if (!all.length) list.append(el('p', { class: 'muted' }, 'No topics yet.'));
    }
    await Promise.all(all.flatMap((t, i) => subs[i].map((s) => refreshStats(t.name, s.name, previous))));
  });
  return main;
}

function createTopicForm() {
  const line = errorLine();
  const name = el('input', { id: 'new-topic-name', name: 'name', required: true, autocomplete: 'off' });
  const schema = el('select', { id: 'new-topic-schema', name: 'schema' },
    schemas.map((s) => el('option', { value: s }, s)));
  const form = el('form', { class: 'inline', 'aria-label': 'Create a topic' },
    el('label', { for: 'new-topic-name' }, 'New topic name', name),
    el('label', { for: 'new-topic-schema' }, 'Input schema', schema),
    el('button', { type: 'submit', class: 'primary' }, 'Create topic'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    line.textContent = '';
    try {
      await put(`/topics/${seg(name.value.trim())}`, { properties: { inputSchema: schema.value } });
      toast(`Topic ${name.value.trim()} created`);
      name.value = '';
      window.dispatchEvent(new HashChangeEvent('hashchange'));
    } catch (e) {
      showError(line, e);
    }
  });
  return el('section', { 'aria-label': 'New topic' }, form, line);
}

function topicSection(t, subs) {
  const line = errorLine();
  const schema = (t.properties && t.properties.inputSchema) || '';
  const remove = el('button', { type: 'button', class: 'danger', 'aria-label': `Delete topic ${t.name}` }, 'Delete');
  remove.addEventListener('click', async () => {
    if (!confirm(`Delete topic ${t.name} and its subscriptions?`)) return;
    try {
      await del(`/topics/${seg(t.name)}`);
      toast(`Topic ${t.name} deleted`);
      window.dispatchEvent(new HashChangeEvent('hashchange'));
    } catch (e) {
      showError(line, e);
    }
  });
  const rows = subs.map((s) => subscriptionRow(t.name, s));
  const headers = [
    { label: 'Subscription' }, { label: 'Destination', narrow: true }, { label: 'Filter', narrow: true },
    { label: 'Persisted', narrow: true }, { label: 'Backlog', num: true }, { label: 'Oldest waiting', narrow: true },
    { label: 'Delivered', num: true },
    { label: 'Rate', num: true }, { label: 'Dead letters', num: true }, { label: 'Endpoint' },
    { label: 'Last error', narrow: true },
  ];
  return el('section', { class: 'topic', 'data-topic': t.name, 'aria-labelledby': `topic-${t.name}` },
    el('div', { class: 'head' },
      el('h2', { id: `topic-${t.name}` }, t.name),
      el('span', { class: 'muted' }, schema),
      el('a', { href: `#/tail/${seg(t.name)}` }, 'Live tail'),
      remove),
    line,
    subs.length ? table(`Subscriptions of ${t.name}`, headers, rows) : el('p', { class: 'muted' }, 'No subscriptions.'),
    createSubscriptionForm(t.name),
    createFromJsonForm(t.name));
}

function destinationText(p) {
  const d = p.destination || {};
  const props = d.properties || {};
  const where = props.endpointUrl || props.endpointBaseUrl || props.queueName || props.containerName ||
    props.resourceId || props.outputName || '';
  return `${d.endpointType || (p.deliveryMode === 'Queue' ? 'Queue (pull)' : '?')}${where ? ': ' + where : ''}`;
}

function filterText(f) {
  if (!f) return '—';
  const parts = [];
  if (f.subjectBeginsWith) parts.push(`subject begins ${f.subjectBeginsWith}`);
  if (f.subjectEndsWith) parts.push(`subject ends ${f.subjectEndsWith}`);
  if (f.includedEventTypes && f.includedEventTypes.length) parts.push(`types ${f.includedEventTypes.join(', ')}`);
  if (f.advancedFilters && f.advancedFilters.length) parts.push(`${f.advancedFilters.length} advanced`);
  return parts.length ? parts.join('; ') : 'all events';
}

function cellId(topic, sub, what) {
  return `stat-${what}-${topic}-${sub}`;
}

function subscriptionRow(topic, s) {
  const p = s.properties || {};
  const persisted = p.persistencePolicy && p.persistencePolicy.isPersisted;
  const stat = (what) => el('span', { id: cellId(topic, s.name, what) }, '…');
  return [
    el('a', { href: `#/topics/${seg(topic)}/subscriptions/${seg(s.name)}` }, s.name),
    destinationText(p),
    filterText(p.filter),
    persisted ? 'yes' : 'no',
    stat('pending'), stat('oldest'), stat('delivered'), stat('rate'), stat('dead'), stat('health'), stat('error'),
  ];
}

async function refreshStats(topic, sub, previous) {
  let st;
  try {
    st = await get(`/topics/${seg(topic)}/eventSubscriptions/${seg(sub)}/status`);
  } catch (e) {
    if (e.status === 404) return; // deleted meanwhile: the next refresh drops its row
    throw e;
  }
  const set = (what, text, cls) => {
    const e = document.getElementById(cellId(topic, sub, what));
    if (!e) return;
    e.textContent = text;
    if (cls !== undefined) e.className = cls;
  };
  const key = `${topic}/${sub}`;
  const now = performance.now();
  const before = previous.get(key);
  previous.set(key, { at: now, delivered: st.delivered });
  set('pending', count(st.pending));
  set('oldest', st.oldestWaitingEventTime ? ago(st.oldestWaitingEventTime) : '—');
  set('delivered', count(st.delivered));
  set('rate', before ? rate(((st.delivered - before.delivered) * 1000) / (now - before.at)) : '…');
  set('dead', count(st.deadLetters));
  const h = st.endpointHealth;
  const state = h ? h.state : (st.locked !== null ? `${count(st.locked)} locked` : '—');
  set('health', state, h ? `state-${h.state}` : '');
  set('error', st.lastError ? `${st.lastError.message} (${ago(st.lastError.time)})` : '—');
}

function createSubscriptionForm(topic) {
  const id = (x) => `new-sub-${x}-${topic}`;
  const line = errorLine();
  const name = el('input', { id: id('name'), required: true, autocomplete: 'off' });
  const url = el('input', { id: id('url'), type: 'url', required: true, placeholder: 'https://receiver/path', size: 32 });
  const begins = el('input', { id: id('begins'), autocomplete: 'off' });
  const types = el('input', { id: id('types'), autocomplete: 'off', placeholder: 'a, b' });
  const attempts = el('input', { id: id('attempts'), type: 'number', min: 1, max: 30 });
  const persisted = el('input', { id: id('persisted'), type: 'checkbox' });
  const form = el('form', { class: 'inline', 'aria-label': `New webhook subscription on ${topic}` },
    el('label', { for: id('name') }, 'New subscription', name),
    el('label', { for: id('url') }, 'Webhook URL', url),
    el('label', { for: id('begins') }, 'Subject begins with', begins),
    el('label', { for: id('types') }, 'Event types', types),
    el('label', { for: id('attempts') }, 'Max attempts', attempts),
    el('label', { for: id('persisted'), class: 'check' }, persisted, 'Persisted'),
    el('button', { type: 'submit', class: 'primary' }, 'Add subscription'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    line.textContent = '';
    const props = {
      destination: { endpointType: 'WebHook', properties: { endpointUrl: url.value.trim() } },
      persistencePolicy: { isPersisted: persisted.checked },
    };
    const filter = {};
    if (begins.value.trim()) filter.subjectBeginsWith = begins.value.trim();
    const t = types.value.split(',').map((x) => x.trim()).filter(Boolean);
    if (t.length) filter.includedEventTypes = t;
    if (Object.keys(filter).length) props.filter = filter;
    if (attempts.value) props.retryPolicy = { maxDeliveryAttempts: Number(attempts.value) };
    try {
      await put(`/topics/${seg(topic)}/eventSubscriptions/${seg(name.value.trim())}`, { properties: props });
      toast(`Subscription ${name.value.trim()} created`);
      window.dispatchEvent(new HashChangeEvent('hashchange'));
    } catch (e) {
      showError(line, e);
    }
  });
  return el('details', {}, el('summary', {}, `Add a webhook subscription to ${topic}`), form, line);
}

/** Any subscription the API accepts (every destination type, queue delivery): its properties as JSON. */
function createFromJsonForm(topic) {
  const id = (x) => `json-sub-${x}-${topic}`;
  const line = errorLine();
  const name = el('input', { id: id('name'), required: true, autocomplete: 'off' });
  const text = el('textarea', { id: id('props'), rows: 8, spellcheck: 'false' },
    JSON.stringify({ deliveryConfiguration: { deliveryMode: 'Queue' } }, null, 2));
  const form = el('form', { 'aria-label': `New subscription on ${topic} from JSON` },
    el('label', { for: id('name') }, 'Subscription name', name),
    el('label', { for: id('props') }, 'Properties (JSON, as in the API)', text),
    el('div', { class: 'actions' }, el('button', { type: 'submit', class: 'primary' }, 'Create from JSON')));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    line.textContent = '';
    let props;
    try {
      props = JSON.parse(text.value);
    } catch (e) {
      line.textContent = `Not JSON: ${e.message}`;
      return;
    }
    try {
      await put(`/topics/${seg(topic)}/eventSubscriptions/${seg(name.value.trim())}`, { properties: props });
      toast(`Subscription ${name.value.trim()} created`);
      window.dispatchEvent(new HashChangeEvent('hashchange'));
    } catch (e) {
      showError(line, e);
    }
  });
  return el('details', {}, el('summary', {}, `Add any subscription to ${topic} from JSON`), form, line);
}
