//! Docs that run: the walk-throughs of the README and `docs/` are executed as written, against
//! the real binary, a real receiver (the sample subscriber), the trace receiver and the SDKs, so
//! a doc that stops working fails the build.
//!
//! **The marker.** A fenced block takes part when its info string says which walk-through it
//! belongs to; renderers read only the first word (the language), so readers see an ordinary
//! block:
//!
//! ````text
//! ```sh walkthrough=quickstart                  a step: run, exit 0, no `{"error":` in its output
//! ```sh walkthrough=quickstart background=rx    a long-running program (broker, receiver), left
//!                                               running; its output is kept as `rx`'s log
//! ```text walkthrough=quickstart output         what the step before printed
//! ```text walkthrough=quickstart output=rx      what `rx` prints (waited for, up to 2 min)
//! ```python walkthrough=pull                    a Python step, run with the tests' virtualenv
//! ```js walkthrough=pull                        an ES module, run with node and the tests' npm
//!                                               packages
//! ````
//!
//! Output blocks match line by line, in order; `…` in a line matches anything. A walk-through's
//! blocks run in document order in **one bash session** (variables carry over, as in a
//! reader's terminal), in a scratch directory with the repository's `tests/` and `scripts/`
//! linked in. The session maps `cargo run --release` to this build's `gridlet` and `cargo run
//! --example subscriber` to the sample subscriber, and puts `gridlet` and the virtualenv that
//! `scripts/test.sh` installs on the `PATH` (`runner.rs`).
//!
//! **Ports.** A doc names its addresses once, at the top of the walk-through, as variables the
//! test may set: `B=${B:-http://localhost:5888}` stays pasteable and lets the test point it at
//! a free port. The programs read theirs from the environment the test exports
//! (`inbound__httpPort`, `SUBSCRIBER_PORT`, ...).
//!
//! **Adding a doc** (docs/MQTT.md, docs/CLOUD.md, docs/CONSOLE.md, ...): mark its blocks, define
//! its addresses as variables at the top, and add a test below: [`Walk::new`] with the doc and
//! the walk-through's name, `.env(..)` for the ports, `.ready(name, port)` for each background
//! program that must listen before the next step, then `.run()`; check anything the doc promises
//! that is not printed (files, a receiver's state) after. A step that needs a real Azure resource
//! is not marked: the doc says so, and the test gives the local stand-in (Azurite, a second
//! gridlet, Mosquitto) through the same variables; `.setup(..)` does to the stand-in what the
//! doc has the reader do in Azure (docs/CLOUD.md's namespace topic and subscription).

mod runner;

use crate::util::free_port;
use runner::Session;
use std::time::{Duration, Instant};

/// One walk-through of one doc: its environment, and the background programs to wait for.
struct Walk {
    doc: &'static str,
    name: &'static str,
    env: Vec<(&'static str, String)>,
    ready: Vec<(&'static str, u16)>,
    /// Background programs the test starts before the doc's blocks: (name, script, port).
    stand_ins: Vec<(&'static str, String, u16)>,
    /// Steps the test runs once the stand-ins listen, before the doc's blocks: what the doc
    /// has the reader do elsewhere (in Azure), done to the stand-in.
    setup: Vec<String>,
}

impl Walk {
    fn new(doc: &'static str, name: &'static str) -> Self {
        Self {
            doc,
            name,
            env: Vec::new(),
            ready: Vec::new(),
            stand_ins: Vec::new(),
            setup: Vec::new(),
        }
    }

    /// Run `script` once the stand-ins listen, before the doc's blocks; it must exit 0.
    fn setup(mut self, script: &str) -> Self {
        self.setup.push(script.to_string());
        self
    }

    /// Start `script` in the background as `name` before the doc's blocks, and wait until
    /// `port` listens: a local stand-in for what the doc gets from elsewhere (containers, an
    /// Azure resource).
    fn stand_in(mut self, name: &'static str, script: &str, port: u16) -> Self {
        self.stand_ins.push((name, script.to_string(), port));
        self
    }

    fn env(mut self, key: &'static str, value: impl ToString) -> Self {
        self.env.push((key, value.to_string()));
        self
    }

    /// After the background program `name` starts, wait until `port` accepts connections.
    fn ready(mut self, name: &'static str, port: u16) -> Self {
        self.ready.push((name, port));
        self
    }

    /// Run every block; the session, for checks after.
    fn run(self) -> Session {
        let blocks = runner::blocks(self.doc, self.name);
        let mut s = Session::start(&self.env);
        for (name, script, port) in &self.stand_ins {
            s.background(name, script, &format!("stand-in {name}"));
            wait_port(&s, name, *port, &format!("stand-in {name}"));
        }
        for script in &self.setup {
            let (out, status) = s.run(script);
            assert_eq!(
                status, 0,
                "the test's setup: exit status {status}; output:\n{out}"
            );
        }
        for (i, b) in blocks.iter().enumerate() {
            let checked_next = blocks.get(i + 1).is_some_and(|n| n.output == Some(None));
            s.block(b, checked_next);
            if let Some(name) = &b.background {
                if let Some((_, port)) = self.ready.iter().find(|(n, _)| n == name) {
                    wait_port(&s, name, *port, &b.at);
                }
            }
        }
        s
    }
}

fn wait_port(s: &Session, name: &str, port: u16, at: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{at}: {name} is not listening on {port}; its log:\n{}",
            s.log(name)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The README's quick start and its walk-through in detail: the broker as the README starts
/// it, the sample subscriber as the receiver, the curl commands, and the line the subscriber
/// prints. The data folders are where the README says.
#[test]
fn readme_quick_start() {
    let (api, tls, hook) = (free_port(), free_port(), free_port());
    let s = Walk::new("README.md", "quickstart")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("SUBSCRIBER_PORT", hook)
        .env("B", format!("http://localhost:{api}"))
        .env("HOOK", format!("http://localhost:{hook}/events"))
        .ready("broker", api)
        .ready("receiver", hook)
        .run();
    for d in ["metadataDb", "eventsDb"] {
        assert!(
            s.dir.path().join(d).is_dir(),
            "no {d} in the working directory"
        );
    }
}

/// docs/PULL.md: a broker with a SAS key, `$G` and `$KEY`, a wrong key's 401 naming both key
/// headers, the queue subscription, and the SDK snippets as printed: Python (publish, receive,
/// `handle`, acknowledge) and JavaScript (send, receive, acknowledge).
#[test]
fn pull_md_walk_through_with_the_python_sdk() {
    let (api, tls) = (free_port(), free_port());
    Walk::new("docs/PULL.md", "pull")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("G", format!("http://localhost:{api}"))
        .ready("broker", api)
        .run();
}

/// docs/MQTT.md, the management API's walk-through: Mosquitto, a broker, the sample
/// subscriber; a connection and a route PUT while gridlet runs, a message from `mosquitto_pub`
/// delivered with the route's enrichment, the GET with its password masked, the 400 for a
/// connection a route uses, and both deleted.
#[test]
fn mqtt_md_management_api_walk_through_with_mosquitto() {
    let (api, tls, hook, mqtt) = (free_port(), free_port(), free_port(), free_port());
    Walk::new("docs/MQTT.md", "mqtt-api")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("SUBSCRIBER_PORT", hook)
        .env("MQTT_PORT", mqtt)
        .env("B", format!("http://localhost:{api}"))
        .env("HOOK", format!("http://localhost:{hook}/events"))
        .ready("mosquitto", mqtt)
        .ready("broker", api)
        .ready("receiver", hook)
        .run();
}

/// docs/MQTT.md, the destination's walk-through: Mosquitto, `mosquitto_sub`, a broker; an
/// event published over HTTP reaches the subscriber on the topic its template makes.
#[test]
fn mqtt_md_destination_walk_through_with_mosquitto_sub() {
    let (api, tls, mqtt) = (free_port(), free_port(), free_port());
    Walk::new("docs/MQTT.md", "mqtt-out")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("MQTT_PORT", mqtt)
        .env("B", format!("http://localhost:{api}"))
        .ready("mosquitto", mqtt)
        .ready("broker", api)
        .run();
}

/// docs/OBSERVABILITY.md: the trace receiver it suggests (`tests/otel/collector.py`), a broker
/// exporting to it, an event dead-lettered in the publisher's trace, the health gauge through
/// `/metrics?api-version`, the dead letter listed and replayed.
#[test]
fn observability_md_walk_through_with_the_trace_receiver() {
    let (api, tls, otlp, failing) = (free_port(), free_port(), free_port(), free_port());
    Walk::new("docs/OBSERVABILITY.md", "observability")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("B", format!("http://localhost:{api}"))
        .env("OTLP_PORT", otlp)
        .env("FAILING_PORT", failing)
        .ready("collector", otlp)
        .ready("failing", failing)
        .ready("broker", api)
        .run();
}

/// The `environment:` of `compose.yaml`'s gridlet service, as `KEY=value` pairs.
fn compose_environment() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/compose.yaml"))
        .expect("compose.yaml");
    let mut lines = text.lines().skip_while(|l| l.trim() != "environment:");
    lines.next().expect("compose.yaml has an environment");
    lines
        .take_while(|l| l.starts_with("      ") || l.trim().is_empty())
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| l.trim().split_once(": "))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}

/// docs/IOT_EDGE.md, "Outside IoT Edge": the commands it gives against the compose stack. The
/// tests cannot start containers, so the stand-in is the same two programs on the host: gridlet
/// with `compose.yaml`'s own environment and the sample subscriber; `HOOK` names the
/// subscriber's host port instead of its service name.
#[test]
fn iot_edge_md_compose_commands_against_the_compose_environment() {
    let (api, tls, hook) = (free_port(), free_port(), free_port());
    let env = compose_environment();
    assert!(
        env.iter().any(|(k, _)| k == "broker__defaultIsPersisted"),
        "{env:?}"
    );
    let settings: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    Walk::new("docs/IOT_EDGE.md", "compose")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("SUBSCRIBER_PORT", hook)
        .env("B", format!("http://127.0.0.1:{api}"))
        .env("HOOK", format!("http://127.0.0.1:{hook}/events"))
        .stand_in("gridlet", &format!("{settings}cargo run --release"), api)
        .stand_in("subscriber", "cargo run --example subscriber", hook)
        .run();
}

/// A gridlet with SAS keys on (`key`), in its own directory under the session's, on `port`: the
/// stand-in for an Event Grid namespace (or a second device).
fn keyed_gridlet(dir: &str, port: u16, tls: u16, key: &str) -> String {
    format!(
        "(mkdir -p {dir} && cd {dir} && inbound__httpPort={port} inbound__httpsPort={tls} \\
         inbound__serverAuth__tlsPolicy=enabled inbound__clientAuth__clientCert__enabled=false \\
         inbound__clientAuth__sasKeys__enabled=true inbound__clientAuth__sasKeys__key1={key} \\
         exec \"$GRIDLET_BIN\")"
    )
}

/// What docs/CLOUD.md has the reader make in Azure, made on the gridlet at `port`: a CloudEvents
/// topic `telemetry` with a queue subscription `app`.
fn namespace_topic_and_queue(port: u16, key: &str) -> String {
    format!(
        r#"V='api-version=2019-01-01-preview'; J='Content-Type: application/json'; N=http://127.0.0.1:{port}
curl -sf -X PUT -H "$J" -H 'aeg-sas-key: {key}' "$N/topics/telemetry?$V" \
  -d '{{"properties":{{"inputSchema":"CloudEventSchemaV1_0"}}}}'
curl -sf -X PUT -H "$J" -H 'aeg-sas-key: {key}' "$N/topics/telemetry/eventSubscriptions/app?$V" \
  -d '{{"properties":{{"deliveryConfiguration":{{"deliveryMode":"Queue"}}}}}}'"#
    )
}

/// docs/CLOUD.md, device -> namespace: the device's gridlet forwards a topic to a namespace
/// topic (`:publish`), and the event is received and acknowledged there. The stand-in for the
/// namespace is a second gridlet (its own directory, SAS keys on) with the topic and queue
/// subscription the doc has the reader make in Azure, as `cloud::a_second_gridlet_is_the_namespace`
/// does; the device accepts its plain-HTTP, non-Azure URL through the two settings the doc names.
#[test]
fn cloud_md_device_to_namespace_with_a_second_gridlet_as_the_namespace() {
    let (api, tls, ns, ns_tls) = (free_port(), free_port(), free_port(), free_port());
    let key = "the-namespace-stand-in-key";
    Walk::new("docs/CLOUD.md", "cloud")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("outbound__eventgrid__httpsOnly", "false")
        .env("outbound__eventgrid__allowInvalidHostnames", "true")
        .env("B", format!("http://localhost:{api}"))
        .env("NS", format!("http://127.0.0.1:{ns}"))
        .env("NS_KEY", key)
        .stand_in(
            "namespace",
            &keyed_gridlet(".namespace", ns, ns_tls, key),
            ns,
        )
        .setup(&namespace_topic_and_queue(ns, key))
        .ready("broker", api)
        .run();
}

/// docs/CLOUD.md, "the same SDK code against both": the Python block as printed, run against
/// a device gridlet and the namespace's stand-in (a second gridlet), each with the CloudEvents
/// topic and queue subscription the doc names; it receives its own event from each.
#[test]
fn cloud_md_the_same_sdk_code_against_the_device_and_the_namespace() {
    let (dev, dev_tls, ns, ns_tls) = (free_port(), free_port(), free_port(), free_port());
    let (dev_key, ns_key) = ("the-device-key", "the-namespace-stand-in-key");
    Walk::new("docs/CLOUD.md", "cloud-sdk")
        .env("G", format!("http://127.0.0.1:{dev}"))
        .env("KEY", dev_key)
        .env("NS", format!("http://127.0.0.1:{ns}"))
        .env("NS_KEY", ns_key)
        .stand_in(
            "device",
            &keyed_gridlet(".device", dev, dev_tls, dev_key),
            dev,
        )
        .stand_in(
            "namespace",
            &keyed_gridlet(".namespace", ns, ns_tls, ns_key),
            ns,
        )
        .setup(&namespace_topic_and_queue(dev, dev_key))
        .setup(&namespace_topic_and_queue(ns, ns_key))
        .run();
}

/// docs/CONSOLE.md, "From the command line": a broker with a SAS key, the console's page and
/// its headers, the overview, a queue subscription's status, and the live tail (the watch
/// started, two events published, the one that passes the URL-encoded filter tailed).
#[test]
fn console_md_data_routes_from_the_command_line() {
    let (api, tls) = (free_port(), free_port());
    let mut s = Walk::new("docs/CONSOLE.md", "console")
        .env("inbound__httpPort", api)
        .env("inbound__httpsPort", tls)
        .env("B", format!("http://localhost:{api}"))
        .ready("broker", api)
        .run();
    // The filter kept the office's event out (an ellipsis in the doc's line cannot say so).
    let (tail, _) = s.run(
        r#"curl -s -G -H "$A" "$B/topics/readings/tail" --data-urlencode "$V" -d after="$N" \
  -d wait=0 --data-urlencode 'filter={"subjectBeginsWith":"plant/"}'"#,
    );
    assert!(tail.contains(r#""id":"1""#), "{tail}");
    assert!(!tail.contains(r#""id":"2""#), "{tail}");
}
