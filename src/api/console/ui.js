// DOM helpers. Every piece of data is set with textContent (or an attribute), never as HTML.

/** What the page being shown must stop (timers, long polls) when another replaces it. */
let stops = [];
export function onLeave(f) {
  stops.push(f);
}
export function leave() {
  for (const f of stops) f();
  stops = [];
}

/** Run f now and every ms milliseconds while this page is shown. */
export function every(ms, f) {
  let live = true;
  let timer = null;
  let first = true;
  const tick = async () => {
    try {
      await f();
    } catch (e) {
      if (first) throw e;
      if (live) toast(e.message);
    } finally {
      first = false;
      if (live) timer = setTimeout(tick, ms);
    }
  };
  onLeave(() => {
    live = false;
    clearTimeout(timer);
  });
  return tick();
}

/** el('td', {class: 'num'}, 'text', child, ...): an element; strings become text nodes. */
export function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, '');
    else e.setAttribute(k, String(v));
  }
  append(e, children);
  return e;
}

export function append(e, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** An SVG element. */
export function svg(tag, attrs) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

/** Replace the page's content; focus moves to it (for keyboard and screen-reader users). */
export function page(title, ...children) {
  const main = document.getElementById('main');
  main.replaceChildren(el('h1', {}, title), ...children.filter(Boolean));
  document.title = `${title} · gridlet`;
  main.focus();
  return main;
}

export function toast(text) {
  const t = document.getElementById('toast');
  t.textContent = text;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.textContent = ''), 5000);
}

/** A table: headers [{label, num}], rows of cells (each a node, text, or [attrs, ...children]). */
export function table(caption, headers, rows) {
  const head = el('tr', {}, headers.map((h) =>
    el('th', { scope: 'col', class: h.num ? 'num' : (h.narrow ? 'hide-narrow' : null) }, h.label)));
  const body = rows.map((r) => el('tr', {}, r.map((c, i) => {
    const h = headers[i] || {};
    const cls = h.num ? 'num' : (h.narrow ? 'hide-narrow' : null);
    return el('td', { class: cls }, c);
  })));
  return el('div', { class: 'table-wrap' },
    el('table', {}, el('caption', { class: 'muted' }, caption), el('thead', {}, head), el('tbody', {}, body)));
}

// Units operators read.
export function count(n) {
  if (n === null || n === undefined) return '—';
  return Number(n).toLocaleString('en-US');
}

export function rate(perSecond) {
  if (perSecond === null || perSecond === undefined || !isFinite(perSecond)) return '—';
  const v = perSecond < 10 ? perSecond.toFixed(1) : Math.round(perSecond).toLocaleString('en-US');
  return `${v} events/s`;
}

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  if (n < 1024 ** 3) return `${(n / 1024 / 1024).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(2)} GB`;
}

export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function ago(time) {
  if (!time) return '—';
  const t = Date.parse(time);
  if (isNaN(t)) return String(time);
  return `${duration((Date.now() - t) / 1000)} ago`;
}

/** An error line bound to a form: set(text) shows it where the action happened. */
export function errorLine() {
  const p = el('p', { class: 'error', role: 'alert' });
  return p;
}

export function showError(line, e) {
  line.textContent = e && e.message ? `${e.code ? e.code + ': ' : ''}${e.message}` : String(e);
}

/** A link to the trace viewer for a W3C traceparent, when a template is configured. */
export function traceLink(template, traceparent) {
  if (!template || typeof traceparent !== 'string') return null;
  const m = /^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$/.exec(traceparent.trim());
  if (!m) return null;
  const href = template.split('{traceId}').join(m[1]);
  if (!/^https?:\/\//.test(href)) return null;
  return el('a', { href, target: '_blank', rel: 'noopener noreferrer' }, `trace ${m[1].slice(0, 8)}…`);
}

/** The traceparent an event carries (CloudEvents attribute), if any. */
export function traceparentOf(event) {
  if (!event || typeof event !== 'object') return null;
  return event.traceparent || null;
}
