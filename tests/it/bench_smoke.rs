//! The bench command still starts, finishes and measures: every scenario on a tiny load, debug
//! builds. The numbers are checked, not their labels: each scenario published and delivered
//! something, fan-out delivered every copy, the paired ratios exist, the restart restored the
//! whole backlog, the footprint lines carry values.

use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn bench_command_runs_every_scenario_on_a_tiny_load() {
    let json_dir = tempfile::tempdir().unwrap();
    let json = json_dir.path().join("run.json");
    let (stdout, run) = run_bench(
        &[
            "--quick",
            "--scenario",
            "all",
            "--duration",
            "0.3",
            "--paced-seconds",
            "0.3",
            "--backlog",
            "2000",
            "--conns",
            "2",
            "--store-events",
            "500",
            "--store-watch",
            "0.5",
            "--seeds",
            "20",
            "--max-seconds",
            "90",
        ],
        &json,
    );
    // `--json`: what scripts/update-figures.py reads (docs/bench-run.json is one such run).
    assert_eq!(run["build"], "debug");
    assert!(
        run["date"].as_str().is_some_and(|d| d.starts_with("20")),
        "{run}"
    );
    let fp = &run["scenarios"]["footprint"];
    for k in [
        "binary_bytes",
        "idle_rss_bytes",
        "start_ms_median",
        "first_start_ms",
    ] {
        assert!(
            fp[k].as_f64().is_some_and(|v| v > 0.0),
            "footprint {k}: {run}"
        );
    }
    let rows = run["rows"].as_array().expect("rows");
    assert!(
        rows.iter()
            .any(|r| r["delivered_eps"].as_f64().is_some_and(|v| v > 0.0)),
        "{run}"
    );
    let rows = summary_rows(&stdout);
    let row = |prefix: &str| -> &Vec<String> {
        rows.iter()
            .find(|r| r[0].starts_with(prefix))
            .unwrap_or_else(|| panic!("no summary row {prefix:?} in:\n{stdout}"))
    };
    // Columns: run | publish ev/s | × raw | delivered ev/s | × raw | × raw, paired | ...
    for prefix in [
        "raw batch 1",
        "raw batch 100",
        "a: 1 sub",
        "b: batch 100",
        "c: fan-out 10",
        "d: persisted",
        "e: drain",
    ] {
        let r = row(prefix);
        let published = number(&r[1]);
        let delivered = number(&r[3]);
        assert!(
            published > 0.0 && delivered > 0.0,
            "{prefix}: nothing measured: {r:?}"
        );
        if prefix.starts_with("c:") {
            // Delivered counts every subscription's copy: about ten per published event.
            assert!(
                delivered > 5.0 * published,
                "fan-out delivered too few copies: {r:?}"
            );
        }
        if ["a:", "b:", "c:", "d:"]
            .iter()
            .any(|p| prefix.starts_with(p))
        {
            // A paired ratio was measured (a number, not `–`). Its size is the machine's: on
            // a tiny load a loaded machine may deliver next to nothing in a slice (0.00).
            let paired = number(&r[5]);
            assert!(paired >= 0.0, "{prefix}: no paired ratio: {r:?}");
        }
    }
    // The store scenario measured what gridlet wrote and held (whatever the peer did).
    for prefix in [
        "store: written per payload byte, publish",
        "store: disk per queued payload byte",
        "store: disk per payload byte, 20 persisted subscriptions",
        "store: dead letters",
    ] {
        let r = row(prefix);
        let gridlet = r[1]
            .strip_prefix("gridlet ")
            .map(number)
            .unwrap_or(f64::NAN);
        assert!(gridlet > 0.0, "{prefix}: nothing measured: {r:?}");
    }
    let line = |needle: &str| -> &str {
        stdout
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("missing {needle:?} in:\n{stdout}"))
    };
    assert!(
        line("backlog restored:").contains("backlog restored: 2000 events"),
        "the restart must restore the whole persisted backlog:\n{stdout}"
    );
    assert!(
        line("== crashsim").contains("crashsim")
            && line("power cuts survived").contains("seeds 0..20"),
        "the power-cut simulation ran:\n{stdout}"
    );
    for needle in [
        "release binary size",
        "idle RSS (no topics",
        "start-up to serving /healthz, later starts",
    ] {
        let l = line(needle);
        let value = l.split_whitespace().find_map(|w| w.parse::<f64>().ok());
        assert!(value.is_some_and(|v| v > 0.0), "no measured value in {l:?}");
    }
}

/// Scenario `mqtt` (its source rows: MQTT → webhook beside a raw forwarder, QoS 1 persisted
/// beside the raw durable limit) and scenario `outage` on a tiny load, with gridlet SIGKILLed in
/// the middle of the outage. Counts are checked, not speeds: every slice delivered every
/// message; the outage's backlog survived the crash and arrived whole and once (nothing was
/// delivered before the crash, so nothing may come twice) after the link returned; disk and
/// RSS were sampled while it was down.
#[test]
fn bench_mqtt_and_outage_scenarios_run_on_a_tiny_load() {
    // The bench skips `mqtt` without Mosquitto; the tests use the real broker (scripts/test.sh
    // installs it), so say what is missing instead of failing on an absent figure.
    assert!(
        [
            "/usr/sbin/mosquitto",
            "/usr/bin/mosquitto",
            "/usr/local/sbin/mosquitto"
        ]
        .iter()
        .any(|p| std::path::Path::new(p).exists()),
        "mosquitto is not installed: `sudo apt-get install -y mosquitto` (scripts/test.sh does)"
    );
    let json_dir = tempfile::tempdir().unwrap();
    let json = json_dir.path().join("run.json");
    let (stdout, run) = run_bench(
        &[
            "--quick",
            "--scenario",
            "mqtt,outage",
            "--mqtt-messages",
            "200",
            "--rounds",
            "1",
            "--slice",
            "0.3",
            "--conns",
            "2",
            "--outage-events",
            "2000",
            "--outage-seconds",
            "0.5",
            "--probe-seconds",
            "1",
            "--outage-restart",
            "kill",
            "--max-seconds",
            "90",
        ],
        &json,
    );
    let positive = |v: &serde_json::Value, k: &str| {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}\n{stdout}");
    };
    let mqtt = &run["scenarios"]["mqtt"];
    positive(&mqtt["destination"], "gridlet_eps");
    let source = &mqtt["source"];
    for k in [
        "raw_forwarder_eps",
        "gridlet_eps",
        "ratio",
        "persisted_eps",
        "raw_durable_eps",
        "persisted_ratio",
    ] {
        positive(source, k);
    }
    let outage = &run["scenarios"]["outage"];
    assert_eq!(outage["events"], 2000, "{outage}");
    assert_eq!(outage["restart"], "SIGKILL", "{outage}");
    assert_eq!(
        outage["delivered"], 2000,
        "every event after the return: {outage}"
    );
    assert_eq!(
        outage["duplicates"], 0,
        "no crash, no second copy: {outage}"
    );
    for k in [
        "first_delivery_s",
        "last_delivery_s",
        "drain_eps",
        "outage_peak_rss_bytes",
        "outage_peak_disk_bytes",
    ] {
        positive(outage, k);
    }
    assert!(
        outage["first_delivery_s"].as_f64() <= outage["last_delivery_s"].as_f64(),
        "{outage}"
    );
    let rows = summary_rows(&stdout);
    for prefix in [
        "mqtt in: MQTT → gridlet → webhook",
        "mqtt in: QoS 1 persisted",
        "outage:",
    ] {
        assert!(
            rows.iter().any(|r| r[0].starts_with(prefix)),
            "no summary row {prefix:?} in:\n{stdout}"
        );
    }
}

/// Run the bench (debug build, this build's gridlet) with `args` and `--json json`; it must
/// finish within 120 s and succeed. Its stdout and the JSON it wrote.
fn run_bench(args: &[&str], json: &std::path::Path) -> (String, serde_json::Value) {
    let child = Command::new(env!("CARGO_BIN_EXE_gridlet-bench"))
        .args(args)
        .args(["--gridlet", env!("CARGO_BIN_EXE_gridlet"), "--json"])
        .arg(json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bench starts");
    // Read the output on another thread so a full pipe can never stall the bench.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("bench output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("gridlet-bench did not finish within 120 s");
        }
    };
    let status = out.status;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.success(),
        "bench failed: {status}\n{stdout}\n{stderr}"
    );
    let run = serde_json::from_str(&std::fs::read_to_string(json).expect("--json wrote its file"))
        .expect("JSON");
    (stdout, run)
}

/// The cells of each body row of the bench's markdown summary tables.
fn summary_rows(stdout: &str) -> Vec<Vec<String>> {
    let summary = stdout
        .split("== summary (markdown) ==")
        .nth(1)
        .unwrap_or("");
    summary
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| run ") && !l.starts_with("| measure "))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The leading number of a cell ("0.23 (0.23–0.23)" → 0.23); NaN when there is none.
fn number(cell: &str) -> f64 {
    cell.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::NAN)
}
