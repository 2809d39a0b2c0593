//! The Prometheus exposition of the broker's metrics (topic, subscription and store
//! families).

use super::*;
use crate::delivery::retry::DropReason;
use crate::metrics::SubscriptionMetrics;

impl Broker {
    /// Prometheus text exposition of every metric.
    pub fn render_metrics(&self) -> String {
        let topics = self.topics();
        let names: Vec<String> = topics.iter().map(|t| t.topic().name).collect();
        let mut out = String::with_capacity(4096);
        write_topic_families(&mut out, &topics, &names);
        let subs: Vec<(String, Arc<SubscriptionHandle>)> = topics
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| {
                t.subscriptions()
                    .iter()
                    .map(|s| (n.clone(), s.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        write_subscription_families(&mut out, &subs);
        write_dropped_and_latencies(&mut out, &subs);
        self.render_resilience_metrics(&mut out, &subs);
        self.write_store_families(&mut out);
        out
    }

    /// The store's families (disk size, dead-letter bytes; group-commit counters of a journaling
    /// store).
    fn write_store_families(&self, out: &mut String) {
        metrics::write_family(
            out,
            "gridlet_store_disk_bytes",
            "gauge",
            "Bytes the store's files occupy on disk (sled never shrinks them; freed space is reused)",
            &[Series {
                labels: vec![],
                value: SeriesValue::Number(self.inner.ctx.store.size_on_disk()),
            }],
        );
        metrics::write_family(
            out,
            "gridlet_dead_letter_bytes",
            "gauge",
            "Bytes of dead letters kept, all subscriptions together (bounded by broker__deadLetter__maxBytes)",
            &[Series {
                labels: vec![],
                value: SeriesValue::Number(self.inner.ctx.dead_letters.bytes()),
            }],
        );
        if let Some(c) = self.inner.ctx.store.commit_counters() {
            let counters: [(&str, &str, u64); 3] = [
                (
                    "gridlet_store_commits_total",
                    "Persisted publishes made durable (answered only after their group's sync)",
                    c.commits,
                ),
                (
                    "gridlet_store_journal_syncs_total",
                    "Publish-journal writes, one fdatasync each (commits / syncs = events per group commit)",
                    c.syncs,
                ),
                (
                    "gridlet_store_checkpoints_total",
                    "Checkpoints: journaled events still pending moved into sled, sled flushed and fsynced",
                    c.checkpoints,
                ),
            ];
            for (name, help, v) in counters {
                metrics::write_family(
                    out,
                    name,
                    "counter",
                    help,
                    &[Series {
                        labels: vec![],
                        value: SeriesValue::Number(v),
                    }],
                );
            }
        }
    }
}

/// Topic families: one series per topic.
fn write_topic_families(out: &mut String, topics: &[Arc<TopicEntry>], names: &[String]) {
    type TopicPick = fn(&TopicMetrics) -> SeriesValue<'_>;
    let topic_families: [(&str, &str, &str, TopicPick); 6] = [
        (
            "EventsReceived",
            "counter",
            "Events received by the topic",
            |m| SeriesValue::Number(m.events_received.get()),
        ),
        (
            "UnmatchedEvents",
            "counter",
            "Events that matched no subscription and were dropped",
            |m| SeriesValue::Number(m.unmatched_events.get()),
        ),
        (
            "SuccessRequests",
            "counter",
            "Publish requests answered 200",
            |m| SeriesValue::Number(m.success_requests.get()),
        ),
        (
            "SystemErrorRequests",
            "counter",
            "Publish requests that failed in the broker",
            |m| SeriesValue::Number(m.system_error_requests.get()),
        ),
        (
            "UserErrorRequests",
            "counter",
            "Publish requests rejected as invalid",
            |m| SeriesValue::Number(m.user_error_requests.get()),
        ),
        (
            "SuccessRequestLatencyMs",
            "histogram",
            "Latency of successful publish requests (ms)",
            |m| SeriesValue::Histogram(&m.success_request_latency_ms),
        ),
    ];
    for (name, kind, help, pick) in topic_families {
        let series: Vec<Series<'_>> = topics
            .iter()
            .zip(names)
            .map(|(t, n)| Series {
                labels: vec![("topic", n.as_str())],
                value: pick(&t.metrics),
            })
            .collect();
        metrics::write_family(out, name, kind, help, &series);
    }
}

/// Subscription counters and gauges: one series per subscription.
fn write_subscription_families(out: &mut String, subs: &[(String, Arc<SubscriptionHandle>)]) {
    type SubPick = fn(&SubscriptionHandle) -> u64;
    let counters: [(&str, &str, &str, SubPick); 7] = [
        (
            "DeliverySuccessCounts",
            "counter",
            "Events delivered",
            |s| s.metrics().delivery_success_counts.get(),
        ),
        (
            "DeliveryFailureCounts",
            "counter",
            "Events whose delivery attempt failed",
            |s| s.metrics().delivery_failure_counts.get(),
        ),
        (
            "DeliveryAttemptsCount",
            "counter",
            "Delivery attempts (per event)",
            |s| s.metrics().delivery_attempts_count.get(),
        ),
        (
            "ExpiredCounts",
            "counter",
            "Events dropped for time to live or max delivery attempts",
            |s| s.metrics().expired_counts.get(),
        ),
        (
            "gridlet_enqueued_events_total",
            "counter",
            "Events accepted into the subscription's queue",
            |s| s.metrics().enqueued.get(),
        ),
        (
            "gridlet_pending_events",
            "gauge",
            "Events accepted and not yet settled",
            |s| s.pending() as u64,
        ),
        (
            "gridlet_in_flight_requests",
            "gauge",
            "Delivery requests in flight",
            |s| s.in_flight() as u64,
        ),
    ];
    for (name, kind, help, pick) in counters {
        let series: Vec<Series<'_>> = subs
            .iter()
            .map(|(t, s)| Series {
                labels: vec![("topic", t.as_str()), ("subscription", s.name())],
                value: SeriesValue::Number(pick(s)),
            })
            .collect();
        metrics::write_family(out, name, kind, help, &series);
    }
}

/// Drops by reason, and the subscription latency histograms.
fn write_dropped_and_latencies(out: &mut String, subs: &[(String, Arc<SubscriptionHandle>)]) {
    let dropped: Vec<Series<'_>> = subs
        .iter()
        .flat_map(|(t, s)| {
            DropReason::ALL.into_iter().map(move |reason| Series {
                labels: vec![
                    ("topic", t.as_str()),
                    ("subscription", s.name()),
                    ("reason", reason.as_str()),
                ],
                value: SeriesValue::Number(dropped(s.metrics(), reason)),
            })
        })
        .collect();
    metrics::write_family(
        out,
        "gridlet_dropped_events_total",
        "counter",
        "Events dropped undelivered, by reason",
        &dropped,
    );
    type HistPick = fn(&SubscriptionMetrics) -> &crate::metrics::Histogram;
    let hists: [(&str, &str, HistPick); 3] = [
        (
            "DeliverySuccessLatencyMs",
            "Latency of successful delivery requests (ms)",
            |m| &m.delivery_success_latency_ms,
        ),
        (
            "DeliveryFailureLatencyMs",
            "Latency of failed delivery requests (ms)",
            |m| &m.delivery_failure_latency_ms,
        ),
        (
            "SystemDelayForFirstAttemptMs",
            "Time from publish to the first delivery attempt (ms)",
            |m| &m.system_delay_for_first_attempt_ms,
        ),
    ];
    for (name, help, pick) in hists {
        let series: Vec<Series<'_>> = subs
            .iter()
            .map(|(t, s)| Series {
                labels: vec![("topic", t.as_str()), ("subscription", s.name())],
                value: SeriesValue::Histogram(pick(s.metrics())),
            })
            .collect();
        metrics::write_family(out, name, "histogram", help, &series);
    }
}

/// Events of a subscription dropped for `reason`.
fn dropped(m: &SubscriptionMetrics, reason: DropReason) -> u64 {
    match reason {
        DropReason::MaxDeliveryAttemptsExceeded => m.dropped_max_attempts.get(),
        DropReason::TimeToLiveExceeded => m.dropped_expired.get(),
        DropReason::DeliveryRefused => m.dropped_refused.get(),
        DropReason::QueueFull => m.dropped_queue_full.get(),
    }
}
