//! The refresher's schedule on tokio's paused clock, with a [`Source`] that answers at once from
//! a script (the HTTPS source against a real peer is `tests/it/entra_refresh.rs`).

use super::*;
use crate::config::{Jwk, JwksRefresh};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const EVERY: u64 = 3600;
const MIN: u64 = 300;

fn doc(kid: &str) -> String {
    format!(r#"{{"keys":[{{"kty":"RSA","kid":"{kid}","n":"AQAB","e":"AQAB"}}]}}"#)
}

/// Answers from `script`, then with [`doc`]`("last")`; counts the fetches.
#[derive(Default)]
struct Script {
    script: Mutex<VecDeque<Result<String, String>>>,
    fetches: AtomicUsize,
}

impl Source for Script {
    fn fetch(&self) -> BoxFuture<'_, Result<String, String>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let next = crate::sync::lock(&self.script).pop_front();
        Box::pin(std::future::ready(next.unwrap_or_else(|| Ok(doc("last")))))
    }
}

struct Running {
    keys: Arc<Keys>,
    source: Arc<Script>,
    _stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn fetches(&self) -> usize {
        self.source.fetches.load(Ordering::SeqCst)
    }

    fn kids(&self) -> Vec<String> {
        self.keys.current().iter().map(|k| k.kid.clone()).collect()
    }
}

fn refresh(dir: &Path) -> JwksRefresh {
    JwksRefresh {
        metadata_url: "https://login.example/t/v2.0/.well-known/openid-configuration".into(),
        every: Duration::from_secs(EVERY),
        min_interval: Duration::from_secs(MIN),
        cache_path: dir.join("entra-jwks.json"),
    }
}

fn start(script: Vec<Result<String, String>>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let keys = Arc::new(Keys::new(Vec::<Jwk>::new(), Some(refresh(dir.path()))));
    let source = Arc::new(Script {
        script: Mutex::new(script.into()),
        ..Script::default()
    });
    let (stop, rx) = watch::channel(false);
    tokio::spawn(run(
        keys.clone(),
        source.clone(),
        Clock::anchored_at(1_700_000_000_000),
        rx,
    ));
    Running {
        keys,
        source,
        _stop: stop,
        _dir: dir,
    }
}

async fn after(secs: u64) {
    tokio::time::sleep(Duration::from_millis(secs * 1000)).await;
    // Let the refresher run what became due.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn fetches_at_start_then_every_interval_and_backs_off_after_failures() {
    let r = start(vec![
        Ok(doc("a")),
        Err("offline".into()),
        Err("offline".into()),
        Ok("not json".into()),
        Ok(doc("b")),
    ]);
    after(0).await;
    assert_eq!((r.fetches(), r.kids()), (1, vec!["a".to_string()]));
    after(EVERY - 1).await;
    assert_eq!(r.fetches(), 1, "not before the interval");
    after(1).await;
    assert_eq!(r.fetches(), 2, "the interval's fetch fails");
    // Then MIN, 2 MIN, 4 MIN later: the keys stay meanwhile.
    after(MIN - 1).await;
    assert_eq!(r.fetches(), 2);
    after(1).await;
    assert_eq!(r.fetches(), 3);
    after(2 * MIN).await;
    assert_eq!(r.fetches(), 4, "an unusable set counts as a failure");
    assert_eq!(r.kids(), ["a"]);
    let st = r.keys.status(r.keys.fetched().unwrap().at_ms);
    assert_eq!((st.successes, st.failures), (1, 3));
    assert!(
        st.last_error.unwrap().contains("not usable"),
        "the reason is kept"
    );
    after(4 * MIN).await;
    assert_eq!((r.fetches(), r.kids()), (5, vec!["b".to_string()]));
    assert!(r.keys.status(0).last_error.is_none());
    after(EVERY - 1).await;
    assert_eq!(r.fetches(), 5, "back to the interval");
    after(1).await;
    assert_eq!(r.fetches(), 6);
}

#[test]
fn the_back_off_doubles_up_to_the_interval() {
    let s = |n| backoff(Duration::from_secs(MIN), Duration::from_secs(EVERY), n).as_secs();
    assert_eq!(
        [s(1), s(2), s(3), s(4), s(5), s(60)],
        [300, 600, 1200, 2400, 3600, 3600]
    );
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_unknown_key_ids_makes_one_fetch_per_min_interval() {
    let r = start(vec![Ok(doc("a"))]);
    after(0).await;
    assert_eq!(r.fetches(), 1);
    // A token with an unknown kid every 100 ms for 20 minutes: 12,001 tokens.
    let mut waited = 0;
    for _ in 0..=12_000 {
        if let Some(mut rx) = r.keys.ask_for_fetch(Instant::now()) {
            let _ = rx.changed().await;
            waited += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One fetch per MIN on their account, the first at once: at 0, 300, 600, 900 and 1200 s
    // (besides the start's).
    assert_eq!(r.fetches(), 6);
    assert_eq!(waited, 5, "only the tokens that asked for a fetch waited");
    assert_eq!(r.kids(), ["last"], "the fetched set replaced the first");
}

#[tokio::test(start_paused = true)]
async fn a_token_waits_for_the_fetch_it_asked_for_and_sees_the_new_key() {
    let r = start(vec![Ok(doc("a")), Ok(doc("rotated"))]);
    // Right after the start's fetch: a token's first request is not held back by it.
    after(0).await;
    let mut rx = r.keys.ask_for_fetch(Instant::now()).expect("a fetch");
    rx.changed().await.unwrap();
    assert_eq!((r.fetches(), r.kids()), (2, vec!["rotated".to_string()]));
}

#[tokio::test]
async fn the_cache_holds_the_last_set_for_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = refresh(dir.path());
    write_cache(&cfg.cache_path, &cfg.metadata_url, 42_000, &doc("cached")).unwrap();
    let keys = Keys::new(Vec::new(), Some(cfg.clone()));
    restore_cache(&keys);
    let f = keys.fetched().unwrap();
    assert_eq!(
        (f.at_ms, f.from_cache, f.keys[0].kid.as_str()),
        (42_000, true, "cached")
    );
    // Another authority's cache, or a damaged one, is ignored.
    let other = JwksRefresh {
        metadata_url: "https://login.example/other/v2.0/.well-known/openid-configuration".into(),
        ..cfg.clone()
    };
    let keys = Keys::new(Vec::new(), Some(other));
    restore_cache(&keys);
    assert!(keys.fetched().is_none());
    std::fs::write(&cfg.cache_path, "{").unwrap();
    let keys = Keys::new(Vec::new(), Some(cfg));
    restore_cache(&keys);
    assert!(keys.fetched().is_none());
}
