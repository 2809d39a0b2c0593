//! A real Mosquitto (Debian's `mosquitto`, MQTT 5) for the MQTT tests, and a real MQTT 5
//! client (rumqttc) to publish to it. Persistence is on, so a broker stopped with SIGTERM and
//! started again keeps its sessions (and the messages queued in them).

#![allow(dead_code)]

use crate::util::free_port;
use crate::util::{poll_within, WAIT};
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub fn binary() -> PathBuf {
    for p in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "mosquitto is not installed: the MQTT tests use a real broker. \
         Install it with `sudo apt-get install -y mosquitto` (scripts/test.sh does)."
    );
}

/// How a broker is set up beyond one anonymous plain listener on loopback.
#[derive(Default)]
pub struct Options {
    /// The plain listener's port; a free one when `None` (a test that starts a broker late
    /// on a port it gave gridlet earlier passes it).
    pub port: Option<u16>,
    /// Keep sessions on disk, so a broker stopped with SIGTERM and started again still has
    /// the messages queued in them (and no bound on how many).
    pub persistent: bool,
    /// Log every client's connect (`log_type all`), for tests that count connects.
    pub log_connects: bool,
    /// The rules of an ACL file (`user ...`, `topic write allowed/#` ...).
    pub acl: Option<String>,
    /// A TLS listener besides the plain one.
    pub tls: Option<TlsListener>,
}

/// A TLS listener's certificate, and whether clients must show one from `ca`.
pub struct TlsListener {
    pub ca_pem: String,
    pub chain_pem: String,
    pub key_pem: String,
    pub require_client_cert: bool,
}

/// One Mosquitto on loopback, its configuration, log (and persistence) in `dir`. Killed on drop.
pub struct Mosquitto {
    child: Option<Child>,
    /// The plain listener.
    pub port: u16,
    /// The TLS listener, when [`Options::tls`] asked for one.
    pub tls_port: Option<u16>,
    conf: PathBuf,
    log: PathBuf,
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Mosquitto {
    /// A broker with persistent sessions, the one the MQTT source tests restart.
    pub async fn start(dir: &Path) -> Self {
        Self::start_opts(
            dir,
            Options {
                persistent: true,
                ..Options::default()
            },
        )
        .await
    }

    /// [`Mosquitto::start`] with a TLS listener (on the returned port) that requires a client
    /// certificate from `pki`'s CA.
    pub async fn start_tls(dir: &Path, pki: &crate::edge::Pki) -> (Self, u16) {
        let server = pki.issue("localhost", &["localhost"], false);
        let tls = TlsListener {
            ca_pem: pki.ca_pem.clone(),
            chain_pem: server.chain_pem,
            key_pem: server.key_pem,
            require_client_cert: true,
        };
        let opts = Options {
            persistent: true,
            tls: Some(tls),
            ..Options::default()
        };
        let m = Self::start_opts(dir, opts).await;
        let port = m.tls_port();
        (m, port)
    }

    /// A broker as `opts` say, up and listening on every port when this returns.
    pub async fn start_opts(dir: &Path, opts: Options) -> Self {
        let port = opts.port.unwrap_or_else(free_port);
        let tls_port = opts.tls.as_ref().map(|_| free_port());
        let write = |name: String, data: &str| {
            let p = dir.join(name);
            std::fs::write(&p, data).unwrap();
            p.display().to_string()
        };
        let mut conf = String::from("user root\nallow_anonymous true\nlog_dest stderr\n");
        if opts.persistent {
            conf += &format!(
                "persistence true\npersistence_location {}/\nmax_queued_messages 0\n",
                dir.display()
            );
        } else {
            conf += "persistence false\n";
        }
        conf += if opts.log_connects {
            "log_type all\n"
        } else {
            "log_type error\nlog_type warning\n"
        };
        if let Some(rules) = &opts.acl {
            conf += &format!(
                "acl_file {}\n",
                write(format!("mosquitto-{port}.acl"), rules)
            );
        }
        conf += &format!("listener {port} 127.0.0.1\n");
        if let (Some(tls), Some(tls_port)) = (&opts.tls, tls_port) {
            let ca = write(format!("mosquitto-{port}-ca.pem"), &tls.ca_pem);
            let cert = write(format!("mosquitto-{port}-server.pem"), &tls.chain_pem);
            let key = write(format!("mosquitto-{port}-server.key"), &tls.key_pem);
            conf += &format!(
                "listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n\
                 require_certificate {}\n",
                tls.require_client_cert
            );
        }
        let mut m = Self {
            child: None,
            port,
            tls_port,
            conf: PathBuf::from(write(format!("mosquitto-{port}.conf"), &conf)),
            log: dir.join(format!("mosquitto-{port}.log")),
        };
        m.spawn().await;
        m
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(binary())
            .args(["-c", self.conf.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("mosquitto starts");
        self.child = Some(child);
        let ports: Vec<u16> = std::iter::once(self.port).chain(self.tls_port).collect();
        let up = poll_within(WAIT, || {
            let ports = ports.clone();
            async move {
                for port in ports {
                    tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                }
                Ok::<(), std::io::Error>(())
            }
        })
        .await;
        assert!(up.is_ok(), "mosquitto did not listen: {}", self.log());
    }

    /// Stop with SIGTERM (Mosquitto saves its sessions) and wait for the exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id().to_string();
            Command::new("kill").args(["-TERM", &pid]).status().unwrap();
            c.wait().unwrap();
        }
    }

    /// Start again on the same ports with the saved sessions.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// The TLS listener's port; panics when the broker has none.
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("this broker was started without TLS")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// How many clients whose id starts with `prefix` connected (needs
    /// [`Options::log_connects`]).
    pub fn connects_as(&self, prefix: &str) -> usize {
        let as_prefix = format!(" as {prefix}");
        self.log()
            .lines()
            .filter(|l| l.contains("New client connected") && l.contains(&as_prefix))
            .count()
    }
}

/// One message to publish: topic, payload, MQTT 5 properties.
pub struct Msg {
    pub topic: String,
    pub payload: Vec<u8>,
    pub props: Option<PublishProperties>,
}

impl Msg {
    pub fn new(topic: &str, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            topic: topic.into(),
            payload: payload.into(),
            props: None,
        }
    }
}

/// Publish `msgs` at QoS `qos` as MQTT 5 client `id` and return once the broker acknowledged
/// every one (QoS 1; for QoS 0, once all are written).
pub async fn publish_all(port: u16, id: &str, qos: QoS, msgs: Vec<Msg>) {
    let mut opts = MqttOptions::new(id, "127.0.0.1", port);
    opts.set_keep_alive(Duration::from_secs(30));
    let n = msgs.len();
    let (client, mut el) = AsyncClient::new(opts, n + 10);
    for m in msgs {
        match m.props {
            Some(p) => client
                .publish_with_properties(m.topic, qos, false, m.payload, p)
                .await
                .unwrap(),
            None => client
                .publish(m.topic, qos, false, m.payload)
                .await
                .unwrap(),
        }
    }
    let done = tokio::time::timeout(WAIT * 3, async {
        let mut acked = 0;
        let mut sent = 0;
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(Event::Outgoing(rumqttc::Outgoing::Publish(_))) => sent += 1,
                Ok(_) => {}
                Err(e) => panic!("publisher: {e}"),
            }
            if (qos == QoS::AtLeastOnce && acked == n) || (qos == QoS::AtMostOnce && sent == n) {
                break;
            }
        }
        let _ = client.disconnect().await;
        // Flush the DISCONNECT.
        let _ = tokio::time::timeout(Duration::from_secs(1), el.poll()).await;
    })
    .await;
    assert!(
        done.is_ok(),
        "the broker did not acknowledge all {n} messages"
    );
}
