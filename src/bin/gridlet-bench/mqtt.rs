//! Scenario `mqtt` (opt-in: `--scenario mqtt`, not part of `all`): HTTP publish → gridlet → MQTT
//! destination → a subscriber on Mosquitto, beside a raw baseline measured in the same run.
//!
//! * raw: the bench publishes `n` events itself, one QoS 1 MQTT 5 message each, straight to the
//!   same Mosquitto (rumqttc, as many in flight as the broker's receive maximum allows), and the
//!   same subscriber counts them: the most this broker and subscriber take on this machine;
//! * gridlet: `n` events published over HTTP in batches of 100 to one `Mqtt` subscription
//!   (QoS 1, `maxEventsPerBatch` 50), timed from the first publish until the subscriber has them
//!   all; gridlet's CPU seconds per event from `/proc`;
//! * raw again after the gridlet run (the machine is shared: the best raw rate is the limit).
//!
//! Skipped with a message when Mosquitto is not installed (`scripts/test.sh` installs it).

use crate::child::{free_port, Gridlet};
use crate::net::{self, Load};
use crate::{Bench, Row, API, TOPIC};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn mosquitto_binary() -> Option<PathBuf> {
    [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Mosquitto as a child process, killed on drop.
pub(crate) struct Mosquitto {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mosquitto {
    async fn start(bin: PathBuf, dir: PathBuf) -> Result<Self, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("mosquitto dir: {e}"))?;
        let port = free_port().map_err(|e| format!("port: {e}"))?;
        let conf = dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "user root\npersistence false\nallow_anonymous true\nlog_type none\n\
                 max_queued_messages 1000000\nlistener {port} 127.0.0.1\n"
            ),
        )
        .map_err(|e| format!("mosquitto.conf: {e}"))?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("mosquitto: {e}"))?;
        let m = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err("mosquitto did not listen within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(m)
    }
}

/// An MQTT 5 client driven by its own task; `on_publish` counts messages received.
pub(crate) fn client(
    id: &str,
    port: u16,
    received: Option<Arc<AtomicU64>>,
) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let mut opts = MqttOptions::new(id, "127.0.0.1", port);
    opts.set_keep_alive(Duration::from_secs(30));
    opts.set_max_packet_size(Some(1 << 20));
    let (c, mut el) = AsyncClient::new(opts, 1024);
    let task = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    if let Some(r) = &received {
                        r.fetch_add(1, Relaxed);
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    (c, task)
}

/// Wait until `count` reaches `n` (or `cap` passes): the instant it did.
pub(crate) async fn until(count: &AtomicU64, n: u64, cap: Duration) -> Result<Instant, String> {
    let deadline = Instant::now() + cap;
    loop {
        let seen = count.load(Relaxed);
        if seen >= n {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(format!("{seen} of {n} messages within {cap:?}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A 256-byte-ish event like the other scenarios'.
fn event(i: u64) -> Bytes {
    Bytes::from(format!(
        "{{\"id\":\"raw-{i}\",\"subject\":\"s\",\"eventType\":\"t\",\"eventTime\":\"2017-08-10T21:03:07+00:00\",\"dataVersion\":\"1.0\",\"topic\":\"{TOPIC}\",\"metadataVersion\":\"1\",\"data\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(70)
    ))
}

impl Bench {
    pub(crate) async fn scenario_mqtt(&mut self) -> Result<(), String> {
        let Some(bin) = mosquitto_binary() else {
            println!("\n== mqtt: skipped: Mosquitto is not installed (apt-get install mosquitto)");
            return Ok(());
        };
        println!(
            "\n== mqtt: HTTP publish → gridlet → MQTT destination → a subscriber on Mosquitto"
        );
        let broker = Mosquitto::start(bin, self.root.join("mosquitto")).await?;
        let received = Arc::new(AtomicU64::new(0));
        let (sub, _sub_task) = client("bench-sub", broker.port, Some(received.clone()));
        sub.subscribe("bench/#", QoS::AtLeastOnce)
            .await
            .map_err(|e| format!("subscribe: {e}"))?;
        // The SUBACK: a first message through the broker.
        let (warm, _warm_task) = client("bench-warm", broker.port, None);
        warm.publish("bench/warm", QoS::AtLeastOnce, false, event(0))
            .await
            .map_err(|e| format!("publish: {e}"))?;
        until(&received, 1, Duration::from_secs(10)).await?;
        let n = self.mqtt_messages();

        let mut raw = self.mqtt_raw(&broker, &received, n).await?;
        println!("  raw MQTT publisher → Mosquitto → subscriber: {raw:.0} messages/s");
        let (publish, eps, cpu) = self.mqtt_gridlet(&broker, &received, n).await?;
        let again = self.mqtt_raw(&broker, &received, n).await?;
        println!("  raw again: {again:.0} messages/s");
        raw = raw.max(again);
        println!(
            "  gridlet → MQTT (QoS 1): {eps:.0} events/s delivered = {:.2} × raw; gridlet CPU {:.1} µs per event",
            eps / raw.max(1.0),
            cpu * 1e6 / n as f64
        );
        self.rows.push(Row {
            name: "mqtt: HTTP → gridlet → MQTT QoS 1".into(),
            publish_eps: publish,
            delivered_eps: eps,
            delivered: n,
            accepted: n,
            cpu_s: cpu,
            note: format!("raw MQTT {raw:.0}/s; {:.2} × raw", eps / raw.max(1.0)),
            ..Row::default()
        });
        self.figures.insert(
            "mqtt".into(),
            serde_json::json!({"destination": {
                "messages": n,
                "raw_eps": raw.round(),
                "gridlet_eps": eps.round(),
                "ratio": crate::report::round2(eps / raw.max(1.0)),
                "cpu_us_per_event": crate::report::round1(cpu * 1e6 / n as f64),
            }}),
        );
        self.mqtt_sources(&broker).await
    }

    /// The raw rate: `n` QoS 1 messages from a bench publisher to the subscriber.
    async fn mqtt_raw(
        &self,
        broker: &Mosquitto,
        received: &AtomicU64,
        n: u64,
    ) -> Result<f64, String> {
        let (c, task) = client("bench-raw", broker.port, None);
        let start_count = received.load(Relaxed);
        let started = Instant::now();
        for i in 0..n {
            c.publish("bench/raw", QoS::AtLeastOnce, false, event(i))
                .await
                .map_err(|e| format!("raw publish: {e}"))?;
        }
        let done = until(received, start_count + n, Duration::from_secs(300)).await?;
        task.abort();
        Ok(n as f64 / done.duration_since(started).as_secs_f64())
    }

    /// gridlet's run: (published events/s, delivered events/s, gridlet CPU seconds).
    async fn mqtt_gridlet(
        &self,
        broker: &Mosquitto,
        received: &AtomicU64,
        n: u64,
    ) -> Result<(f64, f64, f64), String> {
        let g = Gridlet::start(&self.spec("mqtt", &[])).await?;
        let (s, b) = net::request(g.addr, "PUT", &format!("/topics/{TOPIC}?{API}"), "{}").await?;
        if s != 200 {
            return Err(format!("create topic: HTTP {s}: {b}"));
        }
        let body = serde_json::json!({"properties": {"destination": {"endpointType": "Mqtt",
            "properties": {"url": format!("mqtt://127.0.0.1:{}", broker.port),
                "topicTemplate": "bench/${topic}", "qos": 1, "maxEventsPerBatch": 50}}}});
        let (s, b) = net::request(
            g.addr,
            "PUT",
            &format!("/topics/{TOPIC}/eventSubscriptions/s0?{API}"),
            &body.to_string(),
        )
        .await?;
        if s != 200 {
            return Err(format!("create subscription: HTTP {s}: {b}"));
        }
        let start_count = received.load(Relaxed);
        let cpu_before = g.sample().cpu_s;
        let started = Instant::now();
        let load = Load {
            conns: self.opts.conns,
            batch: 100,
            duration: Duration::from_secs(300),
            max_events: n,
            rate: None,
            path: crate::publish_path(),
            event_bytes: net::EVENT_BYTES,
        };
        let published = net::publish(g.addr, &load, self.base).await;
        if published.accepted < n {
            return Err(format!(
                "mqtt: only {} of {n} events accepted ({:?})",
                published.accepted, published.first_error
            ));
        }
        let done = until(received, start_count + n, Duration::from_secs(600)).await?;
        let cpu = g.sample().cpu_s - cpu_before;
        let publish = n as f64 / published.elapsed.as_secs_f64().max(1e-9);
        Ok((
            publish,
            n as f64 / done.duration_since(started).as_secs_f64(),
            cpu,
        ))
    }
}
