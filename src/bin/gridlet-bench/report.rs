//! The bench's report: one block per scenario as it runs, then the summary table (markdown).

use super::*;

impl Bench {
    pub(super) fn print_row(&self, r: &Row, title: &str) {
        println!("\n== {} — {title} ==", r.name);
        let ratio = |v: f64| self.of_raw(v) + " × raw";
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
                "  gridlet CPU           {:.2} s = {:.1} µs per delivered event ({:.1} µs user, {:.1} µs kernel)",
                r.cpu_s,
                per_event_us(r.cpu_s, r.delivered),
                per_event_us(r.cpu_s - r.sys_s, r.delivered),
                per_event_us(r.sys_s, r.delivered)
            );
            println!(
                "  gridlet wakeups       {:.2} context switches per delivered event",
                r.switches as f64 / r.delivered.max(1) as f64
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
        // Only where something is made durable: elsewhere it is the machine's other writers.
        if let Some(w) = r.device_written.filter(|w| *w >= 1 << 20) {
            println!(
                "  device writes         {:.0} bytes per delivered event (the data disk, file-system metadata included)",
                w as f64 / r.delivered.max(1) as f64
            );
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

    /// `v` as a multiple of the raw batch-1 limit, or `–` when the run measured none.
    fn of_raw(&self, v: f64) -> String {
        if self.raw1 > 0.0 {
            format!("{:.2}", v / self.raw1)
        } else {
            "–".into()
        }
    }

    pub(super) fn summary(&self) {
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
                "| {} | {:.0} | {} | {:.0} | {} | {} | {p50} | {p99} | {max} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.publish_eps,
                self.of_raw(r.publish_eps),
                r.delivered_eps,
                self.of_raw(r.delivered_eps),
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

impl Bench {
    /// The run as JSON (`--json`): when, where, how busy the machine was, each scenario's
    /// figures in numbers, and the summary's rows. `scripts/update-figures.py` reads it.
    pub(super) fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "publish_eps": r.publish_eps.round(),
                    "delivered_eps": r.delivered_eps.round(),
                    "latency_us": r.lat.map(|(p50, p99, max)| serde_json::json!({"p50": p50, "p99": p99, "max": max})),
                    "peak_rss_bytes": r.peak_rss,
                    "cpu_us_per_event": round1(per_event_us(r.cpu_s, r.delivered)),
                    "cpu_sys_us_per_event": round1(per_event_us(r.sys_s, r.delivered)),
                    "paired_raw": r.paired.as_ref().map(|p| serde_json::json!({
                        "rounds": p.rounds,
                        "ratio": round2(p.raw),
                        "lowest": round2(p.raw_spread.0),
                        "highest": round2(p.raw_spread.1),
                    })),
                    "paired_durable": r.paired.as_ref().and_then(|p| p.durable).map(|(d, (lo, hi))| serde_json::json!({
                        "ratio": round2(d),
                        "lowest": round2(lo),
                        "highest": round2(hi),
                    })),
                    "note": r.note.trim(),
                })
            })
            .collect();
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        serde_json::json!({
            "date": utc_date(secs),
            "machine": machine(),
            "load_at_start": self.load,
            "build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "command": std::env::args().skip(1).collect::<Vec<_>>().join(" "),
            "scenarios": self.figures,
            "raw_limit_eps": self.raw1.round(),
            "rows": rows,
        })
    }
}

pub(super) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub(super) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `YYYY-MM-DD` of a Unix time, in UTC (days to the civil calendar, H. Hinnant's algorithm).
fn utc_date(unix_secs: u64) -> String {
    let z = (unix_secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc_date(0), "1970-01-01");
        assert_eq!(super::utc_date(951_782_400), "2000-02-29");
        assert_eq!(super::utc_date(1_795_824_000), "2026-11-28");
    }
}
