//! Threads racing in one process while a publisher supersedes version after version: readers
//! open the latest, re-open by number the versions they hold (whole or in part), and open
//! versions other readers are letting go. Every open is one whole version or NOT_FOUND, a
//! held version's digest is its content's, and everything is freed once the readers let go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_core::Tensor;
use ferry_store::{Store, StoreError, StoreOptions, Version};
use serde_json::{Value, json};

const FINAL: u64 = 61;
const READERS: usize = 4;

fn opts() -> StoreOptions {
    StoreOptions { budget_bytes: 1 << 30, bucket_bytes: 64 << 10, ..StoreOptions::default() }
}

/// Version `v`'s tensors, every element `v`: 190 KB over three 64 KiB buckets (the first
/// tensor has one of its own), so a version torn between buckets would show.
fn filled(v: u64) -> Vec<(String, Tensor)> {
    [("big", 20_000), ("a", 8_000), ("b", 8_000), ("tail", 12_000)]
        .into_iter()
        .map(|(n, len)| (n.to_owned(), Tensor::from_slice(vec![len as u64], &vec![v as f32; len]).unwrap()))
        .collect()
}

fn all_equal(t: &Tensor, x: f32) -> bool {
    t.as_bytes().chunks_exact(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()) == x)
}

/// Checks that `v` is one whole version (tensors and metadata of the same number); its number.
fn check(v: &Version) -> u64 {
    let n = v.manifest().version;
    assert_eq!(v.manifest().metadata, json!(n), "the metadata of another version");
    let ts = v.tensors();
    assert_eq!(ts.len(), 4, "version {n}");
    for (name, t) in &ts {
        assert!(all_equal(t, n as f32), "version {n} is torn: {name}");
    }
    n
}

/// Version `n` of `m`: whole (and checked), or NOT_FOUND; anything else fails.
fn open_or_gone(store: &Store, n: u64) -> Option<Version> {
    match store.open("m", Some(n)) {
        Ok(v) => {
            assert_eq!(check(&v), n);
            Some(v)
        }
        Err(StoreError::NotFound(_)) => None,
        Err(e) => panic!("version {n}: {e}"),
    }
}

/// What a reader holds when the publisher is done: whole versions and one lone tensor.
struct Held {
    whole: Vec<Version>,
    lone: (u64, Tensor),
    seen: usize,
}

#[test]
fn readers_opening_versions_being_superseded_and_freed_get_whole_versions_or_not_found() {
    let store = Store::new(opts());
    store.publish("m", filled(1), json!(1), None).unwrap();
    let start = std::sync::Barrier::new(READERS + 1);
    // The latest version some reader has opened: the publisher supersedes a version only once
    // a reader has it, so that the readers race every step rather than a few.
    let opened = AtomicU64::new(1);
    let held: Vec<Held> = std::thread::scope(|s| {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (store, start, opened) = (&store, &start, &opened);
                s.spawn(move || {
                    let first = store.open("m", None).unwrap(); // held all along
                    assert_eq!(check(&first), 1);
                    let mut held = first.clone(); // held a while, then the latest
                    // One tensor of a version: its bucket lives, the version is not whole.
                    let mut lone = (1, first.tensors()[1].1.clone());
                    let mut seen = std::collections::BTreeSet::new();
                    start.wait();
                    for i in 0..100_000u32 {
                        let latest = store.open("m", None).unwrap();
                        let n = check(&latest);
                        opened.fetch_max(n, Ordering::Relaxed);
                        seen.insert(n);
                        for mine in [&first, &held] {
                            let n = mine.manifest().version;
                            let again = store.open("m", Some(n)).unwrap_or_else(|e| panic!("held {n}: {e}"));
                            assert_eq!(check(&again), n);
                        }
                        // Versions others may be letting go, or hold only a tensor of.
                        open_or_gone(store, n - 1);
                        open_or_gone(store, lone.0);
                        assert!(all_equal(&lone.1, lone.0 as f32), "a held tensor changed");
                        if n == FINAL {
                            return Held { whole: vec![first, held], lone, seen: seen.len() };
                        }
                        match i % 5 {
                            2 => lone = (n, latest.tensors()[2].1.clone()),
                            4 => held = latest,
                            _ => {}
                        }
                    }
                    panic!("never saw version {FINAL} (saw {seen:?})");
                })
            })
            .collect();
        start.wait();
        for v in 2..=FINAL {
            let p = store.publish("m", filled(v), json!(v), None).unwrap();
            assert_eq!(p.manifest().version, v);
            drop(p);
            for _ in 0..100_000 {
                if opened.load(Ordering::Relaxed) >= v || readers.iter().all(|r| r.is_finished()) {
                    break;
                }
                std::thread::yield_now();
            }
        }
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    eprintln!("versions seen by each reader: {:?}", held.iter().map(|h| h.seen).collect::<Vec<_>>());

    // What the readers hold is listed, opens again, and has its content's digest.
    let listed: Vec<u64> = store.list()["m"].held.iter().map(|m| m.version).collect();
    let reference = Store::new(StoreOptions { bucket_bytes: 64 << 20, ..opts() });
    for v in held.iter().flat_map(|h| &h.whole).filter(|v| v.manifest().version != FINAL) {
        let n = v.manifest().version;
        assert!(listed.contains(&n), "held version {n} is not listed: {listed:?}");
        assert_eq!(check(&store.open("m", Some(n)).unwrap()), n);
        let same = reference.publish(&format!("v{n}"), filled(n), Value::Null, None).unwrap();
        let digest = v.manifest().wait_digest();
        assert!(digest.is_some(), "version {n} has a digest");
        assert_eq!(digest, same.manifest().wait_digest(), "version {n}'s digest");
    }
    for h in &held {
        assert!(listed.contains(&h.lone.0) || h.lone.0 == FINAL, "a lone tensor's version is listed");
    }

    // Let go: everything but the latest is freed (the freeing and digest threads may still
    // hold a version for a moment).
    drop(held);
    let latest_bytes = store.open("m", None).unwrap().manifest().bytes;
    for _ in 0..1000 {
        if store.used_bytes() == latest_bytes && store.list()["m"].held.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(store.used_bytes(), latest_bytes);
    assert!(store.list()["m"].held.is_empty());
    for n in 1..FINAL {
        assert!(matches!(store.open("m", Some(n)), Err(StoreError::NotFound(_))), "version {n} is freed");
    }
}
