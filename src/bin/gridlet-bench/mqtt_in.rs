//! Scenario `mqtt`, the source rows (issue 33): messages published to Mosquitto, taken by a
//! gridlet MQTT source and delivered to the bench's webhook receiver, each against a raw
//! baseline measured in alternating slices of the same run.
//!
//! * **MQTT → webhook**: `--mqtt-messages` QoS 1 messages per slice (256-byte JSON, content type
//!   `application/json`, stamped with their send time) from one bench publisher (rumqttc) to a
//!   route of one in-memory webhook subscription. The raw slice sends the same messages through
//!   a **raw forwarder**: a minimal rumqttc subscriber (the same receive maximum as gridlet's
//!   connection, `--mqtt-receive-maximum`, 100 by default as in gridlet) that
//!   POSTs each message, one per request, over `--conns` keep-alive connections to the same
//!   receiver. It acknowledges each message as it reads it (rumqttc's automatic PUBACK); gridlet
//!   only once the event is accepted. A slice runs from the first publish until the receiver
//!   has every message.
//! * **QoS 1 persisted**: the same messages on a route whose topic has one persisted
//!   subscription (the PUBACK leaves after the store commit), alternating with slices of (d)'s
//!   raw durable limit: the HTTP publisher (batch 1, `--conns` connections) straight to a
//!   receiver that `fdatasync`s each body before its 200.
//!
//! gridlet's CPU per event is read from `/proc` over its slices only.

use crate::child::Gridlet;
use crate::mqtt::{until, Mosquitto};
use crate::net::{self, Conn, Load, Receiver};
use crate::{Bench, Row, API};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// MQTT topics of the three paths (under `in/`, so the destination row's `bench/#` subscriber
/// sees none of them).
const RAW: &str = "in/raw/x";
const MEMORY: &str = "in/g/x";
const PERSISTED: &str = "in/p/x";
/// The gridlet topic of the persisted route.
const PERSISTED_TOPIC: &str = "benchp";

/// A message: `{"bts":<µs>,"pad":"x…"}`, [`net::EVENT_BYTES`] long, stamped now.
fn message(base: Instant) -> Bytes {
    let mut s = String::with_capacity(net::EVENT_BYTES);
    let _ = write!(s, "{{\"bts\":{},\"pad\":\"", net::now_us(base));
    while s.len() < net::EVENT_BYTES - 2 {
        s.push('x');
    }
    s.push_str("\"}");
    Bytes::from(s)
}

/// The raw forwarder: an MQTT subscriber POSTing each message to the receiver. Its tasks stop
/// when it is dropped.
struct Forwarder {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Forwarder {
    async fn start(
        port: u16,
        to: std::net::SocketAddr,
        conns: usize,
        receive_maximum: u16,
    ) -> Result<Self, String> {
        let mut opts = MqttOptions::new("bench-forwarder", "127.0.0.1", port);
        opts.set_keep_alive(Duration::from_secs(30));
        opts.set_max_packet_size(Some(1 << 20));
        opts.set_receive_maximum(Some(receive_maximum));
        let (client, mut el) = AsyncClient::new(opts, 1024);
        let mut tasks = Vec::new();
        let mut queues = Vec::new();
        for _ in 0..conns.max(1) {
            let (tx, mut q) = mpsc::channel::<Bytes>(256);
            queues.push(tx);
            tasks.push(tokio::spawn(async move {
                let mut conn: Option<Conn> = None;
                while let Some(body) = q.recv().await {
                    // Until the receiver took it: a minimal forwarder, but not a lossy one.
                    loop {
                        let c = match conn.as_mut() {
                            Some(c) => c,
                            None => match Conn::open(to).await {
                                Ok(c) => conn.insert(c),
                                Err(_) => {
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                    continue;
                                }
                            },
                        };
                        let sent = c
                            .send(
                                "POST",
                                "/forwarded",
                                "application/json",
                                body.clone(),
                                Duration::from_secs(30),
                            )
                            .await;
                        match sent {
                            Ok((200, _)) => break,
                            _ => conn = None,
                        }
                    }
                }
            }));
        }
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        let mut subscribed_tx = Some(subscribed_tx);
        tasks.push(tokio::spawn(async move {
            let mut next = 0usize;
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = subscribed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let q = &queues[next % queues.len()];
                        next = next.wrapping_add(1);
                        if q.send(p.payload).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }));
        client
            .subscribe("in/raw/#", QoS::AtLeastOnce)
            .await
            .map_err(|e| format!("forwarder subscribe: {e}"))?;
        // Nothing is published to it before the broker confirmed the subscription.
        let me = Self { tasks };
        tokio::time::timeout(Duration::from_secs(30), subscribed)
            .await
            .map_err(|_| "forwarder: no SUBACK within 30 s".to_string())?
            .map_err(|_| "forwarder: its event loop ended".to_string())?;
        Ok(me)
    }
}

/// Σ events / Σ seconds over slices, and each slice's rate.
#[derive(Default)]
struct Series {
    events: f64,
    secs: f64,
    rates: Vec<f64>,
}

impl Series {
    fn add(&mut self, events: u64, secs: f64) {
        self.events += events as f64;
        self.secs += secs;
        self.rates.push(events as f64 / secs.max(1e-9));
    }

    fn rate(&self) -> f64 {
        self.events / self.secs.max(1e-9)
    }

    /// The lowest and highest per-round ratio to `other`.
    fn spread(&self, other: &Series) -> (f64, f64) {
        self.rates
            .iter()
            .zip(&other.rates)
            .map(|(a, b)| a / b.max(1e-9))
            .fold((f64::MAX, 0.0f64), |(lo, hi), r| (lo.min(r), hi.max(r)))
    }
}

/// A management `PUT` that must answer 200.
async fn put(addr: std::net::SocketAddr, path: String, body: String) -> Result<(), String> {
    let (s, b) = net::request(addr, "PUT", &path, &body).await?;
    if s == 200 {
        Ok(())
    } else {
        Err(format!("PUT {path}: HTTP {s}: {b}"))
    }
}

/// The publisher: one rumqttc client, QoS 1.
struct Publisher {
    client: AsyncClient,
    task: tokio::task::JoinHandle<()>,
    base: Instant,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Publisher {
    fn new(port: u16, base: Instant) -> Self {
        let (client, task) = crate::mqtt::client("bench-in-pub", port, None);
        Self { client, task, base }
    }

    /// Publish `n` messages to `topic`, then wait until `rx` counted them: the slice's seconds.
    async fn slice(&self, topic: &str, rx: &Receiver, n: u64) -> Result<f64, String> {
        let props = PublishProperties {
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        let from = rx.stats.events.load(Relaxed);
        let started = Instant::now();
        for _ in 0..n {
            self.client
                .publish_with_properties(
                    topic,
                    QoS::AtLeastOnce,
                    false,
                    message(self.base),
                    props.clone(),
                )
                .await
                .map_err(|e| format!("publish: {e}"))?;
        }
        let done = until(&rx.stats.events, from + n, Duration::from_secs(600))
            .await
            .map_err(|e| format!("{topic}: {e}"))?;
        Ok(done.duration_since(started).as_secs_f64())
    }
}

impl Bench {
    /// The source rows of scenario `mqtt`, on the running `broker`.
    pub(crate) async fn mqtt_sources(&mut self, broker: &Mosquitto) -> Result<(), String> {
        let n = self.mqtt_messages();
        let rounds = self.opts.rounds.max(1);
        println!(
            "\n== mqtt in: Mosquitto → gridlet MQTT source → webhook, {rounds} rounds of {n} messages, alternating with a raw MQTT → HTTP forwarder"
        );
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        rx.stats.sampling.store(false, Relaxed);
        let g = self.source_gridlet(broker, &rx).await?;
        let _fwd = Forwarder::start(
            broker.port,
            rx.addr,
            self.opts.conns,
            self.opts.mqtt_receive_maximum,
        )
        .await?;
        let publ = Publisher::new(broker.port, self.base);
        // Warm-up: every path delivers before anything is timed.
        let warm = n.min(500);
        for topic in [RAW, MEMORY, PERSISTED] {
            publ.slice(topic, &rx, warm).await?;
        }

        let (mut raw, mut mem, mut cpu) = (Series::default(), Series::default(), 0.0);
        for _ in 0..rounds {
            raw.add(n, publ.slice(RAW, &rx, n).await?);
            let before = g.sample().cpu_s;
            mem.add(n, publ.slice(MEMORY, &rx, n).await?);
            cpu += g.sample().cpu_s - before;
        }
        let ratio = mem.rate() / raw.rate().max(1e-9);
        let (lo, hi) = mem.spread(&raw);
        let cpu_us = cpu * 1e6 / mem.events.max(1.0);
        println!(
            "  raw forwarder {:.0} msg/s; gridlet {:.0} events/s delivered = {ratio:.2} × raw (rounds {lo:.2}–{hi:.2}); gridlet CPU {cpu_us:.1} µs per event",
            raw.rate(),
            mem.rate()
        );
        self.rows.push(Row {
            name: "mqtt in: MQTT → gridlet → webhook".into(),
            publish_eps: mem.rate(),
            delivered_eps: mem.rate(),
            peak_rss: g.sample().hwm,
            cpu_s: cpu,
            accepted: mem.events as u64,
            delivered: mem.events as u64,
            note: format!(
                "{ratio:.2} × raw MQTT → HTTP forwarder ({:.0}/s), paired {rounds} rounds {lo:.2}–{hi:.2}",
                raw.rate()
            ),
            ..Row::default()
        });

        // The persisted route against the raw durable limit.
        let dir = self.root.join("mqtt-raw-durable");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let syncer =
            net::Syncer::start(&dir.join("sync.bin")).map_err(|e| format!("raw durable: {e}"))?;
        let durable_rx = Receiver::start_with(self.base, Some(syncer.clone()))
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        durable_rx.stats.sampling.store(false, Relaxed);
        let load = Load {
            conns: self.opts.conns,
            batch: 1,
            duration: self.opts.slice,
            max_events: u64::MAX,
            rate: None,
            path: "/raw".into(),
            event_bytes: net::EVENT_BYTES,
        };
        let (mut durable, mut pers, mut pcpu) = (Series::default(), Series::default(), 0.0);
        for _ in 0..rounds {
            let p = net::publish(durable_rx.addr, &load, self.base).await;
            durable.add(p.accepted, p.elapsed.as_secs_f64());
            let before = g.sample().cpu_s;
            pers.add(n, publ.slice(PERSISTED, &rx, n).await?);
            pcpu += g.sample().cpu_s - before;
        }
        syncer.stop();
        let pratio = pers.rate() / durable.rate().max(1e-9);
        let (plo, phi) = pers.spread(&durable);
        let pcpu_us = pcpu * 1e6 / pers.events.max(1.0);
        println!(
            "  raw durable {:.0} events/s; gridlet QoS 1 persisted {:.0} events/s = {pratio:.2} × raw durable (rounds {plo:.2}–{phi:.2}); gridlet CPU {pcpu_us:.1} µs per event",
            durable.rate(),
            pers.rate()
        );
        self.rows.push(Row {
            name: "mqtt in: QoS 1 persisted → webhook".into(),
            publish_eps: pers.rate(),
            delivered_eps: pers.rate(),
            peak_rss: g.sample().hwm,
            cpu_s: pcpu,
            accepted: pers.events as u64,
            delivered: pers.events as u64,
            note: format!(
                "{pratio:.2} × raw durable ({:.0}/s), paired {rounds} rounds {plo:.2}–{phi:.2}",
                durable.rate()
            ),
            ..Row::default()
        });
        let fig = self
            .figures
            .entry("mqtt")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(m) = fig.as_object_mut() {
            m.insert(
                "source".into(),
                serde_json::json!({
                    "messages_per_slice": n,
                    "receive_maximum": self.opts.mqtt_receive_maximum,
                    "rounds": rounds,
                    "raw_forwarder_eps": raw.rate().round(),
                    "gridlet_eps": mem.rate().round(),
                    "ratio": crate::report::round2(ratio),
                    "ratio_lowest": crate::report::round2(lo),
                    "ratio_highest": crate::report::round2(hi),
                    "cpu_us_per_event": crate::report::round1(cpu_us),
                    "persisted_eps": pers.rate().round(),
                    "raw_durable_eps": durable.rate().round(),
                    "persisted_ratio": crate::report::round2(pratio),
                    "persisted_ratio_lowest": crate::report::round2(plo),
                    "persisted_ratio_highest": crate::report::round2(phi),
                    "persisted_cpu_us_per_event": crate::report::round1(pcpu_us),
                }),
            );
        }
        Ok(())
    }

    /// gridlet with an MQTT connection to `broker` and two routes: `in/g/#` to an in-memory
    /// webhook subscription, `in/p/#` to a persisted one, both to `rx`.
    async fn source_gridlet(&self, broker: &Mosquitto, rx: &Receiver) -> Result<Gridlet, String> {
        let url = format!("mqtt://127.0.0.1:{}", broker.port);
        let receive_maximum = self.opts.mqtt_receive_maximum.to_string();
        let g = Gridlet::start(&self.spec(
            "mqtt-in",
            &[
                ("mqtt__connections__bench__url", url.as_str()),
                ("mqtt__connections__bench__clientId", "gridlet-bench"),
                (
                    "mqtt__connections__bench__receiveMaximum",
                    receive_maximum.as_str(),
                ),
                ("mqtt__routes__g__connection", "bench"),
                ("mqtt__routes__g__topicFilter", "in/g/#"),
                ("mqtt__routes__g__topic", crate::TOPIC),
                ("mqtt__routes__p__connection", "bench"),
                ("mqtt__routes__p__topicFilter", "in/p/#"),
                ("mqtt__routes__p__topic", PERSISTED_TOPIC),
            ],
        ))
        .await?;
        for (topic, persisted) in [(crate::TOPIC, false), (PERSISTED_TOPIC, true)] {
            put(g.addr, format!("/topics/{topic}?{API}"), "{}".into()).await?;
            let body = serde_json::json!({"properties": {
                "persistencePolicy": {"isPersisted": persisted},
                "destination": {"endpointType": "WebHook",
                    "properties": {"endpointUrl": rx.url(&format!("/{topic}"))}}}});
            put(
                g.addr,
                format!("/topics/{topic}/eventSubscriptions/s0?{API}"),
                body.to_string(),
            )
            .await?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while crate::labelled_sum(&g, "gridlet_mqtt_connected{")
            .await
            .unwrap_or(0)
            == 0
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "gridlet's MQTT source did not connect within 30 s:\n{}",
                    g.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(g)
    }

    /// Messages per MQTT slice (`--mqtt-messages`; quick 2,000, else 20,000).
    pub(crate) fn mqtt_messages(&self) -> u64 {
        self.opts
            .mqtt_messages
            .unwrap_or(if self.opts.quick { 2_000 } else { 20_000 })
    }
}
