//! The signing keys tokens are verified with, while gridlet runs: the JWKS file's (fixed) and
//! the tenant's current set (replaced by each successful fetch, or read from the cache at
//! start), and what the refresher is doing.
//!
//! A token naming an unknown key id asks for a fetch ([`Keys::ask_for_fetch`]): it gets one at
//! once unless a token asked for one less than `jwksMinRefreshIntervalInSeconds` ago, and waits
//! for an attempt in progress. So however many bad tokens arrive, there is at most one fetch per
//! interval on their account (besides the scheduled ones); a key rolled just after a scheduled
//! fetch is still fetched for the first token that names it.

use crate::config::{Jwk, JwksRefresh, Key};
use crate::sync::{read, write};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// The keys, shared by the API's guard and the refresher. Cheap to read: one lock and an `Arc`.
pub struct Keys {
    file: Vec<Jwk>,
    /// `None`: keys are never fetched (`jwksRefreshIntervalInSeconds=0`).
    refresh: Option<JwksRefresh>,
    state: RwLock<State>,
    /// Wakes the refresher for a token's unknown key id.
    wake: Notify,
    /// Counts finished attempts: a request waiting for a fetch watches it.
    attempts: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// The file's keys and the fetched ones, together.
    all: Arc<[Jwk]>,
    fetched: Option<Fetched>,
    /// An attempt has been asked for or is running.
    fetching: bool,
    /// When a token last asked for an attempt.
    last_asked: Option<Instant>,
    /// Why the last attempt failed, while no later one succeeded.
    last_error: Option<String>,
    successes: u64,
    failures: u64,
}

/// The tenant's current key set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Its keys.
    pub keys: Vec<Jwk>,
    /// When it was fetched (the broker's clock, wall milliseconds), possibly by an earlier run.
    pub at_ms: u64,
    /// Read from the cache at start rather than fetched by this run.
    pub from_cache: bool,
}

/// What the readiness detail and the metrics show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Keys in use (file and fetched).
    pub keys: usize,
    /// The fetched set's age in seconds, if there is one.
    pub age_secs: Option<u64>,
    /// Keys are fetched, and none was fetched within two refresh intervals: Microsoft may have
    /// rolled its keys since.
    pub stale: bool,
    /// Successful fetches by this run.
    pub successes: u64,
    /// Failed fetches by this run.
    pub failures: u64,
    /// Why the last fetch failed, while none succeeded since.
    pub last_error: Option<String>,
}

impl Keys {
    /// The JWKS file's keys, and the fetch settings (`None`: the file only).
    pub fn new(file: Vec<Jwk>, refresh: Option<JwksRefresh>) -> Self {
        let (attempts, _) = watch::channel(0);
        let state = State {
            all: file.clone().into(),
            ..State::default()
        };
        Self {
            file,
            refresh,
            state: RwLock::new(state),
            wake: Notify::new(),
            attempts,
        }
    }

    /// The fetch settings, when keys are fetched.
    pub fn refresh(&self) -> Option<&JwksRefresh> {
        self.refresh.as_ref()
    }

    /// Every key a token may be signed with now.
    pub fn current(&self) -> Arc<[Jwk]> {
        read(&self.state).all.clone()
    }

    /// The fetched set in use, if any.
    pub fn fetched(&self) -> Option<Fetched> {
        read(&self.state).fetched.clone()
    }

    /// A token named a key id none of the keys has, at `now`: a receiver that changes when the
    /// fetch that may know it has finished, or `None` when no fetch will come for it (keys are
    /// not fetched, or a token asked less than the minimum interval ago).
    pub fn ask_for_fetch(&self, now: Instant) -> Option<watch::Receiver<u64>> {
        let min = self.refresh.as_ref()?.min_interval;
        let rx = self.attempts.subscribe();
        let mut s = write(&self.state);
        if s.fetching {
            return Some(rx);
        }
        if s.last_asked.is_some_and(|t| now < t + min) {
            return None;
        }
        s.fetching = true;
        s.last_asked = Some(now);
        drop(s);
        self.wake.notify_one();
        Some(rx)
    }

    /// Wait until a token asks for a fetch.
    pub(super) async fn asked(&self) {
        self.wake.notified().await;
    }

    /// An attempt starts (the refresher's schedule, or a token's request). False when nothing
    /// asked for one (a wake-up left over from an attempt already made).
    pub(super) fn begin(&self, scheduled: bool) -> bool {
        let mut s = write(&self.state);
        if !scheduled && !s.fetching {
            return false;
        }
        s.fetching = true;
        true
    }

    /// The attempt ended: with the fetched keys (which replace the previous set), or why not.
    pub(super) fn finish(&self, outcome: Result<Fetched, String>) {
        let mut s = write(&self.state);
        s.fetching = false;
        match outcome {
            Ok(f) => {
                if !f.from_cache {
                    s.successes += 1;
                }
                s.last_error = None;
                self.install(&mut s, f);
            }
            Err(e) => {
                s.failures += 1;
                s.last_error = Some(e);
            }
        }
        drop(s);
        self.attempts.send_modify(|n| *n += 1);
    }

    /// The cached set read at start, unless a fetch has already replaced it.
    pub(super) fn restore(&self, f: Fetched) {
        let mut s = write(&self.state);
        if s.fetched.is_none() {
            self.install(&mut s, f);
        }
    }

    fn install(&self, s: &mut State, f: Fetched) {
        let mut all = self.file.clone();
        all.extend(f.keys.iter().filter(|k| !self.file.contains(k)).cloned());
        s.all = all.into();
        s.fetched = Some(f);
    }

    /// The key set's state at `now_ms` (the broker's clock).
    pub fn status(&self, now_ms: u64) -> Status {
        let s = read(&self.state);
        let age_secs = s
            .fetched
            .as_ref()
            .map(|f| now_ms.saturating_sub(f.at_ms) / 1000);
        let stale = self.refresh.as_ref().is_some_and(|r| {
            age_secs.is_none_or(|a| Duration::from_secs(a) > r.every.saturating_mul(2))
        });
        Status {
            keys: s.all.len(),
            age_secs,
            stale,
            successes: s.successes,
            failures: s.failures,
            last_error: s.last_error.clone(),
        }
    }

    /// The readiness detail: one line.
    pub fn line(&self, now_ms: u64) -> String {
        let st = self.status(now_ms);
        let mut line = format!("entra signing keys: {}", st.keys);
        if self.refresh.is_none() {
            line.push_str(&format!(
                " from {} (not fetched)",
                Key::inbound__clientAuth__entra__jwksPath.name()
            ));
            return line;
        }
        match (st.age_secs, self.fetched().is_some_and(|f| f.from_cache)) {
            (Some(a), false) => line.push_str(&format!(", fetched {a} s ago")),
            (Some(a), true) => line.push_str(&format!(", from the cache, fetched {a} s ago")),
            (None, _) => line.push_str(", none fetched yet"),
        }
        if st.stale {
            line.push_str(
                "; stale: no fetch succeeded within two refresh intervals, tokens signed with new keys are refused",
            );
        }
        if let Some(e) = st.last_error {
            line.push_str("; last fetch failed: ");
            line.push_str(&e.replace('\n', " "));
        }
        line
    }
}

impl crate::metrics::EntraStatus for Keys {
    fn view(&self, now_ms: u64) -> crate::metrics::EntraView {
        let st = self.status(now_ms);
        crate::metrics::EntraView {
            keys: st.keys as u64,
            age_secs: st.age_secs,
            stale: st.stale,
            fetched: st.successes,
            failed: st.failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kid: &str) -> Jwk {
        Jwk {
            kid: kid.into(),
            n: vec![1],
            e: vec![1],
        }
    }

    fn keys() -> Keys {
        Keys::new(
            vec![key("file")],
            Some(JwksRefresh {
                metadata_url: "https://h/t/v2.0/.well-known/openid-configuration".into(),
                every: Duration::from_secs(3600),
                min_interval: Duration::from_secs(300),
                cache_path: "unused".into(),
            }),
        )
    }

    fn fetched(kids: &[&str], at_ms: u64) -> Fetched {
        Fetched {
            keys: kids.iter().map(|k| key(k)).collect(),
            at_ms,
            from_cache: false,
        }
    }

    fn kids(k: &Keys) -> Vec<String> {
        k.current().iter().map(|k| k.kid.clone()).collect()
    }

    #[test]
    fn a_fetched_set_replaces_the_last_and_keeps_the_files_keys() {
        let k = keys();
        k.restore(Fetched {
            from_cache: true,
            ..fetched(&["old"], 0)
        });
        assert_eq!(kids(&k), ["file", "old"]);
        k.finish(Ok(fetched(&["a", "b"], 1000)));
        assert_eq!(kids(&k), ["file", "a", "b"]);
        // The cache never replaces a fetched set.
        k.restore(fetched(&["old"], 0));
        assert_eq!(kids(&k), ["file", "a", "b"]);
        k.finish(Err("offline".into()));
        assert_eq!(kids(&k), ["file", "a", "b"], "a failure keeps the keys");
        let st = k.status(11_000);
        assert_eq!(
            (st.age_secs, st.stale, st.successes, st.failures),
            (Some(10), false, 1, 1)
        );
        assert!(k.line(11_000).contains("last fetch failed: offline"));
        // Two refresh intervals without a fetch: stale.
        assert!(k.status(1000 + 7_201_000).stale);
        assert!(k.line(1000 + 7_201_000).contains("stale"));
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_key_ids_ask_for_at_most_one_fetch_per_interval() {
        let k = keys();
        let t0 = Instant::now();
        let first = k.ask_for_fetch(t0).expect("a fetch");
        // While it runs, others wait for the same one.
        assert!(k.ask_for_fetch(t0).is_some());
        assert!(k.begin(false), "the refresher takes the request");
        k.finish(Err("down".into()));
        assert!(first.has_changed().unwrap());
        // Within the interval, refused at once: no wait, no fetch.
        for s in [0, 1, 299] {
            assert!(k.ask_for_fetch(t0 + Duration::from_secs(s)).is_none());
        }
        assert!(!k.begin(false), "no leftover request");
        assert!(k.ask_for_fetch(t0 + Duration::from_secs(300)).is_some());
        // Keys not fetched: nothing to wait for.
        assert!(Keys::new(vec![key("f")], None).ask_for_fetch(t0).is_none());
    }
}
