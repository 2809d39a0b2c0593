//! Every metric family gridlet exposes, declared once: name, kind, help, and which value of a
//! view it reads. The broker fills a [`Snapshot`] of plain views (no locks held, nothing but
//! numbers and the metric structs); [`render`] writes the families in table order.
//!
//! Help texts name settings by their keys; a unit test checks each named key exists.

use super::text::{write_family, Series, SeriesValue};
pub use super::views::{
    BrokerView, CommitView, EndpointView, EntraStatus, EntraView, MqttDestinationView, MqttView,
    Snapshot, SubscriptionView, TopicView,
};
use super::SubscriptionMetrics;
use crate::model::reason::DropReason;

/// Prometheus metric kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Latency buckets, sum and count.
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// How a family reads its value from a view.
pub enum Read<V> {
    /// One series per view (none when `None`: not applicable to that view).
    One(fn(&V) -> Option<SeriesValue<'_>>),
    /// One series per value of an extra label.
    By(&'static str, fn(&V) -> Vec<(&'static str, u64)>),
}

/// One metric family.
pub struct Family<V> {
    /// Metric name.
    pub name: &'static str,
    /// Kind.
    pub kind: Kind,
    /// `# HELP` text.
    pub help: &'static str,
    /// Where its value comes from.
    pub read: Read<V>,
}

fn n<'a>(v: u64) -> Option<SeriesValue<'a>> {
    Some(SeriesValue::Number(v))
}

/// Topic families: one series per topic.
pub fn topic_families<'a>() -> [Family<TopicView<'a>>; 7] {
    use Kind::*;
    [
        family(
            "EventsReceived",
            Counter,
            "Events received by the topic",
            |t| n(t.metrics.events_received.get()),
        ),
        family(
            "UnmatchedEvents",
            Counter,
            "Events that matched no subscription and were dropped",
            |t| n(t.metrics.unmatched_events.get()),
        ),
        family(
            "SuccessRequests",
            Counter,
            "Publish requests answered 200",
            |t| n(t.metrics.success_requests.get()),
        ),
        family(
            "SystemErrorRequests",
            Counter,
            "Publish requests that failed in the broker",
            |t| n(t.metrics.system_error_requests.get()),
        ),
        family(
            "gridlet_deduplicated_events_total",
            Counter,
            "Events answered 200 but not routed: their identity was accepted within the topic's deduplication window",
            |t| n(t.metrics.deduplicated.get()),
        ),
        family(
            "UserErrorRequests",
            Counter,
            "Publish requests rejected as invalid",
            |t| n(t.metrics.user_error_requests.get()),
        ),
        family(
            "SuccessRequestLatencyMs",
            Histogram,
            "Latency of successful publish requests (ms)",
            |t| {
                Some(SeriesValue::Histogram(
                    &t.metrics.success_request_latency_ms,
                ))
            },
        ),
    ]
}

/// Subscription families: one series per subscription (per reason for drops).
pub fn subscription_families<'a>() -> [Family<SubscriptionView<'a>>; 23] {
    use Kind::*;
    [
        family("DeliverySuccessCounts", Counter, "Events delivered", |s| n(s.metrics.delivery_success_counts.get())),
        family("DeliveryFailureCounts", Counter, "Events whose delivery attempt failed", |s| n(s.metrics.delivery_failure_counts.get())),
        family("DeliveryAttemptsCount", Counter, "Delivery attempts (per event)", |s| n(s.metrics.delivery_attempts_count.get())),
        family("ExpiredCounts", Counter, "Events dropped for time to live or max delivery attempts", |s| n(s.metrics.expired_counts.get())),
        family("gridlet_enqueued_events_total", Counter, "Events accepted into the subscription's queue", |s| n(s.metrics.enqueued.get())),
        family("gridlet_pending_events", Gauge, "Events accepted and not yet settled", |s| n(s.pending)),
        family("gridlet_pending_bytes", Gauge, "Bytes of the bodies of the events in gridlet_pending_events: each event as stored and delivered (its JSON), without batching, ids or the store's framing; a persisted subscription's are counted by the store and survive restarts", |s| s.pending_bytes.and_then(n)),
        family("gridlet_in_flight_requests", Gauge, "Delivery requests in flight", |s| n(s.in_flight)),
        Family {
            name: "gridlet_dropped_events_total",
            kind: Counter,
            help: "Events dropped undelivered, by reason",
            read: Read::By("reason", |s| {
                DropReason::ALL
                    .iter()
                    .map(|r| (r.as_str(), dropped(s.metrics, *r)))
                    .collect()
            }),
        },
        Family {
            name: "gridlet_destination_faults_total",
            kind: Counter,
            help: "Delivery attempts an Azure destination answered with a configuration fault (401 unauthorized, 404 notFound, 410 gone, or the connection string's shared access signature expired: sasExpired); retried on the schedule",
            read: Read::By("fault", |s| {
                crate::policy::ConfigFault::ALL
                    .iter()
                    .map(|f| (f.as_str(), s.metrics.destination_faults[*f as usize].get()))
                    .collect()
            }),
        },
        family("DeliverySuccessLatencyMs", Histogram, "Latency of successful delivery requests (ms)", |s| Some(SeriesValue::Histogram(&s.metrics.delivery_success_latency_ms))),
        family("DeliveryFailureLatencyMs", Histogram, "Latency of failed delivery requests (ms)", |s| Some(SeriesValue::Histogram(&s.metrics.delivery_failure_latency_ms))),
        family("SystemDelayForFirstAttemptMs", Histogram, "Time from publish to the first delivery attempt (ms)", |s| Some(SeriesValue::Histogram(&s.metrics.system_delay_for_first_attempt_ms))),
        family("gridlet_dead_lettered_events_total", Counter, "Events kept as dead letters", |s| n(s.metrics.dead_lettered.get())),
        family("gridlet_dead_letters_evicted_total", Counter, "Dead letters evicted (or not kept) to stay within broker__deadLetter__maxEventsPerSubscription and broker__deadLetter__maxBytes, counted on the subscription whose letter arrived", |s| n(s.metrics.dead_letters_evicted.get())),
        family("gridlet_dead_letters_replayed_total", Counter, "Dead letters replayed through the API", |s| n(s.metrics.dead_letters_replayed.get())),
        family("gridlet_dead_letters", Gauge, "Dead letters currently kept", |s| n(s.dead_letters)),
        family("gridlet_pull_locked_events", Gauge, "Queue subscriptions: events received and not yet settled (bounded by broker__maxLocksPerSubscription); gridlet_pending_events less this is the queue's depth", |s| s.locked.and_then(n)),
        Family {
            name: "gridlet_pull_operations_total",
            kind: Counter,
            help: "Queue subscriptions: events by pull operation (received, acknowledged, released, rejected, lockExpired)",
            read: Read::By("operation", |s| match s.locked {
                None => Vec::new(),
                Some(_) => vec![
                    ("received", s.metrics.received.get()),
                    ("acknowledged", s.metrics.acknowledged.get()),
                    ("released", s.metrics.released.get()),
                    ("rejected", s.metrics.rejected.get()),
                    ("lockExpired", s.metrics.lock_expired.get()),
                ],
            }),
        },
        family("gridlet_endpoint_health_state", Gauge, "Destination health: 0 enabled, 1 disabled (probed), 2 frozen", |s| s.health.map(|h| SeriesValue::Number(h.state))),
        family("gridlet_endpoint_consecutive_failures", Gauge, "Consecutive failed attempts to the destination URL", |s| s.health.map(|h| SeriesValue::Number(h.consecutive_failures))),
        family("gridlet_endpoint_outage", Gauge, "1 while the destination URL cannot be reached (connection refused, DNS failure, connect timeout, 503): an uplink outage, probed every outbound__outageProbeSeconds; its events wait (gridlet_pending_events)", |s| s.health.map(|h| SeriesValue::Number(u64::from(h.outage)))),
        family("gridlet_endpoint_seconds_since_success", Gauge, "Seconds since the destination URL last accepted a delivery (or since gridlet began tracking it)", |s| s.health.map(|h| SeriesValue::Number(h.seconds_since_success))),
    ]
}

/// MQTT source families: one series per connection (docs/MQTT.md).
pub fn mqtt_families<'a>() -> [Family<MqttView<'a>>; 4] {
    use std::sync::atomic::Ordering::Relaxed;
    use Kind::*;
    [
        family("gridlet_mqtt_connected", Gauge, "1 while the MQTT source connection has a session with its broker", |c| n(c.metrics.connected.load(Relaxed))),
        family("gridlet_mqtt_paused", Gauge, "1 while the MQTT source holds messages because gridlet cannot accept them now (memory or disk bound: what a publish would answer 503/507); QoS 1 messages stay unacknowledged at the broker", |c| n(c.metrics.paused.load(Relaxed))),
        Family {
            name: "gridlet_mqtt_messages_total",
            kind: Counter,
            help: "MQTT source messages by result: received; acknowledged (QoS 1 PUBACK after gridlet accepted the events); refused (no valid event or no route: acknowledged, no event); dropped (QoS 0 that could not be accepted)",
            read: Read::By("result", |c| {
                let m = c.metrics;
                vec![("received", m.received.get()), ("acknowledged", m.acknowledged.get()), ("refused", m.refused.get()), ("dropped", m.dropped.get())]
            }),
        },
        family("gridlet_mqtt_connection_errors_total", Counter, "MQTT source connection attempts that failed and sessions that ended", |c| n(c.metrics.connection_errors.get())),
    ]
}

/// MQTT destination families: one series per publishing connection (docs/MQTT.md).
pub fn mqtt_destination_families<'a>() -> [Family<MqttDestinationView<'a>>; 3] {
    use std::sync::atomic::Ordering::Relaxed;
    use Kind::*;
    [
        family("gridlet_mqtt_destination_connected", Gauge, "1 while the MQTT destination connection has a session with its broker", |c| n(c.metrics.connected.load(Relaxed))),
        Family {
            name: "gridlet_mqtt_destination_messages_total",
            kind: Counter,
            help: "MQTT destination messages by result: published (written to the connection); acknowledged (QoS 1 PUBACK with a success reason code); refused (PUBACK reason code 0x80 or above)",
            read: Read::By("result", |c| {
                let m = c.metrics;
                vec![("published", m.published.get()), ("acknowledged", m.acknowledged.get()), ("refused", m.refused.get())]
            }),
        },
        family("gridlet_mqtt_destination_connection_errors_total", Counter, "MQTT destination connection attempts that failed and sessions that ended", |c| n(c.metrics.connection_errors.get())),
    ]
}

/// Broker-wide families: one series each (omitted when not applicable).
pub fn broker_families() -> [Family<BrokerView>; 16] {
    use Kind::*;
    [
        family("gridlet_pending_event_bytes", Gauge, "Bytes of undelivered events held in memory, all subscriptions (limit: broker__maxPendingBytes)", |b| n(b.pending_event_bytes)),
        Family {
            name: "gridlet_dead_letters_forwarded_total",
            kind: Counter,
            help: "Dead letters posted to dead-letter webhooks, by result",
            read: Read::By("result", |b| {
                vec![("success", b.dead_letters_forwarded), ("failure", b.dead_letters_forward_failed)]
            }),
        },
        family("gridlet_store_disk_bytes", Gauge, "Bytes the store's files occupy on disk (sled never shrinks them; freed space is reused)", |b| n(b.store_disk_bytes)),
        family("gridlet_dead_letter_bytes", Gauge, "Bytes of dead letters kept, all subscriptions together (bounded by broker__deadLetter__maxBytes)", |b| n(b.dead_letter_bytes)),
        family("gridlet_store_commits_total", Counter, "Persisted publishes made durable (answered only after their group's sync)", |b| b.commits.and_then(|c| n(c.commits))),
        family("gridlet_store_journal_syncs_total", Counter, "Event-log frames that acknowledged publishes, one fdatasync each (commits / syncs = publishes per group commit)", |b| b.commits.and_then(|c| n(c.syncs))),
        family("gridlet_store_checkpoints_total", Counter, "Event-log collections: segments with nothing pending deleted (after restating what older live segments owe)", |b| b.commits.and_then(|c| n(c.checkpoints))),
        family("gridlet_store_compactions_total", Counter, "Event-log segments pinned by a few pending events replaced by a copy of those events", |b| b.commits.and_then(|c| n(c.compactions))),
        family("gridlet_dedup_window_evicted_segments_total", Counter, "Event-log segments kept for the deduplication window (their events settled) deleted before the window let them go, because persistence__maxDiskBytes needed the space: after a restart the window remembers less", |b| b.commits.and_then(|c| n(c.window_evicted_segments))),
        family("gridlet_store_damaged_frames_total", Counter, "Frames (or spans of them, headers, files) of the event log and the dead-letter log found damaged at start or since (the background scrub of checkpointed frames, a read): checksum failures that are no torn tail, files cut short or missing (persistence__onDamage; copies in the quarantine folder)", |b| b.commits.and_then(|c| n(c.damaged_frames))),
        family("gridlet_store_damaged_events_total", Counter, "Events (or dead letters) lost in damaged data found at start or since by the scrub or a read (each also named in an error log line and the /readyz body)", |b| b.commits.and_then(|c| n(c.damaged_events))),
        Family {
            name: "gridlet_telemetry_spans_total",
            kind: Counter,
            help: "OpenTelemetry spans by result: exported (accepted by the collector) or dropped (queue full, or the collector failed or timed out)",
            read: Read::By("result", |b| match b.spans {
                Some((exported, dropped)) => vec![("exported", exported), ("dropped", dropped)],
                None => Vec::new(),
            }),
        },
        family("gridlet_entra_signing_keys", Gauge, "Entra ID signing keys tokens are verified with: the JWKS file's (inbound__clientAuth__entra__jwksPath) and the tenant's fetched set", |b| b.entra.and_then(|e| n(e.keys))),
        family("gridlet_entra_signing_keys_age_seconds", Gauge, "Seconds since the Entra signing keys in use were fetched from the tenant's OpenID metadata (by this run or, from the cache, an earlier one)", |b| b.entra.and_then(|e| e.age_secs).and_then(n)),
        family("gridlet_entra_signing_keys_stale", Gauge, "1 when Entra signing keys are fetched and no fetch succeeded within two refresh intervals (inbound__clientAuth__entra__jwksRefreshIntervalInSeconds): tokens signed with keys Microsoft rolled in since are refused", |b| b.entra.and_then(|e| n(u64::from(e.stale)))),
        Family {
            name: "gridlet_entra_signing_key_fetches_total",
            kind: Counter,
            help: "Fetches of the tenant's Entra signing keys from its OpenID metadata, by result",
            read: Read::By("result", |b| match b.entra {
                Some(e) => vec![("succeeded", e.fetched), ("failed", e.failed)],
                None => Vec::new(),
            }),
        },
    ]
}

fn family<V>(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: fn(&V) -> Option<SeriesValue<'_>>,
) -> Family<V> {
    Family {
        name,
        kind,
        help,
        read: Read::One(read),
    }
}

/// Events of a subscription dropped for `reason`.
pub fn dropped(m: &SubscriptionMetrics, reason: DropReason) -> u64 {
    match reason {
        DropReason::MaxDeliveryAttemptsExceeded => m.dropped_max_attempts.get(),
        DropReason::TimeToLiveExceeded => m.dropped_expired.get(),
        DropReason::DeliveryRefused => m.dropped_refused.get(),
        DropReason::QueueFull => m.dropped_queue_full.get(),
    }
}

/// The series of `f` over `views`, each labelled as given.
fn series<'a, V: 'a>(
    f: &Family<V>,
    views: impl Iterator<Item = (Vec<(&'static str, &'a str)>, &'a V)>,
) -> Vec<Series<'a>> {
    let mut out = Vec::new();
    for (labels, v) in views {
        match &f.read {
            Read::One(read) => {
                if let Some(value) = read(v) {
                    out.push(Series { labels, value });
                }
            }
            Read::By(label, read) => {
                for (lv, x) in read(v) {
                    let mut labels = labels.clone();
                    labels.push((label, lv));
                    out.push(Series {
                        labels,
                        value: SeriesValue::Number(x),
                    });
                }
            }
        }
    }
    out
}

/// What [`visit`] hands each family to: name, kind, help, series.
pub type FamilyVisitor<'f> = dyn FnMut(&'static str, Kind, &'static str, &[Series<'_>]) + 'f;

/// Every family of `s` in table order, handed to `f` with its series (a broker family with
/// no series is left out): the one walk both the Prometheus text and the OTLP export take.
pub fn visit(s: &Snapshot<'_>, f: &mut FamilyVisitor<'_>) {
    for fam in topic_families() {
        let views = s.topics.iter().map(|t| (vec![("topic", t.name)], t));
        f(fam.name, fam.kind, fam.help, &series(&fam, views));
    }
    for fam in subscription_families() {
        let views = s
            .subscriptions
            .iter()
            .map(|v| (vec![("topic", v.topic), ("subscription", v.name)], v));
        f(fam.name, fam.kind, fam.help, &series(&fam, views));
    }
    for fam in mqtt_families() {
        if s.mqtt.is_empty() {
            break;
        }
        let views = s.mqtt.iter().map(|c| (vec![("connection", c.name)], c));
        f(fam.name, fam.kind, fam.help, &series(&fam, views));
    }
    for fam in mqtt_destination_families() {
        if s.mqtt_destinations.is_empty() {
            break;
        }
        let views = s
            .mqtt_destinations
            .iter()
            .map(|c| (vec![("broker", c.broker), ("client_id", c.client_id)], c));
        f(fam.name, fam.kind, fam.help, &series(&fam, views));
    }
    for fam in broker_families() {
        let one = series(&fam, std::iter::once((Vec::new(), &s.broker)));
        if !one.is_empty() {
            f(fam.name, fam.kind, fam.help, &one);
        }
    }
}

/// The Prometheus text exposition of `s`: every family, in table order.
pub fn render(s: &Snapshot<'_>) -> String {
    let mut out = String::with_capacity(4096);
    visit(s, &mut |name, kind, help, series| {
        write_family(&mut out, name, kind.as_str(), help, series)
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::TopicMetrics;

    fn helps() -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = topic_families().iter().map(|f| (f.name, f.help)).collect();
        v.extend(subscription_families().iter().map(|f| (f.name, f.help)));
        v.extend(broker_families().iter().map(|f| (f.name, f.help)));
        v.extend(mqtt_families().iter().map(|f| (f.name, f.help)));
        v.extend(mqtt_destination_families().iter().map(|f| (f.name, f.help)));
        v
    }

    #[test]
    fn family_names_are_unique_and_settings_in_help_texts_exist() {
        let all = helps();
        let mut names: Vec<_> = all.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a family is declared twice");
        for (name, help) in all {
            for word in help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.contains("__") {
                    assert!(
                        crate::config::SETTINGS.iter().any(|s| s.key == word),
                        "{name}'s help names {word}, which is not a setting"
                    );
                }
            }
        }
    }

    #[test]
    fn every_family_is_written_with_its_kind_and_labels() {
        let (t, s) = (TopicMetrics::default(), SubscriptionMetrics::default());
        s.dropped_refused.add(3);
        let m = super::super::MqttConnectionMetrics::default();
        m.received.add(4);
        m.connected.store(1, std::sync::atomic::Ordering::Relaxed);
        let d = super::super::MqttDestinationMetrics::default();
        d.published.add(2);
        let snap = Snapshot {
            mqtt: vec![MqttView {
                name: "plant",
                metrics: &m,
            }],
            mqtt_destinations: vec![MqttDestinationView {
                broker: "mqtt://b:1883",
                client_id: "gridlet-x-0",
                metrics: &d,
            }],
            topics: vec![TopicView {
                name: "t",
                metrics: &t,
            }],
            subscriptions: vec![SubscriptionView {
                topic: "t",
                name: "s",
                metrics: &s,
                pending: 7,
                pending_bytes: Some(700),
                in_flight: 1,
                locked: None,
                dead_letters: 2,
                health: None,
            }],
            broker: BrokerView {
                pending_event_bytes: 5,
                dead_letters_forwarded: 0,
                dead_letters_forward_failed: 0,
                store_disk_bytes: 0,
                dead_letter_bytes: 0,
                commits: None,
                spans: Some((3, 1)),
                entra: None,
            },
        };
        let out = render(&snap);
        assert!(
            out.contains("gridlet_mqtt_messages_total{connection=\"plant\",result=\"received\"} 4"),
            "{out}"
        );
        assert!(
            out.contains("gridlet_mqtt_connected{connection=\"plant\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("gridlet_mqtt_destination_messages_total{broker=\"mqtt://b:1883\",client_id=\"gridlet-x-0\",result=\"published\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE EventsReceived counter\nEventsReceived{topic=\"t\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("gridlet_pending_events{topic=\"t\",subscription=\"s\"} 7"),
            "{out}"
        );
        assert!(
            out.contains("gridlet_pending_bytes{topic=\"t\",subscription=\"s\"} 700"),
            "{out}"
        );
        assert!(out.contains("gridlet_dropped_events_total{topic=\"t\",subscription=\"s\",reason=\"DeliveryRefused\"} 3"), "{out}");
        assert!(
            out.contains("gridlet_telemetry_spans_total{result=\"dropped\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE gridlet_endpoint_health_state gauge\n# HELP"),
            "no series while health is untracked: {out}"
        );
        assert!(
            out.contains("gridlet_dead_letters_forwarded_total{result=\"failure\"} 0"),
            "{out}"
        );
        assert!(
            !out.contains("gridlet_store_commits_total"),
            "not a journaling store: {out}"
        );
    }
}
