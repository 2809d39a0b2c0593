//! Scenario `outage` (issue 34; opt-in, not part of `all`): persisted events through an uplink
//! that is down for a while and then returns.
//!
//! * The uplink is a webhook subscription (`maxEventsPerBatch` 50) to the bench's receiver.
//!   Down is what docs/CLOUD.md calls an outage: `--outage-down refuse` (default) has nothing
//!   listening on its port (connection refused); `--outage-down 503` has the receiver answer
//!   503 without `Retry-After`.
//! * `--outage-events` persisted events (default 1,000,000, as issue 34 asks; quick 20,000)
//!   are published while it is down (batches of 100), then it stays down for
//!   `--outage-seconds` more (default 5). gridlet probes it every `--probe-seconds` (its
//!   `outbound__outageProbeSeconds`, default 1 here; 30 in gridlet). `--outage-restart
//!   term|kill` restarts gridlet halfway through that time (a device restart during the
//!   outage; `kill` is a crash).
//! * Then the link returns (the receiver binds the port, or answers 200), and the bench waits
//!   for every event. Reported, on the bench's wall clock: time from the return to the first
//!   delivery and to the last, the drain rate (events ÷ first to last delivery), gridlet's RSS
//!   and disk during the outage (peak of samples every 100 ms), and duplicates: every event id
//!   is remembered by the receiver, so a second copy is counted. None is expected, even after a
//!   crash: nothing was delivered before it.

use crate::child::{free_port, Gridlet};
use crate::net::{self, Mode, Receiver};
use crate::{mb, Bench, Row, API, TOPIC};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How the uplink is down (both are outages, docs/CLOUD.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Down {
    /// Nothing listens on its port: connection refused.
    Refused,
    /// Its receiver answers 503 without `Retry-After`.
    Unavailable,
}

/// Peaks of gridlet's RSS and disk, sampled until stopped.
struct Watch {
    rss: Arc<AtomicU64>,
    disk: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(g: &Gridlet) -> Self {
        let (rss, disk, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let pid = g.pid;
        let dirs = [g.events_dir(), g.events_dir().with_file_name("metadataDb")];
        let (r, d, s) = (rss.clone(), disk.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Relaxed) {
                r.fetch_max(crate::child::Footprint::of(pid).rss, Relaxed);
                let bytes: u64 = dirs.iter().map(|p| crate::child::du_bytes(p)).sum();
                d.fetch_max(bytes, Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self {
            rss,
            disk,
            stop,
            task,
        }
    }

    /// Stop sampling: (peak RSS, peak disk).
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Relaxed);
        let _ = self.task.await;
        (self.rss.load(Relaxed), self.disk.load(Relaxed))
    }
}

impl Bench {
    pub(crate) async fn scenario_outage(&mut self) -> Result<(), String> {
        let n = self
            .opts
            .outage_events
            .unwrap_or(if self.opts.quick { 20_000 } else { 1_000_000 });
        let refuse = self.opts.outage_down == Down::Refused;
        let how = if refuse {
            "connection refused"
        } else {
            "503 without Retry-After"
        };
        let down_for = self.opts.outage_seconds;
        let probe = self.opts.probe_seconds;
        println!(
            "\n== outage: {n} persisted events behind an uplink that is down ({how}), down {down_for:?} more, probe every {probe} s"
        );
        let port = free_port().map_err(|e| format!("port: {e}"))?;
        // 503 mode: the receiver is there from the start, refusing.
        let early = if refuse {
            None
        } else {
            let rx = Receiver::start_on(self.base, port)
                .await
                .map_err(|e| format!("receiver: {e}"))?;
            rx.set_mode(Mode::Refuse);
            Some(rx)
        };
        let probe_s = probe.to_string();
        let g = Gridlet::start(&self.spec(
            "outage",
            &[
                ("broker__defaultIsPersisted", "true"),
                ("outbound__outageProbeSeconds", probe_s.as_str()),
            ],
        ))
        .await?;
        self.uplink_subscription(&g, port).await?;
        let idle = g.sample();
        let watch = Watch::start(&g);
        let fill = self.fill(&g, n).await;
        if fill.accepted < n {
            return Err(format!(
                "outage: {} of {n} events accepted ({})",
                fill.accepted,
                fill.first_error.unwrap_or_default()
            ));
        }
        let fill_s = fill.elapsed.as_secs_f64();
        println!(
            "  published {n} events in {fill_s:.1} s ({:.0} ev/s) while the uplink was down",
            n as f64 / fill_s.max(1e-9)
        );
        let (g, watch, restart) = match self.opts.outage_restart {
            None => {
                tokio::time::sleep(down_for).await;
                (g, watch, String::new())
            }
            Some(kill) => {
                tokio::time::sleep(down_for / 2).await;
                let (rss, disk) = watch.stop().await;
                let g = if kill {
                    g.crash_restart().await?
                } else {
                    g.restart().await?
                };
                let watch = Watch::start(&g);
                watch.rss.fetch_max(rss, Relaxed);
                watch.disk.fetch_max(disk, Relaxed);
                let what = if kill { "SIGKILL" } else { "SIGTERM" };
                let restored = crate::pending_events(&g).await.unwrap_or(0);
                println!(
                    "  restarted ({what}) during the outage: serving after {:.0} ms, {restored} events restored",
                    crate::ms(g.startup)
                );
                tokio::time::sleep(down_for / 2).await;
                (g, watch, format!("; restarted ({what}) during the outage"))
            }
        };
        let in_outage = crate::labelled_sum(&g, "gridlet_endpoint_outage{")
            .await
            .unwrap_or(0);
        let pending = crate::pending_events(&g).await.unwrap_or(0);
        let (rss, disk) = watch.stop().await;
        println!(
            "  during the outage: peak RSS {} (idle {}), peak disk {} ({:.0} bytes per event); endpoints in outage {in_outage}; pending {pending}",
            mb(rss),
            mb(idle.rss),
            mb(disk),
            disk as f64 / n as f64
        );

        // The link returns.
        let before = g.sample();
        let back_us = net::now_us(self.base);
        let rx = match early {
            Some(rx) => {
                rx.stats.reset();
                rx.track_ids();
                rx.set_mode(Mode::Up);
                rx
            }
            None => {
                let rx = Receiver::start_on(self.base, port)
                    .await
                    .map_err(|e| format!("receiver on {port}: {e}"))?;
                rx.track_ids();
                rx
            }
        };
        rx.stats.sampling.store(false, Relaxed);
        let drain_watch = Watch::start(&g);
        let idle_cap = Duration::from_secs(u64::from(probe) * 3 + 30);
        let (delivered, last_us) =
            crate::wait_delivered(&rx, n, Duration::from_secs(900), idle_cap).await;
        let (drain_rss, _) = drain_watch.stop().await;
        let after = g.sample();
        let first_us = rx.stats.first_us.load(Relaxed);
        let dups = rx.stats.duplicates.load(Relaxed);
        let to_first = first_us.saturating_sub(back_us) as f64 / 1e6;
        let to_last = last_us.saturating_sub(back_us) as f64 / 1e6;
        let drain_s = last_us.saturating_sub(first_us) as f64 / 1e6;
        let rate = delivered as f64 / drain_s.max(1e-9);
        let cpu = after.cpu_s - before.cpu_s;
        println!(
            "  link back: first delivery after {to_first:.2} s, last after {to_last:.2} s; {delivered} of {n} delivered, {dups} duplicates; drain {rate:.0} events/s; drain peak RSS {}; CPU {cpu:.2} s",
            mb(drain_rss)
        );
        if delivered < n {
            return Err(format!(
                "outage: only {delivered} of {n} events delivered after the link returned:\n{}",
                g.log_tail()
            ));
        }
        self.rows.push(Row {
            name: "outage: drain after the uplink returns".into(),
            publish_eps: n as f64 / fill_s.max(1e-9),
            delivered_eps: rate,
            peak_rss: rss.max(drain_rss),
            cpu_s: cpu,
            disk_per_event: Some(disk as f64 / n as f64),
            accepted: n,
            delivered,
            note: format!(
                "{how}{restart}; first delivery {to_first:.2} s after the return, last {to_last:.2} s; {dups} duplicates"
            ),
            ..Row::default()
        });
        self.figures.insert(
            "outage".into(),
            serde_json::json!({
                "events": n,
                "down": how,
                "restart": self.opts.outage_restart.map(|kill| if kill { "SIGKILL" } else { "SIGTERM" }),
                "down_after_publish_s": down_for.as_secs_f64(),
                "probe_seconds": probe,
                "publish_eps": (n as f64 / fill_s.max(1e-9)).round(),
                "first_delivery_s": crate::report::round2(to_first),
                "last_delivery_s": crate::report::round2(to_last),
                "drain_eps": rate.round(),
                "outage_peak_rss_bytes": rss,
                "outage_peak_disk_bytes": disk,
                "drain_peak_rss_bytes": drain_rss,
                "delivered": delivered,
                "duplicates": dups,
                "drain_cpu_us_per_event": crate::report::round1(crate::per_event_us(cpu, delivered)),
            }),
        );
        Ok(())
    }

    /// The topic and its one webhook subscription to the uplink on `port`.
    async fn uplink_subscription(&self, g: &Gridlet, port: u16) -> Result<(), String> {
        let (s, b) = net::request(g.addr, "PUT", &format!("/topics/{TOPIC}?{API}"), "{}").await?;
        if s != 200 {
            return Err(format!("create topic: HTTP {s}: {b}"));
        }
        let body = serde_json::json!({"properties": {"destination": {"endpointType": "WebHook",
            "properties": {"endpointUrl": format!("http://127.0.0.1:{port}/uplink"),
                "maxEventsPerBatch": 50}}}});
        let (s, b) = net::request(
            g.addr,
            "PUT",
            &format!("/topics/{TOPIC}/eventSubscriptions/uplink?{API}"),
            &body.to_string(),
        )
        .await?;
        if s != 200 {
            return Err(format!("create subscription: HTTP {s}: {b}"));
        }
        Ok(())
    }
}
