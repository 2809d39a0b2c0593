//! The broker's side of the metrics: a [`metrics::Snapshot`] of its topics, subscriptions,
//! store and dead letters. What the families are, and how they are written, is `metrics`'.

use super::*;
use crate::metrics::text::{Series, SeriesValue};
use crate::metrics::{
    BrokerView, CommitView, EndpointView, Kind, MqttDestinationView, MqttView, SubscriptionView,
    TopicView,
};
use crate::telemetry::{MetricFamily, MetricKind, MetricPoint, PointValue};

impl Broker {
    /// What the store's start found damaged and lost, in one line (the readiness detail).
    pub fn store_damage(&self) -> Option<String> {
        self.inner.ctx.store.damage_summary()
    }

    /// Prometheus text exposition of every metric.
    pub fn render_metrics(&self) -> String {
        self.with_snapshot(metrics::render)
    }

    /// Every metric family as plain data, for the OTLP metrics export (the same values
    /// `/metrics` shows).
    pub fn metric_families(&self) -> Vec<MetricFamily> {
        self.with_snapshot(|s| {
            let mut out = Vec::new();
            metrics::visit(s, &mut |name, kind, help, series| {
                out.push(family(name, kind, help, series))
            });
            out
        })
    }

    fn with_snapshot<T>(&self, f: impl FnOnce(&metrics::Snapshot<'_>) -> T) -> T {
        let ctx = &self.inner.ctx;
        let now_ms = ctx.clock.now_ms();
        let topics = self.topics();
        let names: Vec<String> = topics.iter().map(|t| t.topic().name).collect();
        let subs: Vec<(&str, Arc<SubscriptionHandle>)> = topics
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| {
                t.subscriptions()
                    .iter()
                    .map(|s| (n.as_str(), s.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mqtt = self.mqtt_connections();
        let destinations = self.mqtt_destinations();
        let snapshot = metrics::Snapshot {
            mqtt: mqtt
                .iter()
                .map(|(name, m)| MqttView { name, metrics: m })
                .collect(),
            mqtt_destinations: destinations
                .iter()
                .map(|(broker, client_id, m)| MqttDestinationView {
                    broker,
                    client_id,
                    metrics: m,
                })
                .collect(),
            topics: topics
                .iter()
                .zip(&names)
                .map(|(t, n)| TopicView {
                    name: n,
                    metrics: &t.metrics,
                })
                .collect(),
            subscriptions: subs
                .iter()
                .map(|(topic, s)| SubscriptionView {
                    topic,
                    name: s.name(),
                    metrics: s.metrics(),
                    pending: s.pending() as u64,
                    pending_bytes: s.pending_bytes(),
                    in_flight: s.in_flight() as u64,
                    locked: s.pull().map(|p| p.locked() as u64),
                    dead_letters: ctx.dead_letters.count(s.queue_id()) as u64,
                    health: s.endpoint_health().map(|h| EndpointView {
                        state: h.state.gauge(),
                        consecutive_failures: h.consecutive_failures,
                        outage: h.outage_since_ms.is_some(),
                        seconds_since_success: now_ms.saturating_sub(h.last_success_ms) / 1000,
                    }),
                })
                .collect(),
            broker: BrokerView {
                pending_event_bytes: ctx.pending_bytes.used(),
                dead_letters_forwarded: ctx.forwarder.stats.forwarded.get(),
                dead_letters_forward_failed: ctx.forwarder.stats.failed.get(),
                store_disk_bytes: ctx.store.size_on_disk(),
                dead_letter_bytes: ctx.dead_letters.bytes(),
                commits: ctx.store.commit_counters().map(|c| CommitView {
                    commits: c.commits,
                    syncs: c.syncs,
                    checkpoints: c.checkpoints,
                    compactions: c.compactions,
                    damaged_frames: c.damaged_frames,
                    damaged_events: c.damaged_events,
                    window_evicted_segments: c.window_evicted_segments,
                }),
                spans: ctx.tracer.stats(),
                entra: self.inner.entra.get().map(|e| e.view(now_ms)),
            },
        };
        f(&snapshot)
    }
}

fn family(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    series: &[Series<'_>],
) -> MetricFamily {
    let points = series
        .iter()
        .map(|s| MetricPoint {
            attributes: s.labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            value: match &s.value {
                SeriesValue::Number(n) => PointValue::Int(*n),
                SeriesValue::Histogram(h) => {
                    let (buckets, sum, count) = h.read();
                    let mut buckets = buckets.to_vec();
                    let within: u64 = buckets.iter().sum();
                    buckets.push(count.saturating_sub(within));
                    PointValue::Histogram {
                        count,
                        sum,
                        buckets,
                        bounds: &metrics::LATENCY_BUCKETS_MS,
                    }
                }
            },
        })
        .collect();
    MetricFamily {
        name,
        help,
        kind: match kind {
            Kind::Counter => MetricKind::Sum,
            Kind::Gauge => MetricKind::Gauge,
            Kind::Histogram => MetricKind::Histogram,
        },
        points,
    }
}
