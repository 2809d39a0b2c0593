//! The bench command still starts and finishes: every scenario on a tiny load, debug builds.

use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn bench_command_runs_every_scenario_on_a_tiny_load() {
    let child = Command::new(env!("CARGO_BIN_EXE_gridlet-bench"))
        .args([
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
            "--max-seconds",
            "90",
            "--gridlet",
            env!("CARGO_BIN_EXE_gridlet"),
        ])
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.success(),
        "bench failed: {status}\n{stdout}\n{stderr}"
    );
    for needle in [
        "raw batch 1",
        "a: 1 sub, batch 1",
        "b: batch 100 / 50",
        "c: fan-out 10",
        "d: persisted",
        "paired with the limit",
        "paired with raw durable",
        "e: drain",
        "release binary size",
        "summary",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
}
