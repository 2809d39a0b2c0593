//! Scenario `azure` (opt-in: `--scenario azure`, not part of `all`): delivery to a Storage queue
//! in Azurite beside webhook delivery, with the raw Azurite limit measured in the same run.
//!
//! * raw: 16, then 64 loops put 1-event messages straight into an Azurite queue with gridlet's
//!   own Put Message client (no broker), after a 1 s unmeasured warm-up, and again after the
//!   gridlet runs (Azurite is one Node.js process; its rate moves with the machine's load): the
//!   best of the four is the most Azurite takes on this machine;
//! * gridlet: `--backlog`-sized runs (2,000 with `--quick`) published in batches of 100 to one
//!   subscription, timed from the first publish until `DeliverySuccessCounts` reaches the count:
//!   webhook and Storage queue, each with batching off (`maxEventsPerBatch` 1) and on (50; a Storage
//!   queue batch is 50 Put Messages, 16 in flight at once).
//!
//! Skipped with a message when Azurite is not installed (`scripts/test.sh` installs it under
//! `~/.cache/gridlet/azurite`; `GRIDLET_AZURITE` points at another install).

use crate::child::{free_port, Gridlet};
use crate::net::{self, Load, Receiver};
use crate::{Bench, Row, API, TOPIC};
use bytes::Bytes;
use gridlet::delivery::sink::{DeliveryRequest, Outcome, Sink};
use gridlet::model::azure::{MessageEncoding, StorageConn, DEV_ACCOUNT, DEV_KEY};
use gridlet::model::topic::EventSchema;
use gridlet::outbound::azure::sharedkey::{SharedKey, Signed, VERSION};
use gridlet::outbound::azure::storage::StorageQueueSink;
use gridlet::outbound::http::HttpClient;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Concurrent raw Put Message loops: as many as one gridlet batch sends at once, and more.
const PARALLEL: [usize; 2] = [16, 64];

fn azurite_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GRIDLET_AZURITE") {
        return Some(PathBuf::from(p));
    }
    let p = PathBuf::from(std::env::var_os("HOME")?)
        .join(".cache/gridlet/azurite/node_modules/.bin/azurite");
    p.exists().then_some(p)
}

/// Azurite as a child process, killed on drop.
struct Azurite {
    child: Child,
    queue_port: u16,
    _dir: tempfile_dir::Dir,
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory removed on drop (the bench has no tempfile dependency).
mod tempfile_dir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Azurite {
    async fn start(bin: PathBuf, dir: PathBuf) -> Result<Self, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("azurite dir: {e}"))?;
        let port = |what: &str| free_port().map_err(|e| format!("{what} port: {e}"));
        let (queue_port, blob_port, table_port) = (port("queue")?, port("blob")?, port("table")?);
        let child = Command::new(bin)
            .arg("--location")
            .arg(&dir)
            .args([
                "--silent",
                "--skipApiVersionCheck",
                "--loose",
                "--disableTelemetry",
            ])
            .args(["--queueHost", "127.0.0.1", "--blobHost", "127.0.0.1"])
            .args(["--tableHost", "127.0.0.1"])
            .args(["--queuePort", &queue_port.to_string()])
            .args(["--blobPort", &blob_port.to_string()])
            .args(["--tablePort", &table_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("azurite: {e}"))?;
        let a = Self {
            child,
            queue_port,
            _dir: tempfile_dir::Dir(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", queue_port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err("azurite did not listen within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(a)
    }

    fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};QueueEndpoint=http://127.0.0.1:{}/{DEV_ACCOUNT}",
            self.queue_port
        )
    }

    /// Create Queue (signed with the development key).
    async fn create_queue(&self, client: &HttpClient, name: &str) -> Result<(), String> {
        let path = format!("/{DEV_ACCOUNT}/{name}");
        let url = format!("http://127.0.0.1:{}{path}", self.queue_port);
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let key = SharedKey::new(DEV_ACCOUNT, DEV_KEY).ok_or("development key")?;
        let signed = Signed {
            method: "PUT",
            path: &path,
            query: &[],
            content_length: 0,
            content_type: "",
            ms_headers: &[("x-ms-date", &date), ("x-ms-version", VERSION)],
        };
        let mut h = hyper::HeaderMap::new();
        let v = |s: &str| hyper::header::HeaderValue::from_str(s).map_err(|e| e.to_string());
        h.insert("x-ms-date", v(&date)?);
        h.insert("x-ms-version", v(VERSION)?);
        h.insert(
            hyper::header::AUTHORIZATION,
            key.authorization(&signed).ok_or("signature")?,
        );
        let ep = client.endpoint(&url).map_err(|e| e.to_string())?;
        let r = ep
            .send(hyper::Method::PUT, h, Bytes::new())
            .await
            .map_err(|e| format!("create queue: {e}"))?;
        match r.status.as_u16() {
            201 | 204 => Ok(()),
            s => Err(format!("create queue {name}: HTTP {s}")),
        }
    }
}

/// A 256-byte-ish event like the other scenarios'.
fn event(i: u64) -> Bytes {
    Bytes::from(format!(
        "{{\"id\":\"raw-{i}\",\"subject\":\"s\",\"eventType\":\"t\",\"eventTime\":\"2017-08-10T21:03:07+00:00\",\"dataVersion\":\"1.0\",\"topic\":\"{TOPIC}\",\"metadataVersion\":\"1\",\"data\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(70)
    ))
}

/// Sum of a labelled counter over every series, from `/metrics`.
async fn counter_sum(g: &Gridlet, name: &str) -> u64 {
    let Ok((200, text)) = net::request(g.addr, "GET", &format!("/metrics?{API}"), "").await else {
        return 0;
    };
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
        .sum()
}

impl Bench {
    pub(crate) async fn scenario_azure(&mut self) -> Result<(), String> {
        let Some(bin) = azurite_binary() else {
            println!(
                "\n== azure: skipped: Azurite is not installed (scripts/test.sh installs it under ~/.cache/gridlet/azurite; or set GRIDLET_AZURITE)"
            );
            return Ok(());
        };
        println!("\n== azure: delivery to a Storage queue (Azurite) beside webhook delivery");
        let az = Azurite::start(bin, self.root.join("azurite")).await?;
        gridlet::tls::install_default_provider();
        let tls = gridlet::tls::client_config(&gridlet::tls::OutboundTls {
            accept_any_server_cert: true,
            extra_roots_pem: None,
            identity: None,
        })
        .map_err(|e| format!("tls: {e}"))?;
        let client = HttpClient::new(tls, Duration::from_secs(60));
        // Warm-up: Node's JIT and Azurite's first writes.
        self.azurite_raw(&az, &client, 16, Duration::from_secs(1), "warm")
            .await?;
        let mut raw = 0.0f64;
        for p in PARALLEL {
            let r = self
                .azurite_raw(&az, &client, p, self.opts.duration, "before")
                .await?;
            println!("  raw Azurite, {p} concurrent Put Message loops: {r:.0} messages/s");
            raw = raw.max(r);
        }
        let n = if self.opts.quick { 2_000 } else { 20_000 };
        let mut results = Vec::new();
        for (label, batch) in [("batching off", 1u32), ("maxEventsPerBatch 50", 50)] {
            let eps = self.delivery_run("webhook", batch, n, None).await?;
            results.push((format!("webhook, {label}"), eps));
            let queue = format!("bench{batch}");
            az.create_queue(&client, &queue).await?;
            let dest = serde_json::json!({"endpointType": "StorageQueue", "properties": {
                "connectionString": az.connection_string(), "queueName": queue,
                "maxEventsPerBatch": batch}});
            let eps = self.delivery_run("storage", batch, n, Some(dest)).await?;
            results.push((format!("Storage queue, {label}"), eps));
        }
        for p in PARALLEL {
            let r = self
                .azurite_raw(&az, &client, p, self.opts.duration, "after")
                .await?;
            println!("  raw Azurite again, {p} concurrent Put Message loops: {r:.0} messages/s");
            raw = raw.max(r);
        }
        println!("  raw Azurite limit (best of the four): {raw:.0} messages/s");
        for (label, (publish, eps)) in &results {
            let vs_raw = if label.starts_with("Storage") {
                format!(" = {:.2} × raw Azurite", eps / raw.max(1.0))
            } else {
                String::new()
            };
            println!("  gridlet → {label}: {eps:.0} events/s delivered{vs_raw}");
            self.rows.push(Row {
                name: format!("azure: {label}"),
                publish_eps: *publish,
                delivered_eps: *eps,
                delivered: n,
                accepted: n,
                note: format!("raw Azurite {raw:.0}/s"),
                ..Row::default()
            });
        }
        Ok(())
    }

    /// Raw Put Message rate of `parallel` loops for `duration` (into a new queue named by `tag`).
    async fn azurite_raw(
        &self,
        az: &Azurite,
        client: &HttpClient,
        parallel: usize,
        duration: Duration,
        tag: &str,
    ) -> Result<f64, String> {
        let queue = format!("raw{tag}{parallel}");
        az.create_queue(client, &queue).await?;
        let conn = StorageConn::parse(&az.connection_string()).map_err(|e| e.to_string())?;
        let sink = Arc::new(StorageQueueSink::new(
            client,
            &conn,
            &queue,
            MessageEncoding::Base64,
            None,
        ));
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + duration;
        let mut tasks = Vec::new();
        for c in 0..parallel {
            let (sink, done, failed) = (sink.clone(), done.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = c as u64 * 1_000_000_000;
                while Instant::now() < deadline {
                    i += 1;
                    let req = DeliveryRequest {
                        topic: TOPIC.into(),
                        subscription: "raw".into(),
                        schema: EventSchema::EventGrid,
                        events: vec![event(i)],
                        attempt: 1,
                        attempts_each: Vec::new(),
                        batch_id: i,
                        trace: Default::default(),
                        time_left: Vec::new(),
                    };
                    if sink.send(&req).await == Outcome::Delivered {
                        done.fetch_add(1, Relaxed);
                    } else {
                        failed.fetch_add(1, Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let secs = started.elapsed().as_secs_f64();
        if failed.load(Relaxed) > 0 {
            return Err(format!("raw Put Message: {} failed", failed.load(Relaxed)));
        }
        Ok(done.load(Relaxed) as f64 / secs)
    }

    /// Publish `n` events (batches of 100) to a fresh gridlet with one subscription (`dest`, or
    /// a webhook to a bench receiver) and time until all are delivered: (published events/s,
    /// delivered events/s).
    async fn delivery_run(
        &self,
        name: &str,
        batch: u32,
        n: u64,
        dest: Option<serde_json::Value>,
    ) -> Result<(f64, f64), String> {
        let rx = Receiver::start(self.base)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let g = Gridlet::start(&self.spec(&format!("azure-{name}-{batch}"), &[])).await?;
        let (s, b) = net::request(g.addr, "PUT", &format!("/topics/{TOPIC}?{API}"), "{}").await?;
        if s != 200 {
            return Err(format!("create topic: HTTP {s}: {b}"));
        }
        let dest = dest.unwrap_or_else(|| {
            serde_json::json!({"endpointType": "WebHook", "properties": {
                "endpointUrl": rx.url("/s0"), "maxEventsPerBatch": batch}})
        });
        let body = serde_json::json!({"properties": {"destination": dest}});
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
                "{name}: only {} of {n} events accepted ({:?})",
                published.accepted, published.first_error
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let d = counter_sum(&g, "DeliverySuccessCounts").await;
            if d >= n {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{name}: {d} of {n} delivered within 600 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let publish = n as f64 / published.elapsed.as_secs_f64().max(1e-9);
        Ok((publish, n as f64 / started.elapsed().as_secs_f64()))
    }
}
