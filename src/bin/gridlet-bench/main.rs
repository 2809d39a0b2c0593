//! `gridlet-bench`: gridlet measured against the physical limit of the machine it runs on.
//!
//! ```text
//! cargo run --release --bin gridlet-bench -- [--scenario a|b|c|d|e|footprint|azure|all] [--quick]
//! ```
//!
//! gridlet runs as a **child process** (the `gridlet` binary next to this one, or `--gridlet
//! PATH`) on loopback HTTP; a webhook receiver and a keep-alive publisher run in this process.
//! Every run first measures the **raw loopback limit**: the same publisher posting straight to the
//! same receiver, no broker. Every throughput is printed also as a ratio of that limit, because
//! absolute numbers on a shared machine drift while the ratio measured in one run does not (much).
//!
//! Scenarios (see `docs/BENCHMARKS.md`):
//! * a: 1 topic, 1 subscription, 256-byte events, publish batches of 1, batching off; then latency
//!   at a paced 1,000 events/s;
//! * b: publish batches of 100, `maxEventsPerBatch` 50;
//! * c: 10 subscriptions on the topic (fan-out);
//! * d: as (a) with `broker__defaultIsPersisted=true` (200 only after the store commit);
//! * e: a backlog of 1,000,000 events behind a stalled subscriber, restart with that backlog, then
//!   the subscriber comes back and the backlog drains;
//! * footprint: release binary size, idle RSS, start-up to serving;
//! * azure (opt-in, not in `all`): delivery to a Storage queue in Azurite beside webhook
//!   delivery, with the raw Azurite limit ([`azure`]).
//!
//! The bench never hangs: every phase has a deadline, a watchdog kills everything after
//! `--max-seconds`, and every gridlet child is killed on exit (also on panic).

#![forbid(unsafe_code)]

mod azure;
mod child;
mod net;

use child::{Footprint, Gridlet, Spec};
use net::{Load, Mode, Published, Receiver};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const API: &str = "api-version=2019-01-01-preview";
const TOPIC: &str = "bench";

/// Command-line options.
#[derive(Debug, Clone)]
struct Opts {
    scenarios: Vec<String>,
    quick: bool,
    duration: Duration,
    paced: Duration,
    conns: usize,
    backlog: u64,
    gridlet: Option<PathBuf>,
    max_seconds: u64,
    /// How the subscriber is down in (e).
    down: Mode,
    /// (e) with persisted subscriptions (default) or in-memory ones.
    e_persisted: bool,
    /// Paired rounds per throughput scenario (0 = none): see [`Bench::paired`].
    rounds: u32,
    /// Length of each slice of a paired round.
    slice: Duration,
}

const USAGE: &str =
    "usage: gridlet-bench [--scenario a|b|c|d|e|footprint|azure|all (comma list ok)] [--quick]
                     [--duration SECS] [--paced-seconds SECS] [--conns N] [--backlog EVENTS]
                     [--down stall|refuse] [--e-in-memory] [--gridlet PATH] [--max-seconds SECS]
                     [--rounds N] [--slice SECS]

--rounds N (default 4, 0 = off) and --slice SECS (default 2): after its main run, each throughput
scenario (a, b, c, d) runs N rounds that alternate a SECS slice of the raw batch-1 limit with a
SECS slice of the scenario (and, in d, of the raw durable limit), and prints its ratio to the
limit measured seconds apart: the machine's drift moves both sides of that ratio alike.

--down (scenario e): stall = the subscriber accepts requests and answers nothing until it comes
back (the backlog waits in the ready lane); refuse = it answers 503 (every event takes the
1-minute retry lane, so the drain waits for the retry schedule).
--e-in-memory: scenario e with in-memory subscriptions (default: persisted, so the backlog can
survive the restart).";

fn parse_args() -> Result<Opts, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        scenarios: vec!["all".into()],
        quick,
        duration: Duration::from_secs_f64(if quick { 1.0 } else { 8.0 }),
        paced: Duration::from_secs_f64(if quick { 1.0 } else { 5.0 }),
        conns: 8,
        backlog: if quick { 20_000 } else { 1_000_000 },
        gridlet: None,
        max_seconds: 900,
        down: Mode::Stall,
        e_persisted: true,
        rounds: if quick { 1 } else { 4 },
        slice: Duration::from_secs_f64(if quick { 0.3 } else { 2.0 }),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or(format!("{a} needs a value\n{USAGE}"))
        };
        let secs = |v: String| {
            v.parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s < 3600.0)
                .map(Duration::from_secs_f64)
                .ok_or(format!("{a}: expected seconds"))
        };
        match a.as_str() {
            "--quick" => {}
            "--scenario" => {
                o.scenarios = val()?.split(',').map(|s| s.trim().to_string()).collect();
            }
            "--duration" => o.duration = secs(val()?)?,
            "--paced-seconds" => o.paced = secs(val()?)?,
            "--conns" => {
                o.conns = val()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or("--conns: 1..=1024")?
            }
            "--backlog" => {
                o.backlog = val()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=100_000_000).contains(n))
                    .ok_or("--backlog: 1..=100000000")?
            }
            "--down" => {
                o.down = match val()?.as_str() {
                    "stall" => Mode::Stall,
                    "refuse" => Mode::Refuse,
                    _ => return Err("--down: stall or refuse".into()),
                }
            }
            "--e-in-memory" => o.e_persisted = false,
            "--rounds" => {
                o.rounds = val()?
                    .parse()
                    .ok()
                    .filter(|n| *n <= 100)
                    .ok_or("--rounds: 0..=100")?
            }
            "--slice" => o.slice = secs(val()?)?,
            "--gridlet" => o.gridlet = Some(PathBuf::from(val()?)),
            "--max-seconds" => {
                o.max_seconds = val()?
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or("--max-seconds: a positive number")?
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    let known = ["a", "b", "c", "d", "e", "footprint", "azure", "all"];
    if let Some(bad) = o.scenarios.iter().find(|s| !known.contains(&s.as_str())) {
        return Err(format!("unknown scenario {bad}\n{USAGE}"));
    }
    Ok(o)
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        child::kill_all();
        default_hook(info);
    }));
    let limit = opts.max_seconds;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(limit));
        eprintln!("gridlet-bench: watchdog: still running after {limit} s; stopping");
        child::kill_all();
        std::process::exit(3);
    });
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gridlet-bench: runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async move {
        match run(opts).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("gridlet-bench: {e}");
                1
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    child::kill_all();
    std::process::exit(code);
}

/// One measured run.
#[derive(Debug, Default, Clone)]
struct Row {
    name: String,
    publish_eps: f64,
    delivered_eps: f64,
    /// Latency percentiles (µs): p50, p99, max.
    lat: Option<(u32, u32, u32)>,
    peak_rss: u64,
    cpu_s: f64,
    disk_per_event: Option<f64>,
    accepted: u64,
    delivered: u64,
    /// Lines gridlet logged during the run.
    log_lines: Option<usize>,
    /// CPU seconds of this bench process (publisher + receiver) during the run.
    bench_cpu_s: f64,
    /// Delivered events/s against the raw limit(s) measured in alternating slices.
    paired: Option<Paired>,
    note: String,
}

/// A scenario's throughput against the limits measured in alternating slices ([`Bench::paired`]).
#[derive(Debug, Clone)]
struct Paired {
    rounds: u32,
    /// Σ scenario events / Σ scenario seconds ÷ the same over the raw batch-1 slices.
    raw: f64,
    /// The lowest and highest single-round ratio.
    raw_spread: (f64, f64),
    /// The raw batch-1 slices' rates, lowest and highest (events/s).
    raw_eps: (f64, f64),
    /// (d) only: ÷ the raw durable slices, and their spread.
    durable: Option<(f64, (f64, f64))>,
}

/// Events and seconds of a series of slices, and each slice's rate (one per round, 0 when the
/// slice delivered nothing, so rounds stay paired by index).
#[derive(Default)]
struct Slices {
    events: f64,
    secs: f64,
    rates: Vec<f64>,
}

impl Slices {
    fn add(&mut self, r: &Row) {
        let delivered = r.delivered > 0 && r.delivered_eps > 0.0;
        if delivered {
            self.events += r.delivered as f64;
            self.secs += r.delivered as f64 / r.delivered_eps;
        }
        self.rates
            .push(if delivered { r.delivered_eps } else { 0.0 });
    }

    /// Σ events / Σ seconds; `None` when no slice delivered anything.
    fn rate(&self) -> Option<f64> {
        (self.secs > 0.0).then(|| self.events / self.secs)
    }

    fn min_max(v: impl Iterator<Item = f64>) -> (f64, f64) {
        v.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)))
    }

    /// The lowest and highest per-round ratio of `self` to `limit` (rounds whose limit slice
    /// delivered nothing are left out).
    fn ratios(&self, limit: &Slices) -> (f64, f64) {
        Self::min_max(
            self.rates
                .iter()
                .zip(&limit.rates)
                .filter(|(_, b)| **b > 0.0)
                .map(|(a, b)| a / b),
        )
    }
}

struct Bench {
    opts: Opts,
    base: Instant,
    bin: PathBuf,
    root: PathBuf,
    rows: Vec<Row>,
    raw1: f64,
    extras: Vec<(String, String)>,
}

async fn run(opts: Opts) -> Result<(), String> {
    let bin = match &opts.gridlet {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("current_exe: {e}"))?
            .with_file_name("gridlet"),
    };
    if !bin.is_file() {
        return Err(format!(
            "gridlet binary not found at {} (build it with `cargo build --release`, or pass --gridlet PATH)",
            bin.display()
        ));
    }
    let root = std::env::temp_dir().join(format!("gridlet-bench-{}", std::process::id()));
    let mut b = Bench {
        opts,
        base: Instant::now(),
        bin,
        root: root.clone(),
        rows: Vec::new(),
        raw1: 0.0,
        extras: Vec::new(),
    };
    let res = b.all().await;
    let _ = std::fs::remove_dir_all(&root);
    res
}

fn wants(o: &Opts, s: &str) -> bool {
    o.scenarios.iter().any(|x| x == s || x == "all")
}

impl Bench {
    async fn all(&mut self) -> Result<(), String> {
        let started = Instant::now();
        println!(
            "gridlet-bench: gridlet = {}, {} publisher connections, {:?} per throughput run{}",
            self.bin.display(),
            self.opts.conns,
            self.opts.duration,
            if self.opts.quick { " (quick)" } else { "" }
        );
        println!("machine: {}", machine());
        self.raw().await?;
        let o = self.opts.clone();
        if wants(&o, "a") {
            self.scenario_a().await?;
        }
        if wants(&o, "b") {
            self.scenario_b().await?;
        }
        if wants(&o, "c") {
            self.scenario_c().await?;
        }
        if wants(&o, "d") {
            self.scenario_d().await?;
        }
        if wants(&o, "e") {
            self.scenario_e().await?;
        }
        if wants(&o, "footprint") {
            self.footprint().await?;
        }
        // Opt-in: needs Azurite, so `all` leaves it out.
        if o.scenarios.iter().any(|s| s == "azure") {
            self.scenario_azure().await?;
        }
        self.summary();
        println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    }

    fn spec(&self, name: &str, extra: &[(&str, &str)]) -> Spec {
        // Bounds high enough that no measured publish is refused (503 / 507).
        let mut env: Vec<(String, String)> = vec![
            (
                "broker__maxPendingEventsPerSubscription".into(),
                "100000000".into(),
            ),
            ("persistence__maxDiskBytes".into(), "17179869184".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Spec {
            bin: self.bin.clone(),
            dir: self.root.join(name),
            env,
        }
    }

    fn load(&self, batch: usize, path: &str) -> Load {
        Load {
            conns: self.opts.conns,
            batch,
            duration: self.opts.duration,
            max_events: u64::MAX,
            rate: None,
            path: path.to_string(),
        }
    }

    /// The raw single-hop limit: publisher → receiver, no broker.
    async fn raw(&mut self) -> Result<(), String> {
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

    async fn scenario_a(&mut self) -> Result<(), String> {
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
        let mut paced = self.load(1, &path);
        paced.rate = Some(1000);
        paced.duration = self.opts.paced;
        paced.conns = 4;
        let mut p = self
            .measure("a: paced 1,000 ev/s", &rx, g.addr, &paced, 1, Some(&g))
            .await;
        p.note = "open loop, 4 connections".into();
        self.print_row(&p, "latency at a paced 1,000 events/s");
        self.rows.push(p);
        Ok(())
    }

    async fn scenario_b(&mut self) -> Result<(), String> {
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

    async fn scenario_c(&mut self) -> Result<(), String> {
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

    async fn scenario_d(&mut self) -> Result<(), String> {
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
        Ok(())
    }

    async fn scenario_e(&mut self) -> Result<(), String> {
        let n = self.opts.backlog;
        println!(
            "\n== (e) backlog of {n} events behind a down subscriber ({:?}) ==",
            self.opts.down
        );
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let spec = self.spec(
            "e",
            &[
                (
                    "broker__defaultIsPersisted",
                    if self.opts.e_persisted {
                        "true"
                    } else {
                        "false"
                    },
                ),
                ("broker__deliveryTimeoutInSeconds", "3600"),
                // A refusing subscriber is the retry lane's test: its circuit stays closed, so
                // every event takes the retry schedule instead of waiting for a probe.
                (
                    "broker__endpointHealth__enabled",
                    if self.opts.down == Mode::Refuse {
                        "false"
                    } else {
                        "true"
                    },
                ),
            ],
        );
        let g = Gridlet::start(&spec).await?;
        setup(&g, 1, &rx, Some(50)).await?;
        let idle = g.sample();
        rx.set_mode(self.opts.down);
        rx.stats.sampling.store(false, Relaxed);
        let fill = self.fill(&g, n).await;
        if fill.accepted < n {
            return Err(format!(
                "could not queue the backlog: {} of {n} accepted ({})",
                fill.accepted,
                fill.first_error.unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if self.opts.down == Mode::Refuse {
            // Every event has failed once before the restart: the whole backlog is in the
            // retry lane (what start-up and the drain must hold within bounds).
            let t = Instant::now();
            let mut failed = 0;
            while failed < n && t.elapsed() < Duration::from_secs(600) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                failed = labelled_sum(&g, "DeliveryFailureCounts{")
                    .await
                    .unwrap_or(0);
            }
            println!(
                "  every event failed once: {failed} failures in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        let queued = g.sample();
        let disk = g.disk_bytes();
        let pending = pending_events(&g).await;
        println!(
            "  filled {} events in {:.1} s ({:.0} ev/s); gridlet pending {}",
            fill.accepted,
            fill.elapsed.as_secs_f64(),
            fill.accepted as f64 / fill.elapsed.as_secs_f64().max(1e-9),
            pending.map(|p| p.to_string()).unwrap_or("?".into())
        );
        println!(
            "  with the backlog: RSS {} (idle before {}), peak {}, disk {} = {:.0} bytes/event",
            mb(queued.rss),
            mb(idle.rss),
            mb(queued.hwm),
            mb(disk),
            disk as f64 / n as f64
        );
        let rss_backlog = queued.rss;
        // Restart with the backlog.
        let g = g.restart().await?;
        let restored = pending_events(&g).await.unwrap_or(0);
        println!(
            "  restart to serving: {:.0} ms, backlog restored: {restored} events",
            ms(g.startup)
        );
        let mut note = format!("restart {:.0} ms", ms(g.startup));
        let (topic_status, _) =
            net::request(g.addr, "GET", &format!("/topics/{TOPIC}?{API}"), "").await?;
        if topic_status == 404 {
            println!("  the store kept no topics across the restart; re-creating them");
            setup(&g, 1, &rx, Some(50)).await?;
        }
        if restored < n {
            note.push_str(&format!(
                ", restored {restored} (store keeps no events across restarts), refilled"
            ));
            let again = self.fill(&g, n - restored).await;
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
        let (delivered, last_us) = wait_delivered(&rx, n, Duration::from_secs(600), idle).await;
        let after = g.sample();
        let drain_s = (last_us.saturating_sub(t0_us)) as f64 / 1e6;
        let drain_eps = delivered as f64 / drain_s.max(1e-9);
        println!(
            "  drain: {delivered} events in {:.2} s = {:.0} ev/s ({:.2} × raw); RSS after drain {}, peak {}; CPU {:.2} s",
            drain_s,
            drain_eps,
            drain_eps / self.raw1,
            mb(after.rss),
            mb(after.hwm),
            after.cpu_s - before.cpu_s
        );
        if t0.elapsed() > Duration::from_secs(590) {
            println!("  (drain stopped at its 600 s deadline)");
        }
        self.extras.push((
            "(e) RSS with the backlog".into(),
            format!("{} ({} events queued)", mb(rss_backlog), n),
        ));
        self.extras.push((
            "(e) restart to serving with the backlog".into(),
            format!("{:.0} ms ({restored} events restored)", ms(g.startup)),
        ));
        self.rows.push(Row {
            name: "e: drain 1M backlog".into(),
            publish_eps: fill.accepted as f64 / fill.elapsed.as_secs_f64().max(1e-9),
            delivered_eps: drain_eps,
            lat: None,
            peak_rss: after.hwm.max(queued.hwm),
            cpu_s: after.cpu_s - before.cpu_s,
            disk_per_event: Some(disk as f64 / n as f64),
            accepted: n,
            delivered,
            log_lines: None,
            bench_cpu_s: 0.0,
            paired: None,
            note,
        });
        Ok(())
    }

    /// Queue `n` events (batches of 100) while the subscriber is stalled.
    async fn fill(&self, g: &Gridlet, n: u64) -> Published {
        let load = Load {
            conns: self.opts.conns,
            batch: 100,
            duration: Duration::from_secs(300),
            max_events: n,
            rate: None,
            path: publish_path(),
        };
        net::publish(g.addr, &load, self.base).await
    }

    async fn footprint(&mut self) -> Result<(), String> {
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
        Ok(())
    }

    /// A short unmeasured run so connections and pools exist before measuring.
    async fn warm_up(
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

    async fn measure(
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
        Row {
            name: name.to_string(),
            publish_eps: p.accepted as f64 / p.elapsed.as_secs_f64().max(1e-9),
            delivered_eps: delivered as f64 / span.max(1e-9),
            lat,
            peak_rss: fp1.hwm,
            cpu_s: fp1.cpu_s - fp0.cpu_s,
            disk_per_event: (g.is_some() && queued_at_end >= 1000)
                .then(|| disk as f64 / queued_at_end as f64),
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
    async fn paired(
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

    fn print_row(&self, r: &Row, title: &str) {
        println!("\n== {} — {title} ==", r.name);
        let ratio = |v: f64| format!("{:.2} × raw", v / self.raw1);
        println!(
            "  publish events/s      {:>12.0}   {}",
            r.publish_eps,
            ratio(r.publish_eps)
        );
        println!(
            "  delivered events/s    {:>12.0}   {}",
            r.delivered_eps,
            ratio(r.delivered_eps)
        );
        println!(
            "  events published/delivered  {} / {}",
            r.accepted, r.delivered
        );
        if let Some((p50, p99, max)) = r.lat {
            println!(
                "  latency p50/p99/max   {:.2} / {:.2} / {:.2} ms",
                p50 as f64 / 1e3,
                p99 as f64 / 1e3,
                max as f64 / 1e3
            );
        }
        if r.peak_rss > 0 {
            println!("  gridlet peak RSS      {}", mb(r.peak_rss));
            println!(
                "  gridlet CPU           {:.2} s = {:.1} µs per delivered event",
                r.cpu_s,
                per_event_us(r.cpu_s, r.delivered)
            );
        }
        if r.bench_cpu_s > 0.0 {
            println!(
                "  bench CPU             {:.2} s = {:.1} µs per delivered event (publisher + receiver)",
                r.bench_cpu_s,
                per_event_us(r.bench_cpu_s, r.delivered)
            );
        }
        if let Some(d) = r.disk_per_event {
            println!("  disk per queued event {d:.0} bytes");
        }
        if let Some(n) = r.log_lines {
            println!("  gridlet log lines     {n} during the run (RUST_LOG=info)");
        }
        if let Some(p) = &r.paired {
            println!(
                "  paired with the limit {:.2} × raw: {} rounds of {:.1} s alternating with raw batch 1 (rounds {:.2}–{:.2}; raw slices {:.0}–{:.0} events/s)",
                p.raw,
                p.rounds,
                self.opts.slice.as_secs_f64(),
                p.raw_spread.0,
                p.raw_spread.1,
                p.raw_eps.0,
                p.raw_eps.1
            );
            if let Some((d, (lo, hi))) = p.durable {
                println!("  paired with raw durable {d:.2} × raw durable (rounds {lo:.2}–{hi:.2})");
            }
        }
        if !r.note.is_empty() {
            println!("  note: {}", r.note.trim());
        }
    }

    fn summary(&self) {
        println!("\n== summary (markdown) ==\n");
        println!("| run | publish ev/s | × raw | delivered ev/s | × raw | × raw, paired (rounds) | p50 ms | p99 ms | max ms | gridlet peak RSS | gridlet CPU s | gridlet CPU µs/event | bench CPU µs/event | disk B/queued event | note |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &self.rows {
            let (p50, p99, max) = match r.lat {
                Some((a, b, c)) => (
                    format!("{:.2}", a as f64 / 1e3),
                    format!("{:.2}", b as f64 / 1e3),
                    format!("{:.2}", c as f64 / 1e3),
                ),
                None => ("–".into(), "–".into(), "–".into()),
            };
            println!(
                "| {} | {:.0} | {:.2} | {:.0} | {:.2} | {} | {p50} | {p99} | {max} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.publish_eps,
                r.publish_eps / self.raw1,
                r.delivered_eps,
                r.delivered_eps / self.raw1,
                r.paired.as_ref().map_or("–".into(), |p| format!(
                    "{:.2} ({:.2}–{:.2})",
                    p.raw, p.raw_spread.0, p.raw_spread.1
                )),
                if r.peak_rss > 0 { mb(r.peak_rss) } else { "–".into() },
                if r.peak_rss > 0 { format!("{:.2}", r.cpu_s) } else { "–".into() },
                if r.peak_rss > 0 {
                    format!("{:.1}", per_event_us(r.cpu_s, r.delivered))
                } else {
                    "–".into()
                },
                if r.bench_cpu_s > 0.0 {
                    format!("{:.1}", per_event_us(r.bench_cpu_s, r.delivered))
                } else {
                    "–".into()
                },
                r.disk_per_event
                    .map(|d| format!("{d:.0}"))
                    .unwrap_or("–".into()),
                r.note.trim()
            );
        }
        if !self.extras.is_empty() {
            println!("\n| measure | value |\n|---|---|");
            for (k, v) in &self.extras {
                println!("| {k} | {v} |");
            }
        }
    }
}

/// Wait until the receiver counted `expected` events, no progress for `idle`, or `cap`.
async fn wait_delivered(rx: &Receiver, expected: u64, cap: Duration, idle: Duration) -> (u64, u64) {
    let deadline = Instant::now() + cap;
    let mut last_seen = rx.stats.events.load(Relaxed);
    let mut last_progress = Instant::now();
    loop {
        let n = rx.stats.events.load(Relaxed);
        if n >= expected || Instant::now() > deadline {
            break;
        }
        if n != last_seen {
            last_seen = n;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > idle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (
        rx.stats.events.load(Relaxed),
        rx.stats.last_us.load(Relaxed),
    )
}

fn publish_path() -> String {
    format!("/topics/{TOPIC}/events?{API}")
}

/// Create the topic and `subs` webhook subscriptions to the receiver.
async fn setup(
    g: &Gridlet,
    subs: usize,
    rx: &Receiver,
    max_events_per_batch: Option<u32>,
) -> Result<(), String> {
    let (s, b) = net::request(g.addr, "PUT", &format!("/topics/{TOPIC}?{API}"), "{}").await?;
    if s != 200 {
        return Err(format!("create topic: HTTP {s}: {b}"));
    }
    for i in 0..subs {
        let mut props = serde_json::json!({"endpointUrl": rx.url(&format!("/s{i}"))});
        if let (Some(n), Some(p)) = (max_events_per_batch, props.as_object_mut()) {
            p.insert("maxEventsPerBatch".into(), n.into());
        }
        let body = serde_json::json!({"properties": {"destination": {
            "endpointType": "WebHook", "properties": props}}});
        let (s, b) = net::request(
            g.addr,
            "PUT",
            &format!("/topics/{TOPIC}/eventSubscriptions/s{i}?{API}"),
            &body.to_string(),
        )
        .await?;
        if s != 200 {
            return Err(format!("create subscription: HTTP {s}: {b}"));
        }
    }
    Ok(())
}

/// gridlet's `/metrics` text.
async fn metrics_text(g: &Gridlet) -> Option<String> {
    let (s, text) = net::request(g.addr, "GET", &format!("/metrics?{API}"), "")
        .await
        .ok()?;
    (s == 200).then_some(text)
}

/// A metric without labels.
async fn metric(g: &Gridlet, name: &str) -> Option<u64> {
    metrics_text(g)
        .await?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// `gridlet_pending_events` summed over subscriptions, from `/metrics`.
async fn pending_events(g: &Gridlet) -> Option<u64> {
    labelled_sum(g, "gridlet_pending_events{").await
}

/// The sum of every series whose line starts with `prefix` (a family name and its `{`).
async fn labelled_sum(g: &Gridlet, prefix: &str) -> Option<u64> {
    Some(
        metrics_text(g)
            .await?
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
            .sum(),
    )
}

fn per_event_us(cpu_s: f64, events: u64) -> f64 {
    cpu_s * 1e6 / events.max(1) as f64
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / (1024.0 * 1024.0))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown CPU");
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    format!(
        "{cores} CPUs, {model}, {:.1} GiB RAM",
        mem_kb as f64 / (1024.0 * 1024.0)
    )
}
