//! Scenario `crashsim`: the log store's power-cut simulation (`gridlet::store::log::sim`) over
//! many more seeds than the suite runs (2,000 there). Each seed drives the store as shipped
//! (`LogStore`, its rounds run by the same executor as the committer thread, its metadata and
//! dead letters on the same simulated disk) through three rounds, each ended by a power cut at
//! a seeded step, and checks after every cut that no acknowledged event is lost, nothing is
//! invented, no committed settlement is undone, a dead-lettered event is pending or a letter,
//! and a deleted subscription is gone with its events. With `--damage`, the rounds also damage
//! synced data (`sim::damage`), and an acknowledged event may be missing only when the open
//! reported the loss. Every seed runs; the failing ones are printed with the call that
//! reproduces each.

use std::time::Instant;

/// Operations per round of a seed (the suite uses 40).
const OPS: usize = 60;

/// Failing seeds printed in full (all are counted).
const SHOWN: usize = 10;

/// Run `seeds` seeds from `first`, with damage faults when `damage` is set; prints the totals.
/// `Err` names the failing seeds.
pub fn run(first: u64, seeds: u64, damage: bool) -> Result<(), String> {
    let t = Instant::now();
    let mut total = gridlet::store::log::sim::Outcome::default();
    let mut failed: Vec<(u64, String)> = Vec::new();
    for seed in first..first + seeds {
        match gridlet::store::log::sim::run_seed_with(seed, OPS, damage) {
            Ok(o) => {
                total.cuts += o.cuts;
                total.checked += o.checked;
                total.published += o.published;
                total.steps += o.steps;
                total.compactions += o.compactions;
                total.read += o.read;
                total.recycled += o.recycled;
                total.faults += o.faults;
                total.reported += o.reported;
                total.lost += o.lost;
                total.undercounted += o.undercounted;
            }
            Err(e) => failed.push((seed, e)),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let o = total;
    println!(
        "\n== crashsim: the log store under simulated power cuts{}",
        if damage {
            " and damage in synced data"
        } else {
            ""
        }
    );
    println!(
        "  seeds {first}..{}: {} power cuts survived, {} events published, {} acknowledged events found after cuts, {} segments compacted, {} events read back while running, {} heads started in recycled segments, {} disk operations; {secs:.1} s ({:.0} seeds/s)",
        first + seeds,
        o.cuts,
        o.published,
        o.checked,
        o.compactions,
        o.read,
        o.recycled,
        o.steps,
        seeds as f64 / secs.max(1e-9)
    );
    if damage {
        println!(
            "  damage: {} faults injected, {} opens reported damage, {} acknowledged events lost and reported, {} opens whose count fell short of what went missing",
            o.faults, o.reported, o.lost, o.undercounted
        );
    }
    println!(
        "  failing seeds (a silent loss, or another broken promise; must be 0): {}",
        failed.len()
    );
    if failed.is_empty() {
        return Ok(());
    }
    let mut msg = String::new();
    for (seed, e) in failed.iter().take(SHOWN) {
        msg += &format!(
            "crashsim: {e}\n  reproduce: gridlet::store::log::sim::run_seed_with({seed}, {OPS}, {damage})\n"
        );
    }
    if failed.len() > SHOWN {
        let rest: Vec<String> = failed[SHOWN..].iter().map(|(s, _)| s.to_string()).collect();
        msg += &format!("  and seeds {}\n", rest.join(", "));
    }
    Err(msg)
}
