//! The cpu and disk tiers with real files: placement follows the policy, bytes come back
//! intact, a held tensor is never moved under its holder (its move down waits until it is
//! let go), a declared schedule prefetches,
//! the disk budget is named when full, tensors placed by hand stay put, moves run in the
//! background.

use std::time::Duration;

use bytes::Bytes;
use ferry_store::placement::{Flow, FlowOptions, Genoa, Lru, Pin, Tier, TierError, TierOptions, Tiers};

/// Long enough for any move here to end (it is waited for, not slept).
const SETTLE: Duration = Duration::from_secs(60);

const MB: usize = 1 << 20;

fn tensor(i: usize) -> Bytes {
    Bytes::from((0..MB).map(|j| ((i * 7 + j) % 251) as u8).collect::<Vec<u8>>())
}

#[test]
fn lru_keeps_the_budget_and_every_tensor_comes_back_intact() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = Tiers::new(TierOptions::new(3 * MB as u64, dir.path()), Box::new(Lru::default())).unwrap();
    let keys: Vec<_> = (0..10).map(|i| tiers.put(tensor(i)).unwrap()).collect();
    let (cpu, disk) = tiers.usage();
    assert!(cpu <= 3 * MB as u64, "cpu tier over budget: {cpu}");
    assert_eq!(disk, 10 * MB as u64, "the disk tier counts every tensor");
    assert!(tiers.settle(SETTLE));
    assert_eq!(tiers.stats().bytes_written, 7 * MB as u64, "the seven demoted tensors are written once each");
    assert_eq!(tiers.placement(keys[0]).unwrap(), Tier::Disk);
    assert_eq!(tiers.placement(keys[9]).unwrap(), Tier::Cpu);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(tiers.get(k).unwrap().bytes, tensor(i), "tensor {i}");
        assert!(tiers.usage().0 <= 3 * MB as u64);
    }
    // LRU keeps what was used last.
    assert_eq!(tiers.placement(keys[9]).unwrap(), Tier::Cpu);
    assert_eq!(tiers.placement(keys[0]).unwrap(), Tier::Disk);
    // Each tensor was written to disk at most once: demoting again drops only the cpu copy.
    assert!(tiers.settle(SETTLE));
    assert_eq!(tiers.stats().bytes_written, 10 * MB as u64, "every tensor has been demoted once, none twice");
}

#[test]
fn a_held_tensor_is_never_moved_under_its_holder_and_goes_down_when_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = Tiers::new(TierOptions::new(2 * MB as u64, dir.path()), Box::new(Lru::default())).unwrap();
    let keys: Vec<_> = (0..6).map(|i| tiers.put(tensor(i)).unwrap()).collect();
    assert!(tiers.settle(SETTLE));
    let held = tiers.get(keys[0]).unwrap();
    let ptr = held.bytes.as_ptr();
    // LRU lets it go after two more uses: the policy evicts it, the move waits for its user.
    for &k in &keys[1..] {
        assert_eq!(tiers.get(k).unwrap().bytes, tensor(keys.iter().position(|&x| x == k).unwrap()));
    }
    assert!(tiers.settle(SETTLE));
    let s = tiers.state(keys[0]).unwrap();
    assert_eq!((s.tier, s.in_use, s.deferred, s.moving), (Tier::Cpu, true, true, false), "stays while held");
    let stats = tiers.stats();
    assert!(stats.deferred >= 1, "{stats:?}");
    assert_eq!(stats.held_over_bytes, MB as u64, "its bytes are in memory beyond the policy's budget");
    assert!(tiers.usage().0 <= 2 * MB as u64, "the policy's cpu tier keeps its budget");
    assert_eq!(held.bytes.as_ptr(), ptr);
    assert_eq!(held.bytes, tensor(0));
    // Another use of it meanwhile is served from the same memory, without a read.
    let read = tiers.stats().bytes_read;
    let again = tiers.get(keys[0]).unwrap();
    assert_eq!((again.bytes.as_ptr(), tiers.stats().bytes_read), (ptr, read));
    drop(again);
    // LRU kept it on that use: push it out again while held.
    for &k in &keys[4..] {
        tiers.get(k).unwrap();
    }
    assert!(tiers.settle(SETTLE));
    assert!(tiers.state(keys[0]).unwrap().deferred, "let go by the policy again while held");
    // Let go: it goes down (its file was written meanwhile), and comes back intact.
    drop(held);
    assert!(tiers.settle(SETTLE));
    let s = tiers.state(keys[0]).unwrap();
    assert_eq!((s.tier, s.in_use, s.deferred), (Tier::Disk, false, false));
    assert_eq!(tiers.stats().held_over_bytes, 0);
    assert!(dir.path().join(format!("{}.tensor", keys[0])).exists(), "its file");
    assert_eq!(tiers.get(keys[0]).unwrap().bytes, tensor(0));
}

#[test]
fn a_tensor_pinned_to_disk_or_let_go_by_a_new_policy_waits_for_its_user() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = Tiers::new(TierOptions::new(4 * MB as u64, dir.path()), Box::new(Lru::default())).unwrap();
    let keys: Vec<_> = (0..3).map(|i| tiers.put(tensor(i)).unwrap()).collect();
    let held: Vec<_> = keys.iter().map(|&k| tiers.get(k).unwrap()).collect();
    tiers.place(keys[0], Pin::Disk).unwrap();
    tiers.set_policy(Box::new(Genoa));
    assert!(tiers.settle(SETTLE));
    for (i, &k) in keys.iter().enumerate() {
        let s = tiers.state(k).unwrap();
        assert_eq!((s.tier, s.deferred), (Tier::Cpu, true), "tensor {i} stays while held");
        assert_eq!(held[i].bytes, tensor(i));
    }
    assert_eq!(tiers.usage().0, 0, "none is placed in the cpu tier");
    assert_eq!(tiers.stats().held_over_bytes, 3 * MB as u64);
    let mut held = held;
    for (i, &k) in keys.iter().enumerate() {
        drop(held.remove(0));
        assert!(tiers.settle(SETTLE));
        assert_eq!(tiers.placement(k).unwrap(), Tier::Disk, "tensor {i} went down when let go");
        for &later in &keys[i + 1..] {
            assert_eq!(tiers.placement(later).unwrap(), Tier::Cpu, "the others are still held");
        }
    }
    assert_eq!(tiers.stats().held_over_bytes, 0);
}

#[test]
fn a_declared_schedule_prefetches_ahead_of_use() {
    let dir = tempfile::tempdir().unwrap();
    let tiers =
        Tiers::new(TierOptions::new(3 * MB as u64, dir.path()), Box::new(Flow::new(FlowOptions::default()))).unwrap();
    let keys: Vec<_> = (0..8).map(|i| tiers.put(tensor(i)).unwrap()).collect();
    let order: Vec<_> = keys.iter().chain(keys.iter()).copied().collect();
    tiers.schedule(&order);
    let mut ahead = 0;
    for (n, &k) in order.iter().enumerate() {
        let i = keys.iter().position(|&x| x == k).unwrap();
        assert_eq!(tiers.get(k).unwrap().bytes, tensor(i));
        if let Some(&next) = order.get(n + 1)
            && tiers.placement(next).unwrap() == Tier::Cpu
        {
            ahead += 1;
        }
        assert!(tiers.usage().0 <= 3 * MB as u64);
    }
    assert!(ahead >= order.len() - 2, "the next tensor was in the cpu tier before {ahead} of {} uses", order.len());
}

#[test]
fn a_full_disk_tier_is_named_and_unknown_keys_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let opts = TierOptions { disk_budget: 2 * MB as u64, ..TierOptions::new(MB as u64, dir.path()) };
    let tiers = Tiers::new(opts, Box::new(Lru::default())).unwrap();
    tiers.put(tensor(0)).unwrap();
    tiers.put(tensor(1)).unwrap();
    let e = tiers.put(tensor(2)).unwrap_err();
    assert!(matches!(e, TierError::DiskFull { .. }) && e.to_string().contains("TierOptions::disk_budget"), "{e}");
    assert!(matches!(tiers.get(999), Err(TierError::Unknown(999))));
}

#[test]
fn dropping_the_tiers_removes_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = Tiers::new(TierOptions::new(MB as u64, dir.path()), Box::new(Lru::default())).unwrap();
    for i in 0..4 {
        tiers.put(tensor(i)).unwrap();
    }
    assert!(tiers.settle(SETTLE));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    drop(tiers);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn tensors_placed_by_hand_stay_put_and_removed_ones_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = Tiers::new(TierOptions::new(3 * MB as u64, dir.path()), Box::new(Lru::default())).unwrap();
    let keys: Vec<_> = (0..6).map(|i| tiers.put(tensor(i)).unwrap()).collect();
    // Pinned in the cpu tier: read in (in the background), never evicted by the policy.
    tiers.place(keys[0], Pin::Cpu).unwrap();
    assert!(tiers.settle(SETTLE));
    let s = tiers.state(keys[0]).unwrap();
    assert_eq!((s.tier, s.pin, s.moving), (Tier::Cpu, Pin::Cpu, false));
    for &k in &keys[1..] {
        tiers.get(k).unwrap();
        assert!(tiers.usage().0 <= 3 * MB as u64);
    }
    assert_eq!(tiers.placement(keys[0]).unwrap(), Tier::Cpu, "the policy never moved it");
    assert_eq!(tiers.get(keys[0]).unwrap().bytes, tensor(0));
    // Pinned on disk: used from its file, never kept.
    tiers.place(keys[5], Pin::Disk).unwrap();
    assert_eq!(tiers.get(keys[5]).unwrap().bytes, tensor(5));
    assert!(tiers.settle(SETTLE));
    assert_eq!(tiers.placement(keys[5]).unwrap(), Tier::Disk);
    // More pinned than the cpu tier holds: named.
    for &k in &keys[1..3] {
        tiers.place(k, Pin::Cpu).unwrap();
    }
    let e = tiers.place(keys[3], Pin::Cpu).unwrap_err();
    assert!(matches!(e, TierError::CpuFull { .. }) && e.to_string().contains("TierOptions::cpu_budget"), "{e}");
    let e = tiers.set_budgets(2 * MB as u64, u64::MAX).unwrap_err();
    assert!(e.to_string().contains("cpu_budget"), "{e}");
    // Removed: its file goes, its disk bytes too.
    assert!(tiers.settle(SETTLE));
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    tiers.remove(keys[5]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), files - 1);
    assert_eq!(tiers.usage().1, 5 * MB as u64);
    assert!(matches!(tiers.get(keys[5]), Err(TierError::Unknown(_))));
}

#[test]
fn a_used_tensor_is_in_use_while_held_and_genoa_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = Tiers::new(TierOptions::new(3 * MB as u64, dir.path()), Box::new(Genoa)).unwrap();
    let k = tiers.put(tensor(1)).unwrap();
    assert!(tiers.settle(SETTLE));
    assert_eq!(tiers.placement(k).unwrap(), Tier::Disk, "genoa keeps nothing in the cpu tier");
    let held = tiers.get(k).unwrap();
    assert!(tiers.settle(SETTLE));
    let s = tiers.state(k).unwrap();
    assert_eq!((s.tier, s.in_use, s.deferred), (Tier::Cpu, true, true), "promoted for the use, demoted once let go");
    drop(held);
    assert!(tiers.settle(SETTLE));
    let s = tiers.state(k).unwrap();
    assert_eq!((s.tier, s.in_use, s.deferred), (Tier::Disk, false, false));
    // A policy change starts the cpu tier over.
    tiers.set_policy(Box::new(Lru::default()));
    tiers.get(k).unwrap();
    assert_eq!(tiers.placement(k).unwrap(), Tier::Cpu);
    tiers.set_policy(Box::new(Genoa));
    assert!(tiers.settle(SETTLE));
    assert_eq!(tiers.placement(k).unwrap(), Tier::Disk);
    assert_eq!(tiers.usage().0, 0);
}
