//! The pool alone: no pipe, no peer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// `find` racing the drop of a slot's last other reference: a look-up just past the
/// slot's end upgrades it, fails the range check and drops it. That drop must not
/// happen under the pool's lock (it takes the lock: the thread deadlocked itself, seen
/// as a hung `send` in the ring conformance suite once in a few hundred runs). Bounded:
/// a watchdog fails the test if the threads are not done in time.
#[test]
fn a_find_that_drops_the_last_reference_does_not_deadlock() {
    let pool = Pool::new(ShmOptions::default(), true, ControlWaker::new());
    let (seg, range) = pool.try_alloc(64).unwrap().unwrap();
    let core = PoolSlotMut::new(&pool, seg, 64, range).into_core().unwrap();
    let addr = core.addr();
    drop(core);
    let done = Arc::new(AtomicBool::new(false));
    let lookups = Arc::new(AtomicUsize::new(0));
    let finder = {
        let (pool, done, lookups) = (pool.clone(), done.clone(), lookups.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                // Longer than any slot: never a match, but a slot at `addr` is upgraded.
                assert!(pool.find(addr, 4096).is_none());
                lookups.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let maker = {
        let (pool, done) = (pool.clone(), done.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(2);
            let mut made = 0u64;
            while Instant::now() < until {
                let (seg, range) = pool.try_alloc(64).unwrap().unwrap();
                // Mostly at `addr` again (the first fit), unless the finder holds that slot.
                drop(PoolSlotMut::new(&pool, seg, 64, range).into_core().unwrap());
                made += 1;
            }
            done.store(true, Ordering::Relaxed);
            made
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(finder.is_finished() && maker.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "find and drop deadlocked ({} look-ups done)",
            lookups.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let made = maker.join().unwrap();
    finder.join().unwrap();
    assert!(made > 0 && lookups.load(Ordering::Relaxed) > 0);
}

const MIB: usize = 1 << 20;

fn opts(keep_idle_bytes: u64) -> ShmOptions {
    ShmOptions { keep_idle_bytes, idle_release: Duration::from_millis(100), ..ShmOptions::default() }
}

/// Claims `len` bytes in a new or free place; returns the segment, announced to the peer
/// when `announce` (as a send that leases it would).
fn take(pool: &Arc<Pool>, len: usize, announce: bool) -> (u32, PoolSlotMut) {
    let (seg, range) = pool.try_alloc(len).unwrap().unwrap();
    if announce {
        pool.mark_announced(seg, true);
    }
    (seg, PoolSlotMut::new(pool, seg, len, range))
}

#[test]
fn idle_segments_past_the_kept_bytes_are_given_back_largest_first_and_forgotten() {
    let pool = Pool::new(opts(64 << 20), true, ControlWaker::new());
    let (a, slot_a) = take(&pool, MIB, true); // a 64 MiB segment
    let (b, slot_b) = take(&pool, 128 * MIB, true); // one of its own size
    assert_ne!(a, b);
    let t0 = Instant::now();
    assert_eq!(pool.give_back_idle(t0 + Duration::from_secs(3600)), None, "nothing is empty yet");
    drop(slot_a);
    drop(slot_b);
    // Empty, but not for long enough: nothing goes, and the pool says when to look again.
    let next = pool.give_back_idle(Instant::now());
    assert!(next.is_some(), "an empty segment past the kept bytes must ask to be looked at again");
    assert_eq!(pool.counts().0, 2);
    assert!(pool.take_forgets().is_empty());
    // Idle long enough: the 128 MiB one goes, the 64 MiB one is kept (keep_idle_bytes).
    assert_eq!(pool.give_back_idle(Instant::now() + Duration::from_secs(3600)), None);
    assert_eq!(pool.counts(), (1, 64 << 20, 2, 1));
    assert_eq!(pool.take_forgets(), vec![u64::from(b)]);
    assert!(pool.take_forgets().is_empty(), "a forget is handed out once");
    // A new segment takes a new id: the peer never sees an id twice.
    let (_, hold) = take(&pool, 64 * MIB, true);
    let (c, _hold2) = take(&pool, 64 * MIB, true);
    assert!(c > b, "segment id {c} reused (after {b})");
    drop(hold);
}

#[test]
fn a_segment_with_a_slot_in_use_is_never_given_back() {
    let pool = Pool::new(opts(0), true, ControlWaker::new());
    let (_, held) = take(&pool, MIB, true);
    let (_, other) = take(&pool, MIB, true); // the same segment
    drop(other);
    assert_eq!(pool.give_back_idle(Instant::now() + Duration::from_secs(3600)), None);
    assert_eq!(pool.counts().0, 1, "a segment with a live slot was given back");
    let core = held.into_core().unwrap();
    assert_eq!(pool.give_back_idle(Instant::now() + Duration::from_secs(3600)), None);
    assert_eq!(pool.counts().0, 1, "a segment with a frozen slot was given back");
    drop(core);
    pool.give_back_idle(Instant::now() + Duration::from_secs(3600));
    assert_eq!(pool.counts().0, 0);
}

#[test]
fn segments_the_peer_cannot_forget_stay_and_the_full_error_says_so() {
    let o = ShmOptions { pool_limit: 128 << 20, full_wait: Duration::ZERO, ..opts(0) };
    let pool = Pool::new(o, false, ControlWaker::new());
    let (announced, s1) = take(&pool, MIB, true);
    let (_, s2) = take(&pool, 64 * MIB, false); // a second 64 MiB segment, never sent
    drop((s1, s2));
    pool.give_back_idle(Instant::now() + Duration::from_secs(3600));
    assert_eq!(pool.counts().0, 1, "only the segment never sent goes");
    assert!(pool.segment(announced).is_some(), "the segment the peer maps stayed");
    assert!(pool.take_forgets().is_empty());
    // 64 MiB kept + 128 MiB > the limit, and the kept one cannot go.
    assert!(pool.try_alloc(128 * MIB - 4096).unwrap().is_none());
    let (_tx, mut closed) = tokio::sync::watch::channel(false);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let holders = || Holders { leases: 0, leased_bytes: 0 };
    let err = rt.block_on(pool.alloc(100 * MIB, &mut closed, holders)).unwrap_err().to_string();
    assert!(err.contains("cannot be told to unmap"), "{err}");
    assert!(err.contains("ShmOptions::pool_limit"), "{err}");
}

#[test]
fn a_claim_that_would_not_fit_gives_back_empty_segments_first() {
    let o = ShmOptions { pool_limit: 256 << 20, ..opts(64 << 20) };
    let pool = Pool::new(o, true, ControlWaker::new());
    // Three 64 MiB segments, all sent to the peer, then all empty (idle_release not over).
    let slots: Vec<_> = (0..3).map(|_| take(&pool, 60 * MIB, true)).collect();
    assert_eq!(pool.counts().0, 3);
    drop(slots);
    // 192 MiB reserved + 128 MiB > 256 MiB: without giving back, this would not fit.
    let (big, slot) = take(&pool, 128 * MIB, true);
    let (n, reserved, _, given_back) = pool.counts();
    assert!(given_back >= 1 && reserved <= 256 << 20, "{n} segments, {reserved} bytes");
    assert_eq!(pool.take_forgets().len() as u64, given_back, "each segment given back is forgotten by the peer");
    assert!(pool.segment(big).is_some());
    // With every byte in use, a claim that does not fit is refused (nothing to give back).
    let held: Vec<_> = std::iter::from_fn(|| pool.try_alloc(60 * MIB).unwrap()).take(8).collect();
    assert!(pool.try_alloc(128 * MIB).unwrap().is_none());
    assert!(pool.reserved() <= 256 << 20);
    drop((held, slot));
}

/// Small results after a large one must not pin the large segment (each would keep a slot
/// in it alive, so it never empties): they go to a segment of the usual size, and the large
/// one is given back once idle.
#[test]
fn small_claims_do_not_land_in_an_empty_oversized_segment() {
    let pool = Pool::new(opts(64 << 20), true, ControlWaker::new());
    let (big, slot) = take(&pool, 256 * MIB, true);
    drop(slot);
    let (small, s1) = take(&pool, MIB, true);
    assert_ne!(small, big, "a small claim went into the empty 256 MiB segment");
    // In-use segments come first: the next small claim joins it, the large one stays empty.
    let (again, s2) = take(&pool, MIB, true);
    assert_eq!(again, small);
    assert_eq!(pool.give_back_idle(Instant::now() + Duration::from_secs(3600)), None);
    assert_eq!(pool.take_forgets(), vec![u64::from(big)]);
    assert_eq!(pool.counts().0, 1);
    // A large claim still uses an empty large segment rather than making another.
    drop((s1, s2));
    let (l1, s3) = take(&pool, 200 * MIB, true);
    drop(s3);
    let (l2, _s4) = take(&pool, 200 * MIB, true);
    assert_eq!(l1, l2);
}
