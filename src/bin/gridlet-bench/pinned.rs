//! Row 7 of scenario `store`: segments pinned by a few events. One topic, two persisted
//! subscriptions: `live` to the bench's receiver, `slow` taking one event in 50 (subject
//! `/pinned`) to an endpoint that refuses connections. Once `live` has everything, every segment
//! still holds a few of `slow`'s events: without compaction the whole backlog stays on disk.
//! Measured: `du` right after the drain and its least in the next 30 s (compaction waits until
//! no event of a segment was settled for 10 s), and the bytes written meanwhile (the copies'
//! cost) against the bytes given back.

use super::*;
use crate::child::write_bytes;
use crate::store_cost::mib;

/// One event in this many goes to the subscription whose endpoint is down.
const EVERY: u64 = 50;
/// Bytes of an event.
const SIZE: usize = 1024;
/// How long `du` is watched after the drain.
const WATCH: Duration = Duration::from_secs(30);

/// What row 7 measured.
pub struct Pinned {
    /// `slow`'s events were dead-lettered (at the first failure), not kept pending.
    pub dead_lettered: bool,
    /// Bytes written from the start until the drain ended.
    pub written_to_drain: u64,
    pub events: u64,
    pub pinned_bytes: u64,
    pub drained: u64,
    pub least: u64,
    pub least_at: f64,
    pub written: u64,
}

/// `n` events of [`SIZE`] bytes from `*seq` on, every [`EVERY`]th with subject `/pinned`.
fn batch(seq: &mut u64, n: u64) -> String {
    let mut out = String::from("[");
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        *seq += 1;
        let subject = if (*seq).is_multiple_of(EVERY) {
            "/pinned"
        } else {
            "/bench"
        };
        let head = format!(
            r#"{{"id":"p{seq}","subject":"{subject}","eventType":"bench.event","eventTime":"2026-01-01T00:00:00Z","dataVersion":"1.0","data":{{"bts":0,"pad":""#
        );
        out.push_str(&head);
        out.push_str(&"x".repeat(SIZE.saturating_sub(head.len() + 3)));
        out.push_str("\"}}");
    }
    out.push(']');
    out
}

impl Bench {
    /// Row 7; with `dead_letter`, `slow` dead-letters each of its events at the first failure
    /// instead of keeping it pending (`--scenario letters`).
    pub(super) async fn pinned_costs(
        &self,
        events: u64,
        dead_letter: bool,
    ) -> Result<Pinned, String> {
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        rx.stats.sampling.store(false, Relaxed);
        let name = if dead_letter {
            "store-letters"
        } else {
            "store-pinned"
        };
        // Every failure an attempt (no circuit holding them back), so each is dead-lettered.
        let extra: &[(&str, &str)] = if dead_letter {
            &[("broker__endpointHealth__enabled", "false")]
        } else {
            &[]
        };
        let g = Gridlet::start(&self.store_spec(name, extra)).await?;
        let retry = if dead_letter {
            serde_json::json!({"maxDeliveryAttempts": 1})
        } else {
            serde_json::json!({})
        };
        let (s, b) = net::request(g.addr, "PUT", &format!("/topics/{TOPIC}?{API}"), "{}").await?;
        if s != 200 {
            return Err(format!("create topic: HTTP {s}: {b}"));
        }
        let subs = [
            (
                "live",
                serde_json::json!({"destination": {"endpointType": "WebHook",
                    "properties": {"endpointUrl": rx.url("/live"), "maxEventsPerBatch": 50}}}),
            ),
            (
                "slow",
                serde_json::json!({"destination": {"endpointType": "WebHook",
                    "properties": {"endpointUrl": "http://127.0.0.1:9/down"}},
                    "filter": {"subjectBeginsWith": "/pinned"}, "retryPolicy": retry}),
            ),
        ];
        for (name, props) in subs {
            let body = serde_json::json!({ "properties": props });
            let path = format!("/topics/{TOPIC}/eventSubscriptions/{name}?{API}");
            let (s, b) = net::request(g.addr, "PUT", &path, &body.to_string()).await?;
            if s != 200 {
                return Err(format!("create subscription {name}: HTTP {s}: {b}"));
            }
        }
        let mut seq = 0;
        let mut conn = net::Conn::open(g.addr).await?;
        while seq < events {
            let n = 100.min(events - seq);
            let body = batch(&mut seq, n);
            let (s, b) = conn
                .send(
                    "POST",
                    &publish_path(),
                    "application/json",
                    Bytes::from(body),
                    Duration::from_secs(30),
                )
                .await?;
            if s != 200 {
                return Err(format!(
                    "publish: HTTP {s}: {}",
                    String::from_utf8_lossy(&b)
                ));
            }
        }
        let (got, _) = wait_delivered(
            &rx,
            events,
            Duration::from_secs(300),
            Duration::from_secs(10),
        )
        .await;
        if got < events {
            return Err(format!("pinned: {got} of {events} delivered to `live`"));
        }
        if dead_letter {
            let t = Instant::now();
            while labelled_sum(&g, "gridlet_dead_lettered_events_total")
                .await
                .unwrap_or(0)
                < events / EVERY
            {
                if t.elapsed() > Duration::from_secs(60) {
                    return Err("letters: not every event of `slow` was dead-lettered".into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let written_to_drain = write_bytes(g.pid).unwrap_or(0);
        let drained = g.du();
        let w0 = write_bytes(g.pid).unwrap_or(0);
        let t = Instant::now();
        let mut least = (drained, 0.0);
        while t.elapsed() < WATCH {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let d = g.du();
            if d < least.0 {
                least = (d, t.elapsed().as_secs_f64());
            }
        }
        let written = write_bytes(g.pid).unwrap_or(0).saturating_sub(w0);
        Ok(Pinned {
            dead_lettered: dead_letter,
            written_to_drain,
            events,
            pinned_bytes: events / EVERY * SIZE as u64,
            drained,
            least: least.0,
            least_at: least.1,
            written,
        })
    }
}

impl Bench {
    /// `--scenario letters`: where dead letters live, measured. The pinned row twice, on one
    /// machine, one after the other: `slow`'s events kept pending in the event log (what dead
    /// letters kept as records of the event log would do to its segments), then dead-lettered
    /// into the dead-letter log (what gridlet does).
    pub(super) async fn scenario_letters(&mut self) -> Result<(), String> {
        let events = if self.opts.quick { 20_000 } else { 100_000 };
        println!(
            "\n== letters: {events} × 1 KB, every 50th to a subscription whose endpoint is down =="
        );
        for dead_letter in [false, true] {
            let p = self.pinned_costs(events, dead_letter).await?;
            let how = if p.dead_lettered {
                "dead-lettered into the dead-letter log"
            } else {
                "kept pending in the event log"
            };
            println!(
                "  {how}: written {:.1} MB to the end of the drain; disk {:.1} MB right after it, least {:.1} MB after {:.1} s; written in the next {} s {:.1} MB",
                mib(p.written_to_drain),
                mib(p.drained),
                mib(p.least),
                p.least_at,
                WATCH.as_secs(),
                mib(p.written),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_json_of_events_of_the_size_one_in_fifty_pinned() {
        let mut seq = 0;
        let b = batch(&mut seq, 100);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 100);
        let pinned = a.iter().filter(|e| e["subject"] == "/pinned").count();
        assert_eq!(pinned, 2);
        let one = serde_json::to_string(&a[0]).unwrap();
        assert!((SIZE - 8..=SIZE + 8).contains(&one.len()), "{}", one.len());
    }
}
