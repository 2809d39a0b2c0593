//! The IoT Edge packaging files, statically: `module.json`, `deployment.template.json` (shape,
//! every Env key one gridlet knows, the twin parses, routes name real outputs, `${MODULES.gridlet}`
//! matches module.json) and the three Dockerfiles (two stages, dependencies cached apart from the
//! sources, a distroless runtime stage that runs nothing, UID 2000, `/app`), and `compose.yaml`.
//! `scripts/images.sh` (run by `.ci/run`) builds every image and runs it, and runs `compose.yaml`.

use gridlet::config::{Config, SETTINGS};
use gridlet::model::subscription::Subscription;
use gridlet::model::topic::Topic;
use gridlet::outbound::sinks::DESTINATIONS;
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(name: &str) -> String {
    std::fs::read_to_string(root().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn json(name: &str) -> Value {
    serde_json::from_str(&read(name)).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

fn module_name_from(module_json: &Value) -> String {
    let repo = module_json["image"]["repository"].as_str().unwrap();
    repo.rsplit('/').next().unwrap().to_string()
}

#[test]
fn module_json_names_the_three_platforms_and_the_crate_version() {
    let m = json("module.json");
    assert_eq!(m["$schema-version"], "0.0.1");
    assert_eq!(m["image"]["tag"]["version"], env!("CARGO_PKG_VERSION"));
    let platforms = m["image"]["tag"]["platforms"].as_object().unwrap();
    assert_eq!(platforms["amd64"], "./Dockerfile.amd64");
    assert_eq!(platforms["arm64v8"], "./Dockerfile.arm64v8");
    assert_eq!(platforms["arm32v7"], "./Dockerfile.arm32v7");
    for f in platforms.values() {
        let f = f.as_str().unwrap().trim_start_matches("./");
        assert!(root().join(f).exists(), "{f} is missing");
    }
    assert_eq!(m["image"]["contextPath"], "./");
    assert_eq!(module_name_from(&m), "gridlet");
}

#[test]
fn deployment_template_is_a_working_manifest_for_gridlet() {
    let m = json("module.json");
    let name = module_name_from(&m);
    let d = json("deployment.template.json");
    let mc = &d["modulesContent"];
    let agent = &mc["$edgeAgent"]["properties.desired"];
    assert!(agent["schemaVersion"].is_string());
    assert_eq!(agent["runtime"]["type"], "docker");
    for sys in ["edgeAgent", "edgeHub"] {
        let image = agent["systemModules"][sys]["settings"]["image"]
            .as_str()
            .unwrap_or_else(|| panic!("{sys} has no image"));
        assert!(
            image.starts_with("mcr.microsoft.com/azureiotedge-"),
            "{image}"
        );
    }

    // The gridlet module: image placeholder, Env, ports, binds.
    let module = &agent["modules"][&name];
    assert_eq!(module["type"], "docker");
    assert_eq!(module["status"], "running");
    assert_eq!(module["settings"]["image"], format!("${{MODULES.{name}}}"));
    let create = &module["settings"]["createOptions"];
    let env: Vec<&str> = create["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(!env.is_empty());
    let known: Vec<String> = SETTINGS
        .iter()
        .map(|s| s.key.to_ascii_lowercase())
        .collect();
    let mut pairs = Vec::new();
    for e in &env {
        let (k, v) = e.split_once('=').unwrap_or_else(|| panic!("{e}: no '='"));
        let norm = k.replace(':', "__").to_ascii_lowercase();
        assert!(
            known.contains(&norm),
            "Env key {k} is not a gridlet setting"
        );
        pairs.push((k.to_string(), v.to_string()));
    }
    let cfg = Config::from_vars(pairs).expect("the Env block is a valid configuration");
    assert!(cfg.unknown_keys.is_empty());
    let host = &create["HostConfig"];
    assert_eq!(host["PortBindings"]["4438/tcp"][0]["HostPort"], "4438");
    let binds: Vec<&str> = host["Binds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for path in ["/app/metadataDb", "/app/eventsDb"] {
        assert!(
            binds.iter().any(|b| b.ends_with(&format!(":{path}"))),
            "no bind for {path}: {binds:?}"
        );
    }

    // The module twin's desired properties parse exactly as gridlet will parse them.
    let desired = &mc[&name]["properties.desired"];
    let topics = desired["topics"].as_object().expect("desired.topics");
    let mut outputs = Vec::new();
    for (sub_name, props) in desired["eventSubscriptions"].as_object().unwrap() {
        let topic_name = props["topic"].as_str().unwrap();
        let topic_props = topics
            .get(topic_name)
            .unwrap_or_else(|| panic!("{sub_name}: topic {topic_name} is not in desired.topics"));
        let topic =
            Topic::from_put(topic_name, serde_json::json!({ "properties": topic_props })).unwrap();
        let sub = Subscription::from_put(
            &topic,
            sub_name,
            serde_json::json!({ "properties": props }),
            &cfg,
            &DESTINATIONS,
        )
        .unwrap_or_else(|e| panic!("{sub_name}: {}", e.message));
        if sub.destination.endpoint_type() == "EdgeHub" {
            let props = sub.properties();
            let output = &props["destination"]["properties"]["outputName"];
            outputs.push(output.as_str().unwrap_or_default().to_string());
        }
    }

    // Routes start from gridlet's outputs that the twin actually feeds.
    let routes = mc["$edgeHub"]["properties.desired"]["routes"]
        .as_object()
        .unwrap();
    let prefix = format!("FROM /messages/modules/{name}/outputs/");
    let mut from_gridlet = 0;
    for r in routes.values() {
        let text = r
            .as_str()
            .or_else(|| r["route"].as_str())
            .expect("a route string");
        if let Some(rest) = text.strip_prefix(&prefix) {
            let output = rest.split_whitespace().next().unwrap();
            assert!(
                output == "*" || outputs.iter().any(|o| o == output),
                "route {text} names output {output}, which no twin subscription feeds"
            );
            from_gridlet += 1;
        }
    }
    assert!(from_gridlet > 0, "no route from a gridlet output");
}

/// The stages of a Dockerfile: (FROM line, instructions).
fn stages(text: &str) -> Vec<(String, Vec<String>)> {
    let joined = text.replace("\\\n", " ");
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in joined.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("FROM ") {
            out.push((line.to_string(), Vec::new()));
        } else if let Some((_, ins)) = out.last_mut() {
            ins.push(line.to_string());
        }
    }
    out
}

/// The static shape `scripts/images.sh` relies on; that script builds and runs every image in CI.
fn check_dockerfile(name: &str, target: &str) {
    let text = read(name);
    let st = stages(&text);
    assert_eq!(st.len(), 2, "{name}: a build stage and a runtime stage");
    let (build_from, build) = &st[0];
    assert!(
        build_from.contains("--platform=$BUILDPLATFORM")
            && build_from.contains("rust:1.95-bookworm"),
        "{name}: builds on the build host's own platform in the pinned Rust image"
    );
    assert!(
        build.iter().any(|l| l == &format!("ARG TARGET={target}")),
        "{name}: compiles for {target}"
    );
    let build_run = build.join("\n");
    let deps = build_run
        .find("COPY Cargo.toml Cargo.lock")
        .expect("dependency layer");
    let sources = build_run.find("COPY src src").expect("sources copied");
    assert!(
        deps < sources,
        "{name}: dependencies build before the sources are copied"
    );
    assert!(build_run.contains("cargo build --release --locked --target \"$TARGET\" --bin gridlet"));
    let (from, fin) = &st[1];
    assert_eq!(
        from, "FROM scratch",
        "{name}: distroless-style runtime stage"
    );
    for line in [
        "WORKDIR /app",
        "USER 2000:2000",
        "ENTRYPOINT [\"/app/gridlet\"]",
    ] {
        assert!(fin.iter().any(|l| l == line), "{name}: {line}");
    }
    for dir in ["/app/metadataDb", "/app/eventsDb"] {
        assert!(
            fin.iter()
                .any(|l| l.contains("--chown=2000:2000") && l.ends_with(dir)),
            "{name}: {dir} owned by UID 2000"
        );
    }
    assert!(
        !fin.iter().any(|l| l.starts_with("RUN ")),
        "{name}: the runtime stage runs nothing (no emulation needed for foreign platforms)"
    );
}

#[test]
fn dockerfiles_are_multi_stage_distroless_and_non_root() {
    check_dockerfile("Dockerfile.amd64", "x86_64-unknown-linux-gnu");
    check_dockerfile("Dockerfile.arm64v8", "aarch64-unknown-linux-gnu");
    check_dockerfile("Dockerfile.arm32v7", "armv7-unknown-linux-gnueabihf");
    let ignore = read(".dockerignore");
    for excluded in ["target", "metadataDb", "eventsDb", "**/*.pem", "**/*.key"] {
        assert!(
            ignore.lines().any(|l| l.trim() == excluded),
            "build context without {excluded}"
        );
    }
}

/// `compose.yaml` (issue 16, outside IoT Edge): every setting it gives gridlet is one gridlet
/// knows and the set is a valid configuration; gridlet's volumes are the data directories; the
/// subscription endpoint its comments use is the subscriber's service and port. Line-based (no
/// YAML parser among the dependencies); `scripts/images.sh compose` runs the file for real.
#[test]
fn compose_yaml_sets_known_settings_and_the_data_volumes() {
    let text = read("compose.yaml");
    let env: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| k.contains("__"))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect();
    assert!(env.len() >= 4, "{env:?}");
    for (k, _) in &env {
        assert!(SETTINGS.iter().any(|s| s.key == k), "unknown setting {k}");
    }
    let cfg = Config::from_vars(env).expect("compose.yaml's settings are valid");
    assert_eq!(
        cfg.inbound.tls_policy,
        gridlet::config::TlsPolicy::Enabled,
        "HTTP on, so a curl works"
    );
    assert!(
        !cfg.outbound.webhook_https_only,
        "the sample subscriber is http://"
    );
    for want in [
        "dockerfile: Dockerfile.amd64",
        "- metadata:/app/metadataDb",
        "- events:/app/eventsDb",
        "127.0.0.1:${GRIDLET_HTTP_PORT:-5888}:5888",
        "build: examples/subscriber",
        "http://subscriber:8080/events",
    ] {
        assert!(text.contains(want), "compose.yaml lacks {want}");
    }
    let dockerfile = read("examples/subscriber/Dockerfile");
    assert!(dockerfile.contains("FROM scratch") && dockerfile.contains("USER 2000:2000"));
    assert!(read("examples/subscriber/main.rs").contains("unwrap_or(8080)"));
}

/// Issue 20, Low 16: what the builds and tests download is pinned and verified: rustup-init a
/// fixed release checked by SHA-256 (it was the moving `dist/` path, unchecked), the builder
/// image a documented local import (named by tag in every Dockerfile), Azurite an exact version.
#[test]
fn downloads_in_builds_and_tests_are_pinned_and_verified() {
    let builder = read("scripts/images/rust-builder.Containerfile");
    assert!(!builder.contains("rustup/dist/"), "no moving rustup-init");
    assert!(builder.contains("rustup/archive/1.28.2/"));
    assert!(builder.contains("sha256sum --check --strict"));
    let hashes = builder
        .split(|c: char| !c.is_ascii_hexdigit())
        .filter(|w| w.len() == 64)
        .count();
    assert_eq!(hashes, 2, "one SHA-256 per build-host architecture");
    for f in [
        "Dockerfile.amd64",
        "Dockerfile.arm64v8",
        "Dockerfile.arm32v7",
    ] {
        let text = read(f);
        assert!(
            text.contains("documented import") && text.contains("@sha256:"),
            "{f}: says how its builder image is obtained and how to pin it"
        );
    }
    let test_sh = read("scripts/test.sh");
    let pinned = test_sh
        .split_whitespace()
        .filter(|w| w.starts_with("azurite@"))
        .all(|w| {
            let v = w.trim_start_matches("azurite@");
            v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok())
        });
    assert!(
        pinned && test_sh.contains("azurite@"),
        "azurite pinned exactly"
    );
}

/// Issue 20, Low 12: release builds abort on a panic (`panic = "abort"`), so catching an unwind
/// in the store writer was dead code there; gridlet decided for abort (a panicking store write
/// stops the process, the publish journal replays acknowledged events at restart) and keeps no
/// `catch_unwind` on a delivery path.
#[test]
fn release_builds_abort_on_panic_and_the_settle_thread_catches_nothing() {
    let manifest = read("Cargo.toml");
    let release = manifest
        .split("[profile.release]")
        .nth(1)
        .expect("a release profile");
    assert!(release.contains("panic = \"abort\""));
    let writer = read("src/delivery/writer.rs");
    assert!(
        !writer.contains("catch_unwind"),
        "no unwind handling that release builds never run"
    );
}
