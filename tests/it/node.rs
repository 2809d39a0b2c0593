//! A gridlet on fixed directories that can be stopped and started again, at any wall time
//! (the clock seam), for the restart tests in `persistence` and `durable_resilience`.

use crate::util::*;
use gridlet::clock::Clock;
use gridlet::{Config, Gridlet, Parts};
use serde_json::Value;
use std::path::Path;

/// Wall time of the first start in restart tests.
pub const T0: u64 = 1_800_000_000_000;
/// One minute in wall milliseconds.
pub const MIN: u64 = 60_000;
/// Metric labels of subscription `s1` on topic `t1`.
pub const SUB: &str = r#"topic="t1",subscription="s1""#;

/// A running gridlet and a client for it.
pub struct Node {
    pub g: Gridlet,
    pub base: String,
    pub client: reqwest::Client,
}

fn config(dir: &Path, extra: &[(&str, &str)]) -> Config {
    let mut env = base_env(dir);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::from_vars(env).expect("valid test config")
}

/// Start gridlet on `dir`'s data directories; `wall_ms` anchors its wall clock.
pub async fn try_node(
    dir: &Path,
    extra: &[(&str, &str)],
    wall_ms: Option<u64>,
) -> Result<Node, gridlet::server::StartError> {
    let parts = Parts {
        clock: wall_ms.map(Clock::anchored_at),
        ..Parts::default()
    };
    let g = Gridlet::start(config(dir, extra), parts).await?;
    let base = format!("http://{}", g.http_addr.expect("http listener"));
    Ok(Node {
        g,
        base,
        client: reqwest::Client::new(),
    })
}

/// [`try_node`], which must succeed.
pub async fn node(dir: &Path, extra: &[(&str, &str)], wall_ms: Option<u64>) -> Node {
    try_node(dir, extra, wall_ms).await.expect("gridlet starts")
}

impl Node {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}?{}", self.base, path, V)
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .put(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// GET that must answer 200.
    pub async fn get(&self, path: &str) -> Value {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        let v = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 200, "{v}");
        v
    }

    pub async fn metric(&self, name: &str, labels: &str) -> u64 {
        let text = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric(&text, name, labels).unwrap_or(0)
    }

    /// Wait until a counter reaches `want` (an effect of a delivery the test already observed at
    /// the receiver; bounded by [`WAIT`]).
    pub async fn wait_metric(&self, name: &str, labels: &str, want: u64) {
        eventually(&format!("{name}{{{labels}}} >= {want}"), || async {
            let v = self.metric(name, labels).await;
            if v >= want {
                Ok(())
            } else {
                Err(format!("{v}"))
            }
        })
        .await
    }

    pub async fn stop(self) {
        self.g.shutdown().await;
    }
}
