// The overview: uptime, version, changed settings, and charts of the last 15 minutes drawn
// from the broker's ring of samples (GET /broker/overview). Charts are SVG built element by
// element (no inline style, no library); each has a text summary for screen readers.

import { get } from './api.js';
import { el, svg, page, table, bytes, rate, duration, ago, every } from './ui.js';

export async function overview() {
  const facts = el('div', { class: 'cards', id: 'facts' });
  const charts = el('div', { class: 'charts', id: 'charts' });
  const settings = el('section', { 'aria-labelledby': 'settings-title' });
  const links = el('section', { id: 'connections', 'aria-labelledby': 'connections-title' });
  const main = page('Overview', facts, el('h2', {}, 'Last 15 minutes'), charts, links, settings);
  let shownSettings = false;
  await every(2000, async () => {
    const o = await get('/broker/overview');
    const rows = o.samples.map(([t, inn, out, failed, dropped, pending, disk]) => ({ t, inn, out, failed, dropped, pending, disk }));
    const per = (f) => rows.slice(1).map((r, i) => {
      const dt = (r.t - rows[i].t) / 1000;
      return { t: r.t, v: dt > 0 ? Math.max(0, (f(r) - f(rows[i])) / dt) : 0 };
    });
    const last = (series) => (series.length ? series[series.length - 1].v : null);
    const inRate = per((r) => r.inn);
    const outRate = per((r) => r.out);
    const newest = rows[rows.length - 1] || { pending: 0, disk: 0 };
    facts.replaceChildren(
      fact('Version', o.version),
      fact('Uptime', duration(o.uptimeSeconds), 'uptime'),
      fact('Events in', rate(last(inRate)), 'rate-in'),
      fact('Events out', rate(last(outRate)), 'rate-out'),
      fact('Pending in memory', `${bytes(newest.pending)} of ${o.bounds.maxPendingBytes ? bytes(o.bounds.maxPendingBytes) : 'no limit'}`),
      fact('Event store on disk', `${bytes(newest.disk)} of ${bytes(o.bounds.maxDiskBytes)}`),
    );
    const failures = [{ name: 'failed attempts', points: per((r) => r.failed) }].concat(
      o.dropReasons.map((reason, i) => ({ name: `dead-lettered: ${reason}`, points: per((r) => r.dropped[i]) })));
    charts.replaceChildren(
      chart('Events per second', [
        { name: 'in (published)', points: inRate },
        { name: 'out (delivered)', points: outRate },
      ], rate),
      chart('Delivery failures per second, by reason', failures, rate),
      chart('Pending bytes in memory', [{ name: 'pending', points: rows.map((r) => ({ t: r.t, v: r.pending })) }],
        bytes, o.bounds.maxPendingBytes || null),
      chart('Event store on disk', [{ name: 'disk', points: rows.map((r) => ({ t: r.t, v: r.disk })) }],
        bytes, o.bounds.maxDiskBytes),
    );
    links.replaceChildren(el('h2', { id: 'connections-title' }, 'Connections'), ...connections(o));
    if (!shownSettings) {
      shownSettings = true;
      settings.replaceChildren(
        el('h2', { id: 'settings-title' }, 'Settings that differ from the defaults'),
        o.settings.length
          ? table('Secrets are shown as ***', [{ label: 'Setting' }, { label: 'Value' }],
            o.settings.map((s) => [el('code', {}, s.name), s.value]))
          : el('p', { class: 'muted' }, 'Every setting has its default value.'));
    }
  });
  return main;
}

/** The MQTT brokers gridlet reads from and publishes to, and the endpoints it cannot reach (an outage: their
 * events wait, uncharged, and go at the first probe answered). */
function connections(o) {
  const out = [];
  out.push(o.mqttConnections.length
    ? table('MQTT sources', [{ label: 'Connection' }, { label: 'State' }, { label: 'Received', num: true },
      { label: 'Acknowledged', num: true }, { label: 'Refused', num: true, narrow: true },
      { label: 'Dropped', num: true, narrow: true }, { label: 'Last error', narrow: true }],
    o.mqttConnections.map((c) => [el('code', {}, c.name),
      c.connected ? (c.paused ? 'connected, paused' : 'connected') : 'disconnected',
      String(c.received), String(c.acknowledged), String(c.refused), String(c.dropped), c.lastError || '—']))
    : el('p', { class: 'muted' }, 'No MQTT source connections.'));
  if (o.mqttDestinations && o.mqttDestinations.length) {
    out.push(table('MQTT destinations', [{ label: 'Broker' }, { label: 'Client id' }, { label: 'State' },
      { label: 'Published', num: true }, { label: 'Acknowledged', num: true },
      { label: 'Refused', num: true, narrow: true }, { label: 'Last error', narrow: true }],
    o.mqttDestinations.map((d) => [el('code', {}, d.broker), el('code', {}, d.clientId),
      d.connected ? 'connected' : 'disconnected', String(d.published), String(d.acknowledged),
      String(d.refused), d.lastError || '—'])));
  }
  out.push(o.outages.length
    ? table('Endpoints in an outage', [{ label: 'Topic' }, { label: 'Subscription' },
      { label: 'Unreachable since' }, { label: 'Last success' }],
    o.outages.map((x) => [x.topic, x.subscription, ago(x.since), ago(x.lastSuccessTime)]))
    : el('p', { class: 'muted', id: 'no-outages' }, 'Every endpoint is reachable.'));
  return out;
}

function fact(k, v, id) {
  return el('div', { class: 'card' }, el('div', { class: 'k' }, k), el('div', { class: 'v', id }, v));
}

/** A line chart of `series` ({name, points: [{t, v}]}); `bound` draws a dashed limit line. */
function chart(title, series, unit, bound) {
  const W = 300;
  const H = 100;
  const all = series.flatMap((s) => s.points);
  const t0 = all.length ? Math.min(...all.map((p) => p.t)) : 0;
  const t1 = Math.max(t0 + 1, ...all.map((p) => p.t));
  const top = Math.max(bound && bound < 4 * maxOf(all) ? bound : 0, maxOf(all), 1e-9) * 1.1;
  const x = (t) => ((t - t0) / (t1 - t0)) * W;
  const y = (v) => H - (v / top) * H;
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', 'aria-hidden': 'true' });
  for (const f of [0.25, 0.5, 0.75]) g.append(svg('line', { class: 'grid', x1: 0, x2: W, y1: H * f, y2: H * f }));
  if (bound && bound <= top) g.append(svg('line', { class: 'bound', x1: 0, x2: W, y1: y(bound), y2: y(bound) }));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const pts = s.points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
    g.append(svg('polyline', { class: `s${i % 6}`, points: pts }));
  });
  const summary = series.map((s) => {
    const v = s.points.length ? s.points[s.points.length - 1].v : null;
    return `${s.name}: ${v === null ? 'no data yet' : unit(v)}`;
  });
  const legend = el('ul', { class: 'legend' }, series.map((s, i) => {
    const v = s.points.length ? s.points[s.points.length - 1].v : null;
    return el('li', { class: `key s${i % 6}` }, `${s.name} ${v === null ? '' : '(now ' + unit(v) + ')'}`);
  }));
  return el('figure', { class: 'chart', role: 'img', 'aria-label': `${title}. ${summary.join('; ')}` },
    el('figcaption', {}, title,
      el('span', { class: 'muted' }, ` · scale 0 to ${unit(top)}`, bound ? ` · limit ${unit(bound)}` : '')),
    g, legend);
}

function maxOf(points) {
  return points.reduce((m, p) => Math.max(m, p.v), 0);
}
