//! The throughput scenarios (a–d, and the raw limits they are measured against), the
//! footprint, and the measuring loop they share (warm-up, measured run, paired rounds).

use super::*;

/// The paced row of (d): about half of what the closed loop reaches on a 2-vCPU machine.
const D_PACED_EPS: u64 = 4000;

impl Bench {
    /// The raw single-hop limit: publisher → receiver, no broker.
    pub(super) async fn raw(&mut self) -> Result<(), String> {
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        self.warm_up(&rx, rx.addr, "/raw", 1, 1).await;
        let r1 = self
            .measure("raw batch 1", &rx, rx.addr, &self.load(1, "/raw"), 1, None)
            .await;
        self.raw1 = r1.delivered_eps.max(1.0);
        self.print_row(&r1, "publisher → receiver directly, 1 event per request");
        self.rows.push(r1);
        let r100 = self
            .measure(
                "raw batch 100",
                &rx,
                rx.addr,
                &self.load(100, "/raw"),
                1,
                None,
            )
            .await;
        self.print_row(
            &r100,
            "publisher → receiver directly, 100 events per request",
        );
        self.rows.push(r100);
        Ok(())
    }

    pub(super) async fn scenario_a(&mut self) -> Result<(), String> {
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let g = Gridlet::start(&self.spec("a", &[])).await?;
        setup(&g, 1, &rx, None).await?;
        let path = publish_path();
        self.warm_up(&rx, g.addr, &path, 1, 1).await;
        let mut r = self
            .measure(
                "a: 1 sub, batch 1",
                &rx,
                g.addr,
                &self.load(1, &path),
                1,
                Some(&g),
            )
            .await;
        r.note = "batching off".into();
        r.paired = self.paired(&rx, &g, &path, (1, 1), None).await;
        self.print_row(
            &r,
            "1 topic, 1 subscription, publish batches of 1, batching off",
        );
        self.rows.push(r);
        // Latency at a paced 1,000 events/s.
        self.paced_row(&rx, &g, &path, "a: paced 1,000 ev/s", 1000, 4)
            .await;
        Ok(())
    }

    pub(super) async fn scenario_b(&mut self) -> Result<(), String> {
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let g = Gridlet::start(&self.spec("b", &[])).await?;
        setup(&g, 1, &rx, Some(50)).await?;
        let path = publish_path();
        self.warm_up(&rx, g.addr, &path, 100, 1).await;
        let mut r = self
            .measure(
                "b: batch 100 / 50",
                &rx,
                g.addr,
                &self.load(100, &path),
                1,
                Some(&g),
            )
            .await;
        r.note = "maxEventsPerBatch 50".into();
        r.paired = self.paired(&rx, &g, &path, (100, 1), None).await;
        self.print_row(&r, "publish batches of 100, maxEventsPerBatch 50");
        self.rows.push(r);
        Ok(())
    }

    pub(super) async fn scenario_c(&mut self) -> Result<(), String> {
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let g = Gridlet::start(&self.spec("c", &[])).await?;
        setup(&g, 10, &rx, None).await?;
        let path = publish_path();
        self.warm_up(&rx, g.addr, &path, 1, 10).await;
        let mut r = self
            .measure(
                "c: fan-out 10",
                &rx,
                g.addr,
                &self.load(1, &path),
                10,
                Some(&g),
            )
            .await;
        r.note = "delivered = all 10 copies".into();
        r.paired = self.paired(&rx, &g, &path, (1, 10), None).await;
        self.print_row(
            &r,
            "10 subscriptions on the topic, publish batches of 1, batching off",
        );
        self.rows.push(r);
        Ok(())
    }

    pub(super) async fn scenario_d(&mut self) -> Result<(), String> {
        // The raw durable limit first: the same publisher straight to a receiver that syncs every
        // body to disk (group commit) before its 200.
        let dir = self.root.join("raw-durable");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let syncer =
            net::Syncer::start(&dir.join("sync.bin")).map_err(|e| format!("raw durable: {e}"))?;
        let raw_rx = Receiver::start_with(self.base, Some(syncer.clone()))
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        self.warm_up(&raw_rx, raw_rx.addr, "/raw", 1, 1).await;
        let mut rd = self
            .measure(
                "raw durable batch 1",
                &raw_rx,
                raw_rx.addr,
                &self.load(1, "/raw"),
                1,
                None,
            )
            .await;
        rd.note = "receiver fdatasyncs each body (group commit) before its 200".into();
        self.print_row(
            &rd,
            "publisher → receiver directly, body fdatasynced before the 200 (the durable limit)",
        );
        let raw_durable = rd.delivered_eps.max(1.0);
        self.rows.push(rd);
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let g = Gridlet::start(&self.spec("d", &[("broker__defaultIsPersisted", "true")])).await?;
        setup(&g, 1, &rx, None).await?;
        let path = publish_path();
        self.warm_up(&rx, g.addr, &path, 1, 1).await;
        let mut r = self
            .measure(
                "d: persisted",
                &rx,
                g.addr,
                &self.load(1, &path),
                1,
                Some(&g),
            )
            .await;
        let per_sync = match (
            metric(&g, "gridlet_store_commits_total").await,
            metric(&g, "gridlet_store_journal_syncs_total").await,
        ) {
            (Some(c), Some(s)) if s > 0 => {
                format!("; {:.1} publishes per fdatasync", c as f64 / s as f64)
            }
            _ => String::new(),
        };
        r.note = format!(
            "200 after store commit; {:.2} × raw durable{per_sync}",
            r.delivered_eps / raw_durable
        );
        // The raw durable receiver stays up for the paired rounds.
        r.paired = self.paired(&rx, &g, &path, (1, 1), Some(&raw_rx)).await;
        syncer.stop();
        drop(raw_rx);
        self.print_row(
            &r,
            "as (a), broker__defaultIsPersisted=true (200 only after the store commit)",
        );
        self.rows.push(r);
        // CPU per durable event and latency at a fixed rate: unlike the closed loop's, they do
        // not move with how fast the machine happens to be in that minute.
        let conns = self.opts.conns;
        self.paced_row(&rx, &g, &path, "d: paced 4,000 ev/s", D_PACED_EPS, conns)
            .await;
        Ok(())
    }

    /// A row of one-event publishes to `g` at a fixed `rate` (open loop) over `conns`
    /// connections, for `--paced-seconds`.
    async fn paced_row(
        &mut self,
        rx: &Receiver,
        g: &Gridlet,
        path: &str,
        name: &str,
        rate: u64,
        conns: usize,
    ) {
        let mut paced = self.load(1, path);
        paced.rate = Some(rate);
        paced.duration = self.opts.paced;
        paced.conns = conns;
        let mut p = self.measure(name, rx, g.addr, &paced, 1, Some(g)).await;
        p.note = format!("open loop, {conns} connections");
        self.print_row(&p, &format!("at a paced {rate} events/s"));
        self.rows.push(p);
    }

    pub(super) async fn footprint(&mut self) -> Result<(), String> {
        println!("\n== footprint ==");
        let size = std::fs::metadata(&self.bin).map(|m| m.len()).unwrap_or(0);
        let spec = self.spec("footprint", &[]);
        let mut starts = Vec::new();
        let mut idle = Footprint::default();
        for i in 0..5 {
            let g = Gridlet::start(&spec).await?;
            starts.push(g.startup);
            if i == 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                idle = g.sample();
            }
        }
        let cold = starts.first().copied().unwrap_or_default();
        let mut warm: Vec<Duration> = starts.iter().skip(1).copied().collect();
        warm.sort();
        let median = warm.get(warm.len() / 2).copied().unwrap_or_default();
        let worst = warm.last().copied().unwrap_or_default();
        let lines = [
            ("release binary size".to_string(), mb(size)),
            (
                "idle RSS (no topics, 0.5 s after start)".to_string(),
                format!("{} (peak {})", mb(idle.rss), mb(idle.hwm)),
            ),
            (
                "start-up to serving /healthz, first start".to_string(),
                format!("{:.1} ms (creates the self-signed certificate)", ms(cold)),
            ),
            (
                "start-up to serving /healthz, later starts".to_string(),
                format!("median {:.1} ms, max {:.1} ms", ms(median), ms(worst)),
            ),
        ];
        for (k, v) in &lines {
            println!("  {k:<45} {v}");
        }
        self.extras.extend(lines);
        self.figures.insert(
            "footprint".into(),
            serde_json::json!({
                "binary_bytes": size,
                "idle_rss_bytes": idle.rss,
                "idle_peak_rss_bytes": idle.hwm,
                "first_start_ms": report::round1(ms(cold)),
                "start_ms_median": report::round1(ms(median)),
                "start_ms_max": report::round1(ms(worst)),
            }),
        );
        Ok(())
    }

    /// A short unmeasured run so connections and pools exist before measuring.
    pub(super) async fn warm_up(
        &self,
        rx: &Receiver,
        addr: std::net::SocketAddr,
        path: &str,
        batch: usize,
        fanout: u64,
    ) {
        let mut l = self.load(batch, path);
        l.duration = Duration::from_millis(300);
        let p = net::publish(addr, &l, self.base).await;
        wait_delivered(
            rx,
            p.accepted * fanout,
            Duration::from_secs(30),
            Duration::from_secs(5),
        )
        .await;
    }

    pub(super) async fn measure(
        &self,
        name: &str,
        rx: &Receiver,
        addr: std::net::SocketAddr,
        load: &Load,
        fanout: u64,
        g: Option<&Gridlet>,
    ) -> Row {
        rx.stats.reset();
        rx.stats.sampling.store(true, Relaxed);
        let fp0 = g.map(Gridlet::sample).unwrap_or_default();
        let log0 = g.map(Gridlet::log_lines);
        let self0 = Footprint::of(std::process::id());
        let dev0 = child::device_written(&self.root);
        let t0_us = net::now_us(self.base);
        let p = net::publish(addr, load, self.base).await;
        let queued_at_end = (p.accepted * fanout).saturating_sub(rx.stats.events.load(Relaxed));
        let disk = g.map(Gridlet::disk_bytes).unwrap_or(0);
        let expected = p.accepted * fanout;
        let (delivered, last_us) = wait_delivered(
            rx,
            expected,
            Duration::from_secs(120),
            Duration::from_secs(5),
        )
        .await;
        let fp1 = g.map(Gridlet::sample).unwrap_or_default();
        let self1 = Footprint::of(std::process::id());
        let device_written = dev0
            .zip(child::device_written(&self.root))
            .map(|(a, b)| b.saturating_sub(a));
        let span = last_us.saturating_sub(t0_us) as f64 / 1e6;
        let mut samples = rx.stats.take_samples();
        samples.sort_unstable();
        let pct = |q: f64| -> u32 {
            let i = ((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1));
            samples.get(i).copied().unwrap_or(0)
        };
        let lat = (!samples.is_empty()).then(|| (pct(0.5), pct(0.99), pct(1.0)));
        let mut note = String::new();
        if p.rejected > 0 || p.errors > 0 {
            note = format!(
                "{} rejected, {} errors: {}",
                p.rejected,
                p.errors,
                p.first_error.clone().unwrap_or_default()
            );
        }
        if delivered < expected {
            note.push_str(&format!(" only {delivered} of {expected} delivered"));
        }
        if let (Some(g), Some(_)) = (g, self.opts.otlp) {
            // Since the child started (its warm-up included); printed, as scenarios set the
            // row's note.
            let family = "gridlet_telemetry_spans_total{result=";
            let exported = super::labelled_sum(g, &format!("{family}\"exported\"")).await;
            let dropped = super::labelled_sum(g, &format!("{family}\"dropped\"")).await;
            println!(
                "  {name}: spans exported {}, dropped {} (since gridlet started)",
                exported.unwrap_or(0),
                dropped.unwrap_or(0)
            );
        }
        Row {
            name: name.to_string(),
            publish_eps: p.accepted as f64 / p.elapsed.as_secs_f64().max(1e-9),
            delivered_eps: delivered as f64 / span.max(1e-9),
            lat,
            peak_rss: fp1.hwm,
            cpu_s: fp1.cpu_s - fp0.cpu_s,
            sys_s: fp1.sys_s - fp0.sys_s,
            switches: fp1.switches.saturating_sub(fp0.switches),
            disk_per_event: (g.is_some() && queued_at_end >= 1000)
                .then(|| disk as f64 / queued_at_end as f64),
            device_written,
            accepted: p.accepted,
            delivered,
            log_lines: g
                .map(Gridlet::log_lines)
                .zip(log0)
                .map(|(b, a)| b.saturating_sub(a)),
            bench_cpu_s: self1.cpu_s - self0.cpu_s,
            paired: None,
            note,
        }
    }

    /// The scenario's delivered events/s against the raw limit measured seconds apart:
    /// `--rounds` rounds, each a `--slice` of the raw batch-1 limit (the publisher straight to
    /// `rx`, gridlet idle), then, given `durable`, a slice of the raw durable limit, then a slice
    /// of the scenario. One raw measurement at the start of the bench is a minute away from the
    /// last scenario; on a shared VM the raw limit moves by a third between such minutes
    /// (docs/BENCHMARKS.md), and alternating slices put both sides of the ratio in the same
    /// seconds.
    pub(super) async fn paired(
        &self,
        rx: &Receiver,
        g: &Gridlet,
        path: &str,
        (batch, fanout): (usize, u64),
        durable: Option<&Receiver>,
    ) -> Option<Paired> {
        let (mut raw, mut dur, mut scen) =
            (Slices::default(), Slices::default(), Slices::default());
        for _ in 0..self.opts.rounds {
            let mut l = self.load(1, "/raw");
            l.duration = self.opts.slice;
            raw.add(&self.measure("raw slice", rx, rx.addr, &l, 1, None).await);
            if let Some(d) = durable {
                dur.add(
                    &self
                        .measure("raw durable slice", d, d.addr, &l, 1, None)
                        .await,
                );
            }
            let mut l = self.load(batch, path);
            l.duration = self.opts.slice;
            scen.add(&self.measure("slice", rx, g.addr, &l, fanout, Some(g)).await);
        }
        let (scen_rate, raw_rate) = (scen.rate()?, raw.rate()?);
        Some(Paired {
            rounds: self.opts.rounds,
            raw: scen_rate / raw_rate,
            raw_spread: scen.ratios(&raw),
            raw_eps: Slices::min_max(raw.rates.iter().copied()),
            durable: dur.rate().map(|d| (scen_rate / d, scen.ratios(&dur))),
        })
    }
}
