//! Scenario `crashsim`: the log store's power-cut simulation (`gridlet::store::log::sim`) over
//! many more seeds than the suite runs (2,000 there). Each seed drives the store as shipped
//! (`LogStore`, its rounds run by the same executor as the committer thread, its metadata and
//! dead letters on the same simulated disk) through three rounds, each ended by a power cut at
//! a seeded step, and checks after every cut that no acknowledged event is lost, nothing is
//! invented, no committed settlement is undone, a dead-lettered event is pending or a letter,
//! and a deleted subscription is gone with its events. A failing seed is printed with the call
//! that reproduces it.

use std::time::Instant;

/// Operations per round of a seed (the suite uses 40).
const OPS: usize = 60;

/// Run `seeds` seeds from `first`; prints the totals. `Err` names the first failing seed.
pub fn run(first: u64, seeds: u64) -> Result<(), String> {
    let t = Instant::now();
    let mut cuts = 0u64;
    let mut checked = 0u64;
    let mut published = 0u64;
    let mut steps = 0u64;
    let mut compactions = 0u64;
    let mut read = 0u64;
    let mut recycled = 0u64;
    for seed in first..first + seeds {
        let o = gridlet::store::log::sim::run_seed(seed, OPS).map_err(|e| {
            format!("crashsim: {e}\n  reproduce: gridlet::store::log::sim::run_seed({seed}, {OPS})")
        })?;
        cuts += u64::from(o.cuts);
        checked += o.checked;
        published += o.published;
        steps += o.steps;
        compactions += o.compactions;
        read += o.read;
        recycled += o.recycled;
    }
    let secs = t.elapsed().as_secs_f64();
    println!("\n== crashsim: the log store under simulated power cuts");
    println!(
        "  seeds {first}..{}: {cuts} power cuts survived, {published} events published, {checked} acknowledged events found after cuts, {compactions} segments compacted, {read} events read back while running, {recycled} heads started in recycled segments, {steps} disk operations; {:.1} s ({:.0} seeds/s)",
        first + seeds,
        secs,
        seeds as f64 / secs.max(1e-9)
    );
    Ok(())
}
