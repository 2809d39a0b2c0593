//! `gridlet-bench`: gridlet measured against the physical limit of the machine it runs on.
//!
//! ```text
//! cargo run --release --bin gridlet-bench -- [--scenario a|b|c|d|e|store|footprint|azure|mqtt|outage|all] [--quick]
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
//! * store: what the event store writes and holds per payload byte, measured from outside
//!   (`/proc/<pid>/io`, `du`), beside NATS JetStream's file store doing the same work
//!   ([`store_cost`], [`nats`]);
//! * footprint: release binary size, idle RSS, start-up to serving;
//! * crashsim: the log store's power-cut simulation over many seeds ([`crashsim`]);
//! * pull (opt-in, not in `all`): pull delivery's receive + acknowledge throughput (batches of 1
//!   and 100) against the same client loop on a canned server, and RSS with 1,000,000 events
//!   waiting in a queue subscription ([`pull`]);
//! * azure (opt-in, not in `all`): delivery to a Storage queue in Azurite beside webhook
//!   delivery, with the raw Azurite limit ([`azure`]);
//! * mqtt (opt-in, not in `all`): HTTP publish → gridlet → MQTT destination → a subscriber on
//!   Mosquitto, beside a raw MQTT publisher feeding the same subscriber ([`mqtt`]); then MQTT →
//!   gridlet's MQTT source → webhook against a raw MQTT → HTTP forwarder, and the QoS 1
//!   persisted path against the raw durable limit, in alternating slices ([`mqtt_in`]);
//! * letters (opt-in, not in `all`): the pinned row of `store` run twice, the one-in-50
//!   subscription's events kept pending (as dead letters kept as records of the event log would
//!   hold their segments) and dead-lettered into the dead-letter log ([`pinned`]);
//! * outage (opt-in, not in `all`): persisted events behind an uplink that is down, then
//!   returns: time to the first and last delivery, drain rate, RSS and disk, duplicates
//!   ([`outage`]).
//!
//! `--otlp ok|500|slow|dead` runs every scenario with OpenTelemetry export on, to a collector
//! sink inside the bench ([`otlp`]): the cost of tracing, and a dead, slow or failing collector.
//!
//! The bench never hangs: every phase has a deadline, a watchdog kills everything after
//! `--max-seconds`, and every gridlet child is killed on exit (also on panic).

// The bench drives the broker from outside: the system's wall time is its own to read
// (clippy.toml keeps it out of the broker, behind the clock seam).
#![allow(clippy::disallowed_methods)]
#![forbid(unsafe_code)]

mod azure;
mod backlog;
mod child;
mod crashsim;
mod mqtt;
mod mqtt_in;
mod nats;
mod net;
mod opts;
mod otlp;
mod outage;
mod pinned;
mod pull;
mod report;
mod store_cost;
mod throughput;

use bytes::Bytes;
use child::{Footprint, Gridlet, Spec};
use net::{Load, Mode, Published, Receiver};
use opts::{parse_args, Opts};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const API: &str = "api-version=2019-01-01-preview";
const TOPIC: &str = "bench";

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
    /// The kernel's part of `cpu_s` (0 where the scenario does not split it).
    sys_s: f64,
    /// gridlet's context switches during the run.
    switches: u64,
    disk_per_event: Option<f64>,
    /// Bytes the data disk's device wrote during the run (metadata included; `None`: not a
    /// block device).
    device_written: Option<u64>,
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
    /// Figures by scenario, in numbers, for `--json` (`"footprint": {"binary_bytes": …}`).
    figures: serde_json::Map<String, serde_json::Value>,
    /// `/proc/loadavg` when the run started: how busy the machine was.
    load: String,
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
    let sink = match opts.otlp {
        Some(mode) => {
            let s = otlp::Sink::start(mode)
                .await
                .map_err(|e| format!("otlp sink: {e}"))?;
            println!(
                "otlp: export on, to the bench's sink at {} ({})",
                s.endpoint,
                mode.as_str()
            );
            child::set_otlp_endpoint(s.endpoint.clone());
            Some(s)
        }
        None => None,
    };
    let root = std::env::temp_dir().join(format!("gridlet-bench-{}", std::process::id()));
    let mut b = Bench {
        opts,
        base: Instant::now(),
        bin,
        root: root.clone(),
        rows: Vec::new(),
        raw1: 0.0,
        extras: Vec::new(),
        figures: serde_json::Map::new(),
        load: std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    let res = b.all().await;
    let _ = std::fs::remove_dir_all(&root);
    if let Some(s) = sink {
        println!("{}", s.summary());
    }
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
        let o = self.opts.clone();
        // The raw limits are what throughput is measured against; `store` and `footprint` alone
        // need none.
        if ["a", "b", "c", "d", "e", "azure", "all"]
            .iter()
            .any(|s| o.scenarios.iter().any(|x| x == s))
        {
            self.raw().await?;
        }
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
        if wants(&o, "store") {
            self.scenario_store().await?;
        }
        if wants(&o, "footprint") {
            self.footprint().await?;
        }
        if wants(&o, "crashsim") {
            let seeds = o.sim_seeds.unwrap_or(if o.quick { 2_000 } else { 50_000 });
            crashsim::run(o.sim_first_seed, seeds, o.sim_damage)?;
        }
        // Opt-in: a million events to publish, so `all` leaves it out.
        if o.scenarios.iter().any(|s| s == "pull") {
            self.scenario_pull().await?;
        }
        // Opt-in: where dead letters live, measured (two runs of the pinned row).
        if o.scenarios.iter().any(|s| s == "letters") {
            self.scenario_letters().await?;
        }
        // Opt-in: needs Azurite, so `all` leaves it out.
        if o.scenarios.iter().any(|s| s == "azure") {
            self.scenario_azure().await?;
        }
        // Opt-in: needs Mosquitto, so `all` leaves it out.
        if o.scenarios.iter().any(|s| s == "mqtt") {
            self.scenario_mqtt().await?;
        }
        // Opt-in: a large persisted backlog and an outage of seconds.
        if o.scenarios.iter().any(|s| s == "outage") {
            self.scenario_outage().await?;
        }
        self.summary();
        if let Some(path) = &o.json {
            let text = serde_json::to_string_pretty(&self.json()).map_err(|e| e.to_string())?;
            std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
            println!("figures written to {}", path.display());
        }
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
            (
                "persistence__maxDiskBytes".into(),
                self.opts.max_disk_bytes.to_string(),
            ),
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
            event_bytes: net::EVENT_BYTES,
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

pub(crate) fn machine() -> String {
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
