//! The broker's resilience operations: endpoint health per subscription, dead letters (list,
//! purge; replay is in `replay.rs`), dead-letter webhooks, and their metrics. Kept apart from the publish path.

use super::{store_err, subscription_not_found, topic_not_found, Broker, SubEntry};
use crate::config::Key;
use crate::delivery::deadletter::DeadLetter;
use crate::delivery::dispatcher::SubShared;
use crate::delivery::health::{EndpointHealth, HealthSnapshot};
use crate::delivery::queue::{EventData, Pending};
use crate::delivery::sink::Sink;
use crate::error::ApiError;
use crate::metrics::{self, Series, SeriesValue};
use crate::model::delivery_options::DeliveryOptions;
use crate::model::subscription::Subscription;
use crate::store::QueueId;
use std::sync::Arc;
use tokio::time::Instant;

/// Most dead letters one list call returns.
pub const MAX_PAGE: usize = 1000;

impl Broker {
    /// The health tracker of `sub`'s destination URL (HTTP destinations, tracking on).
    pub(super) fn endpoint_health_for(&self, sub: &Subscription) -> Option<Arc<EndpointHealth>> {
        let ctx = &self.inner.ctx;
        if !ctx.health_cfg.enabled {
            return None;
        }
        let key = sub.destination.health_key()?;
        Some(ctx.health.get(key, ctx.clock.now_ms()))
    }

    /// The sink sending to `sub`'s dead-letter destination, through the same sink factory.
    pub(super) fn dead_letter_sink_for(&self, sub: &Subscription) -> Option<Arc<dyn Sink>> {
        let mut dl = sub.clone();
        dl.destination = sub.delivery.dead_letter.clone()?;
        dl.delivery = DeliveryOptions::default();
        dl.batching = Default::default();
        Some(self.inner.sinks.create(&dl))
    }

    /// A full in-memory subscription's copies of a publish go straight to dead letters
    /// (`broker__queueFullPolicy = deadLetter`). Counted as enqueued and dropped, so the
    /// accounting identity holds.
    pub(super) fn dead_letter_overflow(
        &self,
        shared: &SubShared,
        route: &[usize],
        payloads: &[Option<(u64, Arc<EventData>)>],
        now_ms: u64,
        now: Instant,
    ) {
        let items: Vec<Pending> = route
            .iter()
            .filter_map(|&i| payloads.get(i).and_then(Option::as_ref))
            .map(|(seq, data)| Pending {
                seq: *seq,
                event: data.clone(),
                attempts: 0,
                first_enqueued_ms: now_ms,
                enqueued_at: now,
            })
            .collect();
        shared.metrics.enqueued.add(items.len() as u64);
        crate::delivery::dispatcher::dead_letter(
            shared,
            &self.inner.ctx,
            &items,
            crate::delivery::retry::DropReason::QueueFull,
            None,
        );
    }

    pub(super) fn forget_dead_letters(&self, queue: QueueId) {
        if let Err(e) = self.inner.ctx.dead_letters.delete_queue(queue) {
            tracing::error!(error = %e, "could not delete a subscription's dead letters");
        }
    }

    pub(super) fn entry(&self, topic: &str, name: &str) -> Result<Arc<SubEntry>, ApiError> {
        self.topic(topic).ok_or_else(|| topic_not_found(topic))?;
        self.subscription(topic, name)
            .ok_or_else(|| subscription_not_found(topic, name))
    }

    /// The health of a subscription's destination, when tracked.
    pub fn endpoint_health(&self, shared: &SubShared) -> Option<HealthSnapshot> {
        shared.config().health.as_ref().map(|h| h.snapshot())
    }

    /// Re-enable a subscription's destination (disabled or frozen).
    ///
    /// # Errors
    /// 404 for an unknown topic/subscription; 400 when its destination's health is not tracked.
    pub fn enable_endpoint(&self, topic: &str, name: &str) -> Result<HealthSnapshot, ApiError> {
        let e = self.entry(topic, name)?;
        let cfg = e.shared.config();
        let h = cfg.health.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "EndpointHealthNotTracked",
                format!(
                    "this subscription's destination has no endpoint health (not HTTP, or {}=false)",
                    Key::broker__endpointHealth__enabled.name()
                ),
            )
        })?;
        h.enable(self.inner.ctx.clock.now_ms());
        e.shared.notify.notify_one();
        Ok(h.snapshot())
    }

    /// Dead letters of a subscription with id > `after`, oldest first, at most `limit`.
    ///
    /// # Errors
    /// 404 for an unknown topic/subscription; 500 on store failure.
    pub fn dead_letters(
        &self,
        topic: &str,
        name: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, ApiError> {
        let e = self.entry(topic, name)?;
        self.inner
            .ctx
            .dead_letters
            .list(e.shared.queue_id, after, limit.min(MAX_PAGE))
            .map_err(store_err)
    }

    /// Remove dead letters without replaying them (`ids` = `None`: all). Returns how many.
    ///
    /// # Errors
    /// 404 for an unknown topic/subscription; 500 on store failure.
    pub fn purge_dead_letters(
        &self,
        topic: &str,
        name: &str,
        ids: Option<&[u64]>,
    ) -> Result<usize, ApiError> {
        let e = self.entry(topic, name)?;
        let n = self
            .inner
            .ctx
            .dead_letters
            .take(e.shared.queue_id, ids)
            .map_err(store_err)?
            .len();
        Ok(n)
    }

    /// gridlet's resilience metric families.
    pub(super) fn render_resilience_metrics(
        &self,
        out: &mut String,
        subs: &[(String, Arc<SubEntry>)],
    ) {
        let ctx = &self.inner.ctx;
        type Pick = fn(&Broker, &SubShared) -> Option<u64>;
        let evicted_help = format!(
            "Dead letters evicted to stay within {}",
            Key::broker__deadLetter__maxEventsPerSubscription.name()
        );
        let families: [(&str, &str, &str, Pick); 6] = [
            (
                "gridlet_dead_lettered_events_total",
                "counter",
                "Events kept as dead letters",
                |_, s| Some(s.metrics.dead_lettered.get()),
            ),
            (
                "gridlet_dead_letters_evicted_total",
                "counter",
                &evicted_help,
                |_, s| Some(s.metrics.dead_letters_evicted.get()),
            ),
            (
                "gridlet_dead_letters_replayed_total",
                "counter",
                "Dead letters replayed through the API",
                |_, s| Some(s.metrics.dead_letters_replayed.get()),
            ),
            (
                "gridlet_dead_letters",
                "gauge",
                "Dead letters currently kept",
                |b, s| Some(b.inner.ctx.dead_letters.count(s.queue_id) as u64),
            ),
            (
                "gridlet_endpoint_health_state",
                "gauge",
                "Destination health: 0 enabled, 1 disabled (probed), 2 frozen",
                |b, s| b.endpoint_health(s).map(|h| h.state.gauge()),
            ),
            (
                "gridlet_endpoint_consecutive_failures",
                "gauge",
                "Consecutive failed attempts to the destination URL",
                |b, s| b.endpoint_health(s).map(|h| h.consecutive_failures),
            ),
        ];
        for (name, kind, help, pick) in families {
            let series: Vec<Series<'_>> = subs
                .iter()
                .filter_map(|(t, s)| {
                    pick(self, &s.shared).map(|v| Series {
                        labels: vec![("topic", t.as_str()), ("subscription", &s.shared.name)],
                        value: SeriesValue::Number(v),
                    })
                })
                .collect();
            metrics::write_family(out, name, kind, help, &series);
        }
        metrics::write_family(
            out,
            "gridlet_pending_event_bytes",
            "gauge",
            &format!(
                "Bytes of undelivered events held in memory, all subscriptions (limit: {})",
                Key::broker__maxPendingBytes.name()
            ),
            &[Series {
                labels: Vec::new(),
                value: SeriesValue::Number(ctx.pending_bytes.used()),
            }],
        );
        let stats = &ctx.forwarder.stats;
        metrics::write_family(
            out,
            "gridlet_dead_letters_forwarded_total",
            "counter",
            "Dead letters posted to dead-letter webhooks, by result",
            &[
                Series {
                    labels: vec![("result", "success")],
                    value: SeriesValue::Number(stats.forwarded.get()),
                },
                Series {
                    labels: vec![("result", "failure")],
                    value: SeriesValue::Number(stats.failed.get()),
                },
            ],
        );
    }
}
