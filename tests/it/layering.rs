//! The layers point one way. Every `crate::…` path in `src/` is read (comments stripped, `use
//! crate::{a, b::c}` groups included) and turned into an edge between top-level modules; the
//! test fails when an edge points up the layer table, or when two modules depend on each other
//! through any chain (a cycle).
//!
//! The layer table is the architecture of docs/ARCHITECTURE.md in data form: a module may use
//! modules of a lower layer, and modules of its own layer as long as no cycle forms.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → layer. Lower layers know nothing of higher ones.
const LAYERS: &[(&str, u8)] = &[
    // Helpers with no knowledge of the domain.
    ("clock", 0),
    ("sync", 0),
    ("redact", 0),
    // Retry schedules, the status-code table, health thresholds: pure data and pure functions.
    ("policy", 1),
    // Settings, read once at start.
    ("config", 2),
    // Pure data: events, subscriptions and their filters, metric series; certificates.
    ("model", 3),
    ("metrics", 3),
    ("tls", 3),
    // Trace context, spans and their OTLP encoding (the HTTP client comes from the server).
    ("telemetry", 3),
    ("store", 4),
    // The delivery engine (queues, dispatch, settle, retry, pull), then the outbound protocols
    // it reaches only through its `Sink` seam.
    ("delivery", 5),
    ("outbound", 6),
    ("broker", 7),
    // The HTTP surface, and IoT Edge plugging in from the side through the same seams.
    ("api", 8),
    ("error", 8),
    ("edge", 8),
    // MQTT sources: messages from MQTT brokers published through the broker, like `api`.
    ("ingress", 8),
    ("cli", 8),
    ("server", 9),
];

/// Imports that point up the layers or close a cycle and are being removed. Empty since issue 13
/// (the model and the broker have their own error types; only the API knows HTTP): the tests
/// fail on any such import, and on a listed one that no longer exists (delete its line).
const BEING_REMOVED: &[(&str, &str)] = &[];

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| {
            panic!("top-level module `{module}` has no layer: add it to LAYERS in tests/it/layering.rs")
        })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Source with `//` comments (doc comments included) removed; string contents are left alone,
/// which is good enough for `crate::` paths.
fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|line| match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a file names through `crate::`.
fn crate_paths(src: &str) -> BTreeSet<String> {
    paths_after(src, "crate::")
}

/// The first identifier after each `prefix` (`a` of `prefix a::x`, `a` and `b` of
/// `prefix {a::x, b}`).
fn paths_after(src: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::x, b, c::{d, e}}`: the first identifier of each depth-1 item.
            let mut depth = 1;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => item_start = true,
                    c if depth == 1 && item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident_at(&group[j..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            let id = ident_at(rest);
            if !id.is_empty() {
                out.insert(id.to_string());
            }
        }
    }
    out
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = first.trim_end_matches(".rs").to_string();
        // The binaries and the crate root wire everything together; they are not layers.
        if matches!(top.as_str(), "bin" | "lib" | "main") {
            continue;
        }
        let text = strip_comments(&std::fs::read_to_string(&file).unwrap());
        let deps = graph.entry(top.clone()).or_default();
        for dep in crate_paths(&text) {
            if dep != top && !matches!(dep.as_str(), "self" | "super") {
                deps.insert(dep);
            }
        }
    }
    graph
}

/// Modules reachable from `from` (not counting `from` itself unless a cycle returns to it).
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = graph
        .get(from)
        .into_iter()
        .flatten()
        .map(|s| s.as_str())
        .collect();
    while let Some(m) = stack.pop() {
        if seen.insert(m.to_string()) {
            stack.extend(graph.get(m).into_iter().flatten().map(|s| s.as_str()));
        }
    }
    seen
}

#[test]
fn crate_paths_reads_single_and_grouped_imports() {
    let src = "use crate::a::X;\nuse crate::{b::{Y, Z}, c,\n  d::W};\nlet v = crate::e::f();";
    let got: Vec<_> = crate_paths(src).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "d", "e"]);
    assert!(crate_paths(&strip_comments("// see crate::z\n")).is_empty());
}

#[test]
fn every_import_points_down_the_layer_table() {
    let graph = module_graph();
    let mut upward = Vec::new();
    for (from, deps) in &graph {
        for to in deps {
            let known = BEING_REMOVED.contains(&(from.as_str(), to.as_str()));
            if layer(to) > layer(from) && !known {
                upward.push(format!(
                    "{from} (layer {}) -> {to} (layer {})",
                    layer(from),
                    layer(to)
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports pointing up the layers:\n  {}",
        upward.join("\n  ")
    );
    let gone: Vec<_> = BEING_REMOVED
        .iter()
        .filter(|(from, to)| !graph.get(*from).is_some_and(|d| d.contains(*to)))
        .collect();
    assert!(
        gone.is_empty(),
        "no longer imported, delete from BEING_REMOVED: {gone:?}"
    );
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let mut graph = module_graph();
    for (from, to) in BEING_REMOVED {
        if let Some(deps) = graph.get_mut(*from) {
            deps.remove(*to);
        }
    }
    let cycles: Vec<String> = graph
        .keys()
        .filter(|m| reachable(&graph, m).contains(*m))
        .map(|m| {
            let back: Vec<_> = graph[m]
                .iter()
                .filter(|d| reachable(&graph, d).contains(m))
                .cloned()
                .collect();
            format!("{m} -> {} -> … -> {m}", back.join("|"))
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles:\n  {}",
        cycles.join("\n  ")
    );
}

/// The modules inside top-level module `top` (the files and folders of `src/{top}/`, its root
/// `mod.rs` aside) and the ones each names: `super::x` from a file directly under `src/{top}/`,
/// `super::super::x` from one a folder down, `crate::{top}::x` from anywhere inside.
fn inner_graph(top: &str) -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(top);
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let module = |p: &Path| {
        let rel = p.strip_prefix(&dir).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files.iter().map(|f| module(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let node = module(file);
        if node == "mod" {
            continue; // the module root declares every module
        }
        let rel = file.strip_prefix(&dir).unwrap();
        let mut depth = rel.components().count();
        if rel.file_name().is_some_and(|n| n == "mod.rs") {
            depth -= 1;
        }
        let text = strip_comments(&std::fs::read_to_string(file).unwrap());
        let mut named = paths_after(&text, &"super::".repeat(depth));
        named.extend(paths_after(&text, &format!("crate::{top}::")));
        let deps = graph.entry(node.clone()).or_default();
        for m in named {
            if m != node && modules.contains(&m) {
                deps.insert(m);
            }
        }
    }
    graph
}

/// The cycles of a graph, one line per module on one: `m -> d|e -> … -> m`.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>, top: &str) -> Vec<String> {
    graph
        .keys()
        .filter(|m| reachable(graph, m).contains(*m))
        .map(|m| {
            let back: Vec<_> = graph[m]
                .iter()
                .filter(|d| reachable(graph, d).contains(m))
                .cloned()
                .collect();
            format!("{top}::{m} -> {} -> … -> {m}", back.join("|"))
        })
        .collect()
}

/// Issue 23: no circle inside `delivery/` (the dispatcher decides nothing the refill or the
/// subscription handle call back into; settling is `settle` (pure) and `apply`).
#[test]
fn no_import_cycle_inside_delivery() {
    let graph = inner_graph("delivery");
    assert!(graph.contains_key("dispatcher") && graph["dispatcher"].contains("queue"));
    let found = cycles(&graph, "delivery");
    assert!(
        found.is_empty(),
        "import cycles inside delivery/:\n  {}",
        found.join("\n  ")
    );
}

/// Issue 36: no circle inside any top-level module with a folder of its own (`model::record`
/// and `model::destination` named each other until `DestinationRecord` moved beside
/// `Destination`).
#[test]
fn no_import_cycle_inside_any_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !path.is_dir() || name == "bin" {
            continue;
        }
        checked += 1;
        found.extend(cycles(&inner_graph(&name), &name));
    }
    assert!(checked >= 8, "only {checked} module folders found");
    assert!(
        found.is_empty(),
        "import cycles inside modules:\n  {}",
        found.join("\n  ")
    );
}
