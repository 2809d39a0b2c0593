//! The bench's command line.

use super::net::Mode;
use std::path::PathBuf;
use std::time::Duration;

/// Command-line options.
#[derive(Debug, Clone)]
pub(super) struct Opts {
    pub(super) scenarios: Vec<String>,
    pub(super) quick: bool,
    pub(super) duration: Duration,
    pub(super) paced: Duration,
    pub(super) conns: usize,
    pub(super) backlog: u64,
    pub(super) gridlet: Option<PathBuf>,
    pub(super) max_seconds: u64,
    /// `persistence__maxDiskBytes` of every gridlet the bench starts (default 16 GiB), unless
    /// a scenario sets its own.
    pub(super) max_disk_bytes: u64,
    /// How the subscriber is down in (e).
    pub(super) down: Mode,
    /// (e) with persisted subscriptions (default) or in-memory ones.
    pub(super) e_persisted: bool,
    /// Scenario e restarts with SIGKILL (a crash) instead of SIGTERM.
    pub(super) e_kill: bool,
    /// Paired rounds per throughput scenario (0 = none): see [`Bench::paired`].
    pub(super) rounds: u32,
    /// Length of each slice of a paired round.
    pub(super) slice: Duration,
    /// Scenario `store`: persisted 1 KB events published and drained (rows 1–4); the fan-out
    /// and dead-letter rows scale with it up to the sizes.
    pub(super) store_events: u64,
    /// Scenario `store`: the new store's segment size, to judge "≤ 2 segments after a drain".
    pub(super) segment_bytes: Option<u64>,
    /// Scenario `store`: the `nats-server` binary (default: found on the PATH or in /usr/sbin).
    pub(super) nats: Option<PathBuf>,
    /// Scenario `store`: leave the NATS peer out.
    pub(super) no_peer: bool,
    /// Scenario `store`: how long disk is watched after a drain, and the longest wait for a
    /// store's deferred writes to stop (default 10 s; the smoke test shortens it).
    pub(super) store_watch: Duration,
    /// Scenario `crashsim`: seeds to run (default 50,000; quick 2,000) and the first one.
    pub(super) sim_seeds: Option<u64>,
    pub(super) sim_first_seed: u64,
    /// Scenario `crashsim`: damage faults in synced data too (`--damage`).
    pub(super) sim_damage: bool,
    /// `--otlp MODE`: run every gridlet with OpenTelemetry export to the bench's own sink.
    pub(super) otlp: Option<super::otlp::Mode>,
    /// `--json PATH`: the run's figures, machine and date as JSON (`report::json`), for
    /// `scripts/update-figures.py`.
    pub(super) json: Option<PathBuf>,
    /// Scenario `mqtt`: messages per slice (default 20,000; quick 2,000).
    pub(super) mqtt_messages: Option<u64>,
    /// Scenario `mqtt`: the receive maximum of gridlet's source connection and of the raw
    /// forwarder (default 100, gridlet's own default).
    pub(super) mqtt_receive_maximum: u16,
    /// Scenario `outage`: persisted events published while the uplink is down (default
    /// 1,000,000; quick 20,000).
    pub(super) outage_events: Option<u64>,
    /// Scenario `outage`: how the uplink is down.
    pub(super) outage_down: super::outage::Down,
    /// Scenario `outage`: how long it stays down after the last publish.
    pub(super) outage_seconds: Duration,
    /// Scenario `outage`: gridlet's `outbound__outageProbeSeconds`.
    pub(super) probe_seconds: u32,
    /// Scenario `outage`: restart gridlet in the middle of the outage (`Some(true)`: SIGKILL,
    /// `Some(false)`: SIGTERM).
    pub(super) outage_restart: Option<bool>,
}

const USAGE: &str =
    "usage: gridlet-bench [--scenario a|b|c|d|e|store|footprint|crashsim|azure|mqtt|outage|pull|letters|all (comma list ok)] [--quick]
                     [--duration SECS] [--paced-seconds SECS] [--conns N] [--backlog EVENTS]
                     [--down stall|refuse] [--e-in-memory] [--e-kill] [--max-disk-bytes BYTES]
                     [--gridlet PATH] [--max-seconds SECS]
                     [--rounds N] [--slice SECS]
                     [--store-events N] [--store-watch SECS] [--segment-bytes BYTES]
                     [--nats PATH] [--no-peer] [--seeds N] [--first-seed N] [--damage]
                     [--otlp ok|500|slow|dead] [--json PATH] [--mqtt-messages N] [--mqtt-receive-maximum N]
                     [--outage-events N] [--outage-down refuse|503] [--outage-seconds SECS]
                     [--probe-seconds N] [--outage-restart term|kill]

--rounds N (default 4, 0 = off) and --slice SECS (default 2): after its main run, each throughput
scenario (a, b, c, d) runs N rounds that alternate a SECS slice of the raw batch-1 limit with a
SECS slice of the scenario (and, in d, of the raw durable limit), and prints its ratio to the
limit measured seconds apart: the machine's drift moves both sides of that ratio alike.

--down (scenario e): stall = the subscriber accepts requests and answers nothing until it comes
back (the backlog waits in the ready lane); refuse = it answers 503 (every event takes the
1-minute retry lane, so the drain waits for the retry schedule).
--e-in-memory: scenario e with in-memory subscriptions (default: persisted, so the backlog can
survive the restart).
--e-kill: scenario e restarts gridlet with SIGKILL (a crash: it reads the frames since its last
checkpoint) instead of SIGTERM (a clean stop leaves a checkpoint of everything).
--max-disk-bytes BYTES (default 17179869184, 16 GiB): persistence__maxDiskBytes of every gridlet
started. --backlog is capped by it: 256-byte events take about 317 bytes each on disk, so 16 GiB
stops (e) near 51.6 M; a 100 M backlog needs about 32 GB (e.g. --backlog 100000000
--max-disk-bytes 40000000000 --max-seconds 3600, on a disk with that much free).
--store-events N (scenario store, default 100000, quick 20000): persisted 1 KB events published
behind a stalled subscriber, then drained; the fan-out (2,000 x 4 KB) and dead-letter (80 x 900 KB)
rows scale down below 20000. --store-watch SECS (default 10): how long disk is watched after
the drain, and the longest wait for deferred writes to stop after a phase. --segment-bytes: the store's segment size, to judge the after-drain
row. --nats PATH: the nats-server binary of the peer (default: PATH, /usr/sbin); --no-peer: skip it.
--seeds N (scenario crashsim, default 50000, quick 2000) and --first-seed N (default 0): the event
log's power-cut simulation over seeds N.. (every seed runs; each failing one prints the call
that reproduces it). --damage: the seeds also damage synced data between a cut and the next open
(a flipped bit, a zeroed or lost sector, a stale block, a damaged header, a missing segment); it
prints the faults made, the opens that reported damage, the events lost and reported, and the
failing seeds (a silent loss fails its seed: must be 0).
--otlp MODE: every gridlet exports traces and metrics (OTEL_EXPORTER_OTLP_ENDPOINT) to a sink in
the bench that reads each export and answers without decoding it: ok = 200, 500 = refused,
slow = answered after 30 s (past gridlet's export timeout), dead = nothing listens. The sampler
and other OTEL_* variables of the bench's environment reach gridlet as they are (e.g.
OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01).
--json PATH: also write the run as JSON (date, machine, load, each scenario's figures and rows);
scripts/update-figures.py writes the README's and docs' figures from it.
--mqtt-messages N (scenario mqtt, default 20000, quick 2000): QoS 1 messages per slice of the
source rows (MQTT -> webhook against a raw MQTT -> HTTP forwarder; QoS 1 persisted against the
raw durable limit) and of the destination row. --mqtt-receive-maximum N (default 100, gridlet's
default): the receive maximum of gridlet's source connection and of the raw forwarder.
--outage-events N (scenario outage, default 1000000, quick 20000):
persisted events published while the uplink (a webhook receiver) is down; --outage-down refuse
(nothing listens: connection refused, the default) or 503 (503 without Retry-After);
--outage-seconds SECS (default 5): how long it stays down after the last publish;
--probe-seconds N (default 1): gridlet's outbound__outageProbeSeconds. --outage-restart term|kill:
restart gridlet (SIGTERM, or SIGKILL: a crash) halfway through the time it stays down.";

pub(super) fn parse_args() -> Result<Opts, String> {
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
        max_disk_bytes: 16 << 30,
        down: Mode::Stall,
        e_persisted: true,
        e_kill: false,
        rounds: if quick { 1 } else { 4 },
        slice: Duration::from_secs_f64(if quick { 0.3 } else { 2.0 }),
        store_events: if quick { 20_000 } else { 100_000 },
        // The store's default (the bench's bound is large enough not to shrink it).
        segment_bytes: Some(gridlet::store::log::SEGMENT_BYTES),
        nats: None,
        no_peer: false,
        store_watch: Duration::from_secs(10),
        sim_seeds: None,
        sim_first_seed: 0,
        sim_damage: false,
        otlp: None,
        json: None,
        mqtt_messages: None,
        mqtt_receive_maximum: 100,
        outage_events: None,
        outage_down: super::outage::Down::Refused,
        outage_seconds: Duration::from_secs(5),
        probe_seconds: 1,
        outage_restart: None,
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
            "--e-kill" => o.e_kill = true,
            "--max-disk-bytes" => {
                o.max_disk_bytes = val()?
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1 << 20)
                    .ok_or("--max-disk-bytes: at least 1048576")?
            }
            "--rounds" => {
                o.rounds = val()?
                    .parse()
                    .ok()
                    .filter(|n| *n <= 100)
                    .ok_or("--rounds: 0..=100")?
            }
            "--slice" => o.slice = secs(val()?)?,
            "--gridlet" => o.gridlet = Some(PathBuf::from(val()?)),
            "--store-events" => {
                o.store_events = val()?
                    .parse()
                    .ok()
                    .filter(|n| (100..=10_000_000).contains(n) && n % 100 == 0)
                    .ok_or("--store-events: a multiple of 100 in 100..=10000000")?
            }
            "--segment-bytes" => {
                o.segment_bytes = Some(
                    val()?
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or("--segment-bytes: a positive number")?,
                )
            }
            "--nats" => o.nats = Some(PathBuf::from(val()?)),
            "--no-peer" => o.no_peer = true,
            "--store-watch" => o.store_watch = secs(val()?)?,
            "--seeds" => {
                o.sim_seeds = Some(val()?.parse().map_err(|_| "--seeds: a number")?);
            }
            "--first-seed" => {
                o.sim_first_seed = val()?.parse().map_err(|_| "--first-seed: a number")?;
            }
            "--damage" => o.sim_damage = true,
            "--otlp" => {
                o.otlp =
                    Some(super::otlp::Mode::parse(&val()?).ok_or("--otlp: ok, 500, slow or dead")?);
            }
            "--json" => o.json = Some(PathBuf::from(val()?)),
            "--mqtt-messages" => {
                o.mqtt_messages = Some(
                    val()?
                        .parse()
                        .ok()
                        .filter(|n| (1..=100_000_000).contains(n))
                        .ok_or("--mqtt-messages: 1..=100000000")?,
                )
            }
            "--mqtt-receive-maximum" => {
                o.mqtt_receive_maximum = val()?
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or("--mqtt-receive-maximum: 1..=65535")?
            }
            "--outage-events" => {
                o.outage_events = Some(
                    val()?
                        .parse()
                        .ok()
                        .filter(|n| (1..=100_000_000).contains(n))
                        .ok_or("--outage-events: 1..=100000000")?,
                )
            }
            "--outage-down" => {
                o.outage_down = match val()?.as_str() {
                    "refuse" => super::outage::Down::Refused,
                    "503" => super::outage::Down::Unavailable,
                    _ => return Err("--outage-down: refuse or 503".into()),
                }
            }
            "--outage-seconds" => o.outage_seconds = secs(val()?)?,
            "--outage-restart" => {
                o.outage_restart = match val()?.as_str() {
                    "term" => Some(false),
                    "kill" => Some(true),
                    _ => return Err("--outage-restart: term or kill".into()),
                }
            }
            "--probe-seconds" => {
                o.probe_seconds = val()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=86_400).contains(n))
                    .ok_or("--probe-seconds: 1..=86400")?
            }
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
    let known = [
        "a",
        "b",
        "c",
        "d",
        "e",
        "store",
        "footprint",
        "crashsim",
        "azure",
        "mqtt",
        "outage",
        "pull",
        "letters",
        "all",
    ];
    if let Some(bad) = o.scenarios.iter().find(|s| !known.contains(&s.as_str())) {
        return Err(format!("unknown scenario {bad}\n{USAGE}"));
    }
    Ok(o)
}
