//! The docs say what the code does: rows of docs/COMPATIBILITY.md and docs/DESTINATIONS.md
//! that issue 24 touched are checked against the code's own tables (the destination registry,
//! module.json's platforms, the settings table, the destination-fault labels), so a doc that
//! states a feature the code lacks, or misses one it has, fails here.

use gridlet::config::SETTINGS;
use gridlet::outbound::sinks::DESTINATIONS;
use std::path::PathBuf;

fn read(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of `doc` that mention `word` (as a whole `code` span or word).
fn lines_with<'a>(doc: &'a str, word: &str) -> Vec<&'a str> {
    doc.lines()
        .filter(|l| {
            l.match_indices(word).any(|(i, _)| {
                let before = l[..i].chars().last();
                let after = l[i + word.len()..].chars().next();
                !before.is_some_and(char::is_alphanumeric)
                    && !after.is_some_and(char::is_alphanumeric)
            })
        })
        .collect()
}

#[test]
fn every_destination_type_is_documented_as_implemented() {
    let compat = read("docs/COMPATIBILITY.md");
    let dest = read("docs/DESTINATIONS.md");
    let endpoint_types = compat
        .lines()
        .find(|l| l.starts_with("| 16 |"))
        .expect("row 16 lists the endpointType values");
    for kind in DESTINATIONS.kinds() {
        let name = kind.names()[0];
        let lines = lines_with(&compat, name);
        assert!(!lines.is_empty(), "{name} is not in docs/COMPATIBILITY.md");
        for l in &lines {
            assert!(
                !l.contains("Not implemented") && !l.contains("being added"),
                "docs/COMPATIBILITY.md says {name} is not implemented: {l}"
            );
        }
        if kind.delivery() {
            assert!(
                endpoint_types.contains(&format!("`{name}`")),
                "row 16 of docs/COMPATIBILITY.md does not list {name}"
            );
        }
        if kind.dead_letter() {
            let row = compat
                .lines()
                .find(|l| l.starts_with("| 101 |"))
                .expect("row 101: the dead-letter destination");
            assert!(
                row.contains(&format!("`{name}`")),
                "row 101 of docs/COMPATIBILITY.md does not name the dead-letter type {name}"
            );
            assert!(!row.contains("only"), "row 101 limits the types: {row}");
        }
        if name != "WebHook" && name != "EdgeHub" && name != "EventGrid" {
            assert!(
                !lines_with(&dest, name).is_empty(),
                "{name} is not in docs/DESTINATIONS.md"
            );
        }
    }
}

#[test]
fn platforms_in_module_json_are_the_documented_ones() {
    let compat = read("docs/COMPATIBILITY.md");
    let m: serde_json::Value = serde_json::from_str(&read("module.json")).unwrap();
    let platforms = m["image"]["tag"]["platforms"].as_object().unwrap();
    let deployment = compat
        .lines()
        .find(|l| l.contains("Images for linux"))
        .expect("§7 names the images");
    for p in platforms.keys() {
        assert!(
            deployment.contains(p.as_str()),
            "§7 does not name {p}: {deployment}"
        );
        let family = &p[..p.find('v').unwrap_or(p.len())];
        assert!(
            !compat.contains(&format!("no {family}")),
            "docs/COMPATIBILITY.md says there is no {family} image, module.json builds {p}"
        );
    }
}

#[test]
fn settings_and_fault_labels_named_in_destinations_md_exist_and_the_reverse() {
    let dest = read("docs/DESTINATIONS.md");
    let keys: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
    // Every setting the page names exists.
    for word in dest.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if word.contains("__") && (word.starts_with("broker") || word.starts_with("outbound")) {
            assert!(
                keys.contains(&word),
                "docs/DESTINATIONS.md names {word}, not a setting"
            );
        }
    }
    // The dead-letter forwarding settings are documented there.
    for k in keys
        .iter()
        .filter(|k| k.starts_with("broker__deadLetter__forward"))
    {
        assert!(
            dest.contains(k),
            "docs/DESTINATIONS.md does not document {k}"
        );
    }
    // Every destination-fault label the metric carries is documented.
    for f in gridlet::delivery::classify::ConfigFault::ALL {
        assert!(
            dest.contains(&format!("`{}`", f.as_str())),
            "docs/DESTINATIONS.md does not document the fault label {}",
            f.as_str()
        );
    }
}

/// Issue 39: the footprint and throughput figures of the README and docs are the recorded
/// `gridlet-bench` run's (`docs/bench-run.json`), and the image sizes the recorded image build's
/// (`docs/images-run.json`), as `scripts/update-figures.py` writes them: the script's check
/// finds nothing to change, and the binary size is checked here on its own as well.
#[test]
fn measured_figures_are_the_recorded_bench_runs() {
    let run: serde_json::Value = serde_json::from_str(&read("docs/bench-run.json")).unwrap();
    assert_eq!(run["build"], "release", "figures come from a release build");
    assert!(run["date"].as_str().is_some_and(|d| d.len() == 10), "{run}");
    assert!(
        run["machine"].as_str().is_some_and(|m| !m.is_empty()),
        "{run}"
    );
    let bytes = run["scenarios"]["footprint"]["binary_bytes"]
        .as_u64()
        .expect("the footprint scenario's binary size");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/update-figures.py"))
        .arg("--check")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let binary = format!(
        "<!-- figure binary -->{:.1} MiB<!-- /figure -->",
        bytes as f64 / 1_048_576.0
    );
    for doc in ["README.md", "docs/BENCHMARKS.md"] {
        assert!(read(doc).contains(&binary), "{doc} lacks {binary}");
    }
}
