//! Scenario (e): a backlog behind a down subscriber. Queue it (`--down stall`: in the ready
//! lane; `--down refuse`: every event fails once, so the whole backlog is in the retry lane),
//! restart gridlet with it, then bring the subscriber back and measure the drain.

use super::*;

/// What queueing the backlog cost.
struct Queued {
    fill: Published,
    /// gridlet with the backlog queued.
    at: Footprint,
    disk: u64,
}

/// The drain after the restart.
struct Drained {
    before: Footprint,
    after: Footprint,
    delivered: u64,
    events_per_s: f64,
}

impl Bench {
    pub(super) async fn scenario_e(&mut self) -> Result<(), String> {
        let n = self.opts.backlog;
        println!(
            "\n== (e) backlog of {n} events behind a down subscriber ({:?}) ==",
            self.opts.down
        );
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let g = Gridlet::start(&self.backlog_spec()).await?;
        setup(&g, 1, &rx, Some(50)).await?;
        let queued = self.queue_backlog(&g, &rx).await?;
        let g = if self.opts.e_kill {
            g.crash_restart().await?
        } else {
            g.restart().await?
        };
        let (restored, note) = self.after_restart(&g, &rx).await?;
        let drained = self.drain(&g, &rx).await;
        self.extras.push((
            "(e) RSS with the backlog".into(),
            format!("{} ({} events queued)", mb(queued.at.rss), n),
        ));
        self.extras.push((
            "(e) restart to serving with the backlog".into(),
            format!("{:.0} ms ({restored} events restored)", ms(g.startup)),
        ));
        let fill = &queued.fill;
        self.figures.insert(
            "e".into(),
            serde_json::json!({
                "events": n,
                "rss_queued_bytes": queued.at.rss,
                "disk_bytes": queued.disk,
                "restart_ms": report::round1(ms(g.startup)),
                "restored": restored,
                "drain_eps": drained.events_per_s.round(),
                "drain_peak_rss_bytes": drained.after.hwm,
                "delivered": drained.delivered,
            }),
        );
        self.rows.push(Row {
            name: "e: drain 1M backlog".into(),
            publish_eps: fill.accepted as f64 / fill.elapsed.as_secs_f64().max(1e-9),
            delivered_eps: drained.events_per_s,
            lat: None,
            peak_rss: drained.after.hwm.max(queued.at.hwm),
            cpu_s: drained.after.cpu_s - drained.before.cpu_s,
            sys_s: drained.after.sys_s - drained.before.sys_s,
            switches: drained
                .after
                .switches
                .saturating_sub(drained.before.switches),
            disk_per_event: Some(queued.disk as f64 / n as f64),
            device_written: None,
            accepted: n,
            delivered: drained.delivered,
            log_lines: None,
            bench_cpu_s: 0.0,
            paired: None,
            note,
        });
        Ok(())
    }

    fn backlog_spec(&self) -> Spec {
        let persisted = if self.opts.e_persisted {
            "true"
        } else {
            "false"
        };
        // A refusing subscriber is the retry lane's test: its circuit stays closed, so every
        // event takes the retry schedule instead of waiting for a probe.
        let health = if self.opts.down == Mode::Refuse {
            "false"
        } else {
            "true"
        };
        self.spec(
            "e",
            &[
                ("broker__defaultIsPersisted", persisted),
                ("broker__deliveryTimeoutInSeconds", "3600"),
                ("broker__endpointHealth__enabled", health),
            ],
        )
    }

    /// Take the subscriber down, queue the backlog, and (`--down refuse`) wait until every
    /// event has failed once.
    async fn queue_backlog(&self, g: &Gridlet, rx: &Receiver) -> Result<Queued, String> {
        let n = self.opts.backlog;
        let idle = g.sample();
        rx.set_mode(self.opts.down);
        rx.stats.sampling.store(false, Relaxed);
        let fill = self.fill(g, n).await;
        if fill.accepted < n {
            return Err(format!(
                "could not queue the backlog: {} of {n} accepted ({})",
                fill.accepted,
                fill.first_error.clone().unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if self.opts.down == Mode::Refuse {
            // The whole backlog in the retry lane: what start-up and the drain must hold
            // within bounds.
            let t = Instant::now();
            let mut failed = 0;
            while failed < n && t.elapsed() < Duration::from_secs(600) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                failed = labelled_sum(g, "DeliveryFailureCounts{").await.unwrap_or(0);
            }
            println!(
                "  every event failed once: {failed} failures in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        let at = g.sample();
        let disk = g.disk_bytes();
        let pending = pending_events(g).await;
        println!(
            "  filled {} events in {:.1} s ({:.0} ev/s); gridlet pending {}",
            fill.accepted,
            fill.elapsed.as_secs_f64(),
            fill.accepted as f64 / fill.elapsed.as_secs_f64().max(1e-9),
            pending.map(|p| p.to_string()).unwrap_or("?".into())
        );
        println!(
            "  with the backlog: RSS {} (idle before {}), peak {}, disk {} = {:.0} bytes/event",
            mb(at.rss),
            mb(idle.rss),
            mb(at.hwm),
            mb(disk),
            disk as f64 / n as f64
        );
        Ok(Queued { fill, at, disk })
    }

    /// What the restart restored; a store that kept nothing gets its topic and backlog again,
    /// so the drain still has something to measure. Returns the restored count and the row's note.
    async fn after_restart(&self, g: &Gridlet, rx: &Receiver) -> Result<(u64, String), String> {
        let n = self.opts.backlog;
        let restored = pending_events(g).await.unwrap_or(0);
        println!(
            "  restart to serving: {:.0} ms, backlog restored: {restored} events",
            ms(g.startup)
        );
        let mut note = format!("restart {:.0} ms", ms(g.startup));
        let (topic_status, _) =
            net::request(g.addr, "GET", &format!("/topics/{TOPIC}?{API}"), "").await?;
        if topic_status == 404 {
            println!("  the store kept no topics across the restart; re-creating them");
            setup(g, 1, rx, Some(50)).await?;
        }
        if restored < n {
            note.push_str(&format!(
                ", restored {restored} (store keeps no events across restarts), refilled"
            ));
            let again = self.fill(g, n - restored).await;
            if again.accepted < n - restored {
                return Err(format!(
                    "could not refill the backlog: {} of {} accepted ({})",
                    again.accepted,
                    n - restored,
                    again.first_error.unwrap_or_default()
                ));
            }
            println!(
                "  the store lost the backlog at restart; refilled {} events in {:.1} s",
                again.accepted,
                again.elapsed.as_secs_f64()
            );
        }
        Ok((restored, note))
    }

    /// Bring the subscriber back and wait for the backlog to arrive.
    async fn drain(&self, g: &Gridlet, rx: &Receiver) -> Drained {
        let n = self.opts.backlog;
        let before = g.sample();
        println!(
            "  restarted with the backlog, before the drain: RSS {} (peak {})",
            mb(before.rss),
            mb(before.hwm)
        );
        rx.stats.reset();
        let t0 = Instant::now();
        let t0_us = net::now_us(self.base);
        rx.set_mode(Mode::Up);
        // A refused backlog sits in the retry lane until its retry is due (a minute in the
        // original schedule): wait that long for the first delivery before calling it stuck.
        let idle = match self.opts.down {
            Mode::Refuse => Duration::from_secs(180),
            _ => Duration::from_secs(5),
        };
        // 600 s, or the run's own limit (`--max-seconds`) when a larger backlog asks for more.
        let limit = Duration::from_secs(self.opts.max_seconds.max(600));
        let (delivered, last_us) = wait_delivered(rx, n, limit, idle).await;
        let after = g.sample();
        let drain_s = (last_us.saturating_sub(t0_us)) as f64 / 1e6;
        let events_per_s = delivered as f64 / drain_s.max(1e-9);
        println!(
            "  drain: {delivered} events in {:.2} s = {:.0} ev/s ({:.2} × raw); RSS after drain {}, peak {}; CPU {:.2} s; {:.3} context switches per event",
            drain_s,
            events_per_s,
            events_per_s / self.raw1,
            mb(after.rss),
            mb(after.hwm),
            after.cpu_s - before.cpu_s,
            after.switches.saturating_sub(before.switches) as f64 / delivered.max(1) as f64
        );
        if let Some(c) = metric(g, "gridlet_store_compactions_total").await {
            println!("  segments compacted during the run: {c}");
        }
        if t0.elapsed() + Duration::from_secs(10) > limit {
            println!("  (drain stopped at its {} s deadline)", limit.as_secs());
        }
        Drained {
            before,
            after,
            delivered,
            events_per_s,
        }
    }

    /// Queue `n` events (batches of 100) while the subscriber is down.
    pub(super) async fn fill(&self, g: &Gridlet, n: u64) -> Published {
        let load = Load {
            conns: self.opts.conns,
            batch: 100,
            // 300 s, or the run's own limit (`--max-seconds`): 100 M events take longer.
            duration: Duration::from_secs(self.opts.max_seconds.max(300)),
            max_events: n,
            rate: None,
            path: publish_path(),
            event_bytes: net::EVENT_BYTES,
        };
        net::publish(g.addr, &load, self.base).await
    }
}
