//! Damage in the event log, against the real binary (issue 36, section 1). A queue topic
//! receives 200 acknowledged events in 20 publishes of 10 (20 frames of one segment), gridlet
//! stops cleanly (leaving a checkpoint), the segment file is damaged, and gridlet starts again:
//! every event of an undamaged frame must still be delivered, and the loss reported three ways
//! (an error log line naming the file, `gridlet_store_damaged_events_total`, the `/readyz`
//! body). With `persistence__onDamage=refuse` gridlet does not start and changes nothing.
//!
//! Before this was fixed, a flipped byte in frame 0 lost all 200 events and in frame 10 the
//! last 100, logged as an unacknowledged torn tail; a damaged header deleted the file; a
//! truncated or deleted segment lost its events without a word. The same for dead letters: a
//! flipped byte in letter 10 of 20 lost the last 10 without a word (cut as a torn tail).

use crate::child::{command, Gridlet};
use crate::pull::{publish_batch, receive, settle, Ns};
use crate::util::free_port;
use serde_json::json;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const EVENTS: usize = 200;
const PER_PUBLISH: usize = 10;

/// A running gridlet and the pull client on it.
struct Proc {
    g: Gridlet,
    ns: Ns,
}

/// Settings every run here has besides [`crate::child::command`]'s.
const SETTINGS: [(&str, &str); 1] = [("metrics__reporterType", "prometheus")];

async fn spawn(dir: &Path, run: usize, extra: &[(&str, &str)]) -> Proc {
    let env: Vec<(&str, &str)> = SETTINGS.iter().chain(extra).copied().collect();
    let g = Gridlet::start(dir, run, &env).await;
    let ns = Ns {
        base: g.base.clone(),
        client: reqwest::Client::new(),
    };
    Proc { g, ns }
}

fn log_of(dir: &Path, run: usize) -> String {
    std::fs::read_to_string(dir.join(format!("gridlet-{run}.log"))).unwrap_or_default()
}

/// SIGTERM, and wait for a clean exit (the store writes its checkpoint).
fn stop(p: Proc) {
    p.g.stop();
}

/// Start run 1 with `persistence__onDamage=refuse`, which must exit unsuccessfully (a gridlet
/// that starts anyway is killed after the wait, and the test fails). Answers its log.
async fn refused_start(dir: &Path) -> String {
    let mut env = SETTINGS.to_vec();
    env.push(("persistence__onDamage", "refuse"));
    let mut child = command(dir, 1, free_port(), &env).spawn().unwrap();
    let status = crate::util::poll_within(Duration::from_secs(20), || {
        std::future::ready(child.try_wait().unwrap().ok_or("still running"))
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let status = status.expect("gridlet refuses to start and exits");
    assert!(!status.success(), "refuses to start: {status}");
    log_of(dir, 1)
}

/// A queue topic `q` (persisted subscription `s`) holding 200 acknowledged events in 20
/// frames, then a clean stop. Answers the segment file.
async fn filled(dir: &Path) -> PathBuf {
    let p = spawn(dir, 0, &[]).await;
    create_queue(&p).await;
    for f in 0..EVENTS / PER_PUBLISH {
        publish_batch(
            &p.ns,
            "q",
            (0..PER_PUBLISH).map(|k| format!("e{:03}", f * PER_PUBLISH + k)),
        )
        .await;
    }
    stop(p);
    let log = dir.join("eventsDb/gridlet-v2/log");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    assert_eq!(segs.len(), 1, "one segment: {segs:?}");
    segs.remove(0)
}

/// Topic `q` with the persisted queue subscription `s`.
async fn create_queue(p: &Proc) {
    for (path, body) in [
        (
            "/topics/q",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            "/topics/q/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"},
                                 "persistencePolicy":{"isPersisted":true}}}),
        ),
    ] {
        let r =
            p.ns.client
                .put(format!(
                    "{}{path}?api-version=2019-01-01-preview",
                    p.ns.base
                ))
                .json(&body)
                .send()
                .await
                .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// Offsets of the frames of a segment file (header 48 bytes, then `len u32 | crc u32 | payload`).
fn frames(seg: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 48;
    while at + 8 <= seg.len() {
        let len = u32::from_le_bytes(seg[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > seg.len() {
            break;
        }
        out.push(at);
        at += 8 + len;
    }
    out
}

/// Receive what the restarted gridlet delivers until `expect` distinct events came (or the
/// wait runs out), then once more: the distinct event ids.
async fn drain(ns: &Ns, expect: usize) -> HashSet<String> {
    let ids = std::sync::Mutex::new(HashSet::new());
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let got = receive(ns, "q", "s", 100, 1).await;
            let mut ids = ids.lock().unwrap();
            ids.extend(got.into_iter().map(|e| e.2));
            if ids.len() >= expect {
                break;
            }
        }
    })
    .await;
    let mut ids = ids.into_inner().unwrap();
    ids.extend(receive(ns, "q", "s", 100, 0).await.into_iter().map(|e| e.2));
    ids
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Restart on the damaged files and check the outcome: `lost` events reported lost (and the
/// others delivered), named in the log, the metrics and the readiness body.
async fn restart_and_check(dir: &Path, seg: &Path, lost: usize) {
    let p = spawn(dir, 1, &[]).await;
    let ids = drain(&p.ns, EVENTS - lost).await;
    let log = log_of(dir, 1);
    let name = seg.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("event log damaged") && l.contains(&name)),
        "an error line names {name}: {log}"
    );
    let m =
        p.ns.client
            .get(format!(
                "{}/metrics?api-version=2019-01-01-preview",
                p.ns.base
            ))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    let reported = metric(&m, "gridlet_store_damaged_events_total") as usize;
    assert!(metric(&m, "gridlet_store_damaged_frames_total") >= 1);
    let ready =
        p.ns.client
            .get(format!("{}/readyz", p.ns.base))
            .send()
            .await
            .unwrap();
    assert_eq!(ready.status(), 200);
    let body = ready.text().await.unwrap();
    assert!(
        body.contains(&format!("{reported} events lost")),
        "readiness names the loss: {body}"
    );
    assert_eq!(reported, lost, "events reported lost; log: {log}");
    assert_eq!(
        ids.len(),
        EVENTS - lost,
        "every event of an undamaged frame is delivered"
    );
    let copies = std::fs::read_dir(dir.join("eventsDb/gridlet-v2/quarantine"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        copies >= 1 || lost == EVENTS,
        "the damaged file is kept in the quarantine folder"
    );
}

fn flip(seg: &Path, at: usize) {
    let mut bytes = std::fs::read(seg).unwrap();
    bytes[at] ^= 0x5a;
    std::fs::write(seg, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_first_frame_loses_that_frame_only() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    let f = frames(&std::fs::read(&seg).unwrap());
    assert_eq!(f.len(), EVENTS / PER_PUBLISH, "one frame per publish");
    flip(&seg, f[0] + 100);
    restart_and_check(dir.path(), &seg, PER_PUBLISH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_frame_ten_loses_that_frame_only() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    let f = frames(&std::fs::read(&seg).unwrap());
    flip(&seg, f[10] + 200);
    restart_and_check(dir.path(), &seg, PER_PUBLISH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_length_in_the_last_frame_is_no_torn_tail_below_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    let f = frames(&std::fs::read(&seg).unwrap());
    flip(&seg, f[f.len() - 1]);
    restart_and_check(dir.path(), &seg, PER_PUBLISH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_segment_header_is_reported_and_the_segment_kept() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    flip(&seg, 20);
    // The checkpoint knows the segment's salt: its frames are all recovered, the header is
    // written again after a copy is kept.
    restart_and_check(dir.path(), &seg, 0).await;
    assert!(seg.exists(), "never deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_segment_loses_the_frames_cut_off_only() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    let f = frames(&std::fs::read(&seg).unwrap());
    // Cut in the middle of frame 10: frames 0-9 stay whole.
    let file = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    file.set_len(f[10] as u64 + 20).unwrap();
    drop(file);
    restart_and_check(dir.path(), &seg, EVENTS - 10 * PER_PUBLISH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpointed_segment_deleted_is_a_loss_reported() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    std::fs::remove_file(&seg).unwrap();
    restart_and_check(dir.path(), &seg, EVENTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_damage_refuse_stops_the_start_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let seg = filled(dir.path()).await;
    let f = frames(&std::fs::read(&seg).unwrap());
    flip(&seg, f[10] + 200);
    let before = std::fs::read(&seg).unwrap();
    let log = refused_start(dir.path()).await;
    let name = seg.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        log.contains(&name) && log.contains("persistence__onDamage=refuse"),
        "the error names the file and the setting: {log}"
    );
    assert_eq!(std::fs::read(&seg).unwrap(), before, "nothing changed");
    assert!(!dir.path().join("eventsDb/gridlet-v2/quarantine").exists());
    // `serve` then recovers around it.
    restart_and_check(dir.path(), &seg, PER_PUBLISH).await;
}

/// Dead letters written by the real binary: 20 events published to `q`, received and rejected
/// in four calls (a frame per letter, a sync per call), then a clean stop (which records
/// the last sync). Answers the letters' segment file.
async fn dead_lettered(dir: &Path) -> PathBuf {
    let p = spawn(dir, 0, &[]).await;
    create_queue(&p).await;
    publish_batch(&p.ns, "q", (0..LETTERS).map(|k| format!("d{k:02}"))).await;
    let mut got = Vec::new();
    while got.len() < LETTERS {
        got.extend(receive(&p.ns, "q", "s", 100, 1).await);
    }
    for part in got.chunks(LETTERS / 4) {
        let tokens: Vec<&str> = part.iter().map(|e| e.0.as_str()).collect();
        settle(&p.ns, "q", "s", "reject", &tokens).await;
    }
    assert_eq!(letters(&p.ns).await.len(), LETTERS);
    stop(p);
    let file = dir.join("eventsDb/gridlet-v2/dead-letters/0000000000000001.dlq");
    assert!(file.exists(), "one letter segment");
    file
}

const LETTERS: usize = 20;

/// The event ids of the subscription's dead letters.
async fn letters(ns: &Ns) -> Vec<String> {
    let v: serde_json::Value = ns
        .client
        .get(format!(
            "{}/topics/q/eventSubscriptions/s/deadLetters?top=1000&api-version=2019-01-01-preview",
            ns.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// A byte flipped in the letter frame at index `frame`, a restart: `LETTERS - 1` letters are
/// there, and the loss is reported (error line naming the file, metrics, readiness).
async fn flip_a_letter_and_check(frame: usize) {
    let dir = tempfile::tempdir().unwrap();
    let file = dead_lettered(dir.path()).await;
    let f = frames(&std::fs::read(&file).unwrap());
    assert!(f.len() >= LETTERS, "a frame per letter: {f:?}");
    flip(&file, f[frame] + 30);
    let p = spawn(dir.path(), 1, &[]).await;
    let kept = letters(&p.ns).await;
    let log = log_of(dir.path(), 1);
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        kept.len(),
        LETTERS - 1,
        "only the damaged letter is lost; log: {log}"
    );
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("dead-letter log damaged")
            && l.contains(&name)),
        "an error line names {name}: {log}"
    );
    let m =
        p.ns.client
            .get(format!(
                "{}/metrics?api-version=2019-01-01-preview",
                p.ns.base
            ))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    assert_eq!(metric(&m, "gridlet_store_damaged_frames_total"), 1);
    let ready =
        p.ns.client
            .get(format!("{}/readyz", p.ns.base))
            .send()
            .await
            .unwrap();
    assert_eq!(ready.status(), 200);
    let body = ready.text().await.unwrap();
    assert!(
        body.contains("damaged data found at start or since"),
        "{body}"
    );
    assert!(
        std::fs::read_dir(dir.path().join("eventsDb/gridlet-v2/quarantine"))
            .unwrap()
            .count()
            >= 1,
        "a copy is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_dead_letter_loses_that_letter_only() {
    flip_a_letter_and_check(LETTERS / 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_last_dead_letter_is_no_torn_tail_after_a_clean_stop() {
    flip_a_letter_and_check(LETTERS - 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_damage_refuse_stops_the_start_on_a_damaged_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    let file = dead_lettered(dir.path()).await;
    let f = frames(&std::fs::read(&file).unwrap());
    flip(&file, f[3] + 30);
    let before = std::fs::read(&file).unwrap();
    let log = refused_start(dir.path()).await;
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        log.contains(&name) && log.contains("persistence__onDamage=refuse"),
        "the error names the file and the setting: {log}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), before, "nothing changed");
}
