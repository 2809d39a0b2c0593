// Live tail of a topic: a long poll of GET /topics/{topic}/tail. The broker keeps a small
// sample of recent events for a watched topic; a slow tab misses events (and is told how many),
// it never slows the broker. The filter has a subscription's shape. Bodies are shown as text.

import { get, seg } from './api.js';
import { el, page, errorLine, showError, onLeave, traceLink, traceparentOf } from './ui.js';

const ROWS = 200;

export async function tail(topic) {
  const topics = (await get('/topics')).map((t) => t.name).sort();
  const overview = await get('/broker/overview');
  const pick = el('select', { id: 'tail-topic' }, topics.map((t) => el('option', { value: t, selected: t === topic }, t)));
  const begins = el('input', { id: 'tail-begins', autocomplete: 'off' });
  const ends = el('input', { id: 'tail-ends', autocomplete: 'off' });
  const types = el('input', { id: 'tail-types', autocomplete: 'off', placeholder: 'a, b' });
  const toggle = el('button', { type: 'submit', class: 'primary', id: 'tail-toggle' }, 'Start');
  const state = el('p', { id: 'tail-state', role: 'status', class: 'muted' }, 'Stopped.');
  const line = errorLine();
  const list = el('ol', { id: 'tail-events', reversed: true, class: 'tail' });
  const form = el('form', { class: 'inline', 'aria-label': 'Live tail' },
    el('label', { for: 'tail-topic' }, 'Topic', pick),
    el('label', { for: 'tail-begins' }, 'Subject begins with', begins),
    el('label', { for: 'tail-ends' }, 'Subject ends with', ends),
    el('label', { for: 'tail-types' }, 'Event types', types),
    toggle);
  let running = null;
  const stop = () => {
    if (running) running.abort();
    running = null;
    toggle.textContent = 'Start';
    state.textContent = 'Stopped.';
  };
  onLeave(stop);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (running) return stop();
    const filter = {};
    if (begins.value.trim()) filter.subjectBeginsWith = begins.value.trim();
    if (ends.value.trim()) filter.subjectEndsWith = ends.value.trim();
    const t = types.value.split(',').map((x) => x.trim()).filter(Boolean);
    if (t.length) filter.includedEventTypes = t;
    running = new AbortController();
    toggle.textContent = 'Stop';
    line.textContent = '';
    poll(pick.value, Object.keys(filter).length ? filter : null, running.signal);
  });

  async function poll(name, filter, signal) {
    const f = filter ? `&filter=${encodeURIComponent(JSON.stringify(filter))}` : '';
    const base = `/topics/${seg(name)}/tail?${f.slice(1)}`;
    try {
      // A first poll that does not wait: the topic is watched from here on.
      let r = await get(`${base}&wait=0`, signal);
      state.textContent = `Listening to ${name}.`;
      for (;;) {
        r = await get(`${base}&after=${r.next}&wait=20`, signal);
        if (r.missed) list.prepend(el('li', { class: 'notice' }, `${r.missed} events not shown (sampled, or this tab was too slow)`));
        for (const e of r.events) list.prepend(row(e, overview.traceUrlTemplate));
        while (list.children.length > ROWS) list.lastChild.remove();
      }
    } catch (e) {
      if (e.name === 'AbortError') return;
      showError(line, e);
      stop();
    }
  }

  return page('Live tail', form, state, line, list);
}

function row(e, template) {
  let parsed = null;
  try {
    parsed = JSON.parse(e.body);
  } catch {
    parsed = null;
  }
  const text = parsed ? JSON.stringify(parsed, null, 2) : e.body;
  return el('li', { class: 'tail-event' },
    el('div', {},
      el('strong', {}, e.eventType || '(no type)'), ' · ', e.subject || '(no subject)', ' · ',
      el('span', { class: 'muted' }, `${e.id} · ${e.time}`), ' ',
      traceLink(template, traceparentOf(parsed))),
    el('pre', { class: 'body' }, text, e.truncated ? '\n… (cut: only the first 8 KB are kept)' : ''));
}
