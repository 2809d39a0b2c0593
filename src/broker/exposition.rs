//! The broker's side of the metrics: a [`metrics::Snapshot`] of its topics, subscriptions,
//! store and dead letters. What the families are, and how they are written, is `metrics`'.

use super::*;
use crate::metrics::{BrokerView, CommitView, SubscriptionView, TopicView};

impl Broker {
    /// Prometheus text exposition of every metric.
    pub fn render_metrics(&self) -> String {
        let ctx = &self.inner.ctx;
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
        let snapshot = metrics::Snapshot {
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
                    in_flight: s.in_flight() as u64,
                    dead_letters: ctx.dead_letters.count(s.queue_id()) as u64,
                    health: s
                        .endpoint_health()
                        .map(|h| (h.state.gauge(), h.consecutive_failures)),
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
                }),
                spans: ctx.tracer.stats(),
            },
        };
        metrics::render(&snapshot)
    }
}
