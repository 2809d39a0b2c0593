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

fn binary() -> PathBuf {
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

/// One Mosquitto on a loopback port, its persistence and log in `dir`.
pub struct Mosquitto {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// Extra configuration (another listener).
    extra: String,
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
    /// Start a broker (anonymous, persistent sessions, no bound on queued messages).
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, String::new()).await
    }

    /// [`Mosquitto::start`] with `extra` appended to the configuration.
    pub async fn start_with(dir: &Path, extra: String) -> Self {
        let mut m = Self {
            child: None,
            port: free_port(),
            dir: dir.to_path_buf(),
            extra,
        };
        m.spawn().await;
        m
    }

    /// A broker with, besides the plain listener, a TLS listener on the returned port that
    /// requires a client certificate from `pki`'s CA.
    pub async fn start_tls(dir: &Path, pki: &crate::edge::Pki) -> (Self, u16) {
        let server = pki.issue("localhost", &["localhost"], false);
        let w = |name: &str, data: &str| {
            let p = dir.join(name);
            std::fs::write(&p, data).unwrap();
            p.display().to_string()
        };
        let ca = w("broker-ca.pem", &pki.ca_pem);
        let cert = w("broker-server.pem", &server.chain_pem);
        let key = w("broker-server.key", &server.key_pem);
        let port = free_port();
        let extra = format!(
            "listener {port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n\
             require_certificate true\n"
        );
        let m = Self::start_with(dir, extra).await;
        let up = poll_within(WAIT, || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(drop)
        })
        .await;
        assert!(up.is_ok(), "mosquitto's TLS listener: {}", m.log());
        (m, port)
    }

    async fn spawn(&mut self) {
        let conf = self.dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "user root\nallow_anonymous true\npersistence true\npersistence_location {}/\n\
                 max_queued_messages 0\nlog_dest stderr\nlog_type error\nlog_type warning\n\
                 listener {} 127.0.0.1\n{}",
                self.dir.display(),
                self.port,
                self.extra
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("mosquitto.log"))
            .unwrap();
        let child = Command::new(binary())
            .args(["-c", conf.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("mosquitto starts");
        self.child = Some(child);
        let port = self.port;
        let up = poll_within(WAIT, || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(drop)
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

    /// Start again on the same port with the saved sessions.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
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
