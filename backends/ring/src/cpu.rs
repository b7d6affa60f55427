//! Where the two sides of a connection run: a waiter does not spin on the CPU its peer
//! needs.
//!
//! Each side's consumer says which CPU it runs on when one of its waits ends, or when a
//! blocking caller's read of a packed message finds it without waiting (the ring's
//! `consumer_cpu` word, see [`crate::layout`]); a spinning waiter looks at the peer's word
//! every 32 polls. A spin on the CPU the peer needs keeps the answer from coming: measured
//! in Python with both ends on one CPU, a 64 B round trip took 116 µs (each side spun its
//! whole window in turn), and the scheduler, which puts a waker and its wakee together,
//! parted them only after 15-30 ms; kept together and sleeping instead, 12 µs, against
//! 4.7 µs on two CPUs. So a waiter that finds the peer on its CPU moves itself to another
//! CPU of its own (at most once per [`MOVE_EVERY`] per connection, its mask given back at
//! once; the kernel picks which CPU) and spins on; where it cannot (one CPU), it stops
//! spinning and sleeps, and the peer gets the CPU.
//!
//! The words are advice: a peer that writes nonsense there changes only where this side
//! spins (a value no CPU has never matches; this side only ever moves off its own CPU).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::sys;

/// A connection's waiters move off the peer's CPU at most once per this.
pub(crate) const MOVE_EVERY: Duration = Duration::from_millis(1);

/// One side's part: what it said last, and when it last moved.
#[derive(Debug, Default)]
pub(crate) struct Cpus {
    /// The value this side stored last in its `consumer_cpu` word: the word is written
    /// only when it changes, so the cache line a spinning peer reads stays put. Only the
    /// consumer writes it (its waits, and its blocking reads that found a record).
    said: AtomicU32,
    /// When a waiter of this side last moved off the peer's CPU.
    moved: Mutex<Option<Instant>>,
}

impl Cpus {
    /// Says where this side's consumer runs: `mine` is its `consumer_cpu` word. Called when
    /// one of the consumer's waits ended (it starts on what arrived), when a blocking
    /// caller's read of a packed message found it without waiting, and after it moved.
    pub(crate) fn say(&self, mine: Option<&AtomicU32>) {
        let Some(cpu) = sys::current_cpu() else { return };
        let said = cpu.wrapping_add(1);
        // A load first: the common answer (the same CPU as last time) writes nothing.
        if self.said.load(Ordering::Relaxed) != said {
            self.said.store(said, Ordering::Relaxed);
            if let Some(w) = mine {
                w.store(said, Ordering::Relaxed);
            }
        }
    }

    /// The CPU this thread runs on, when the peer (`peer`: its `consumer_cpu` word) said it
    /// runs there too.
    pub(crate) fn peer_here(peer: Option<&AtomicU32>) -> Option<u32> {
        let peer = peer.map_or(0, |w| w.load(Ordering::Relaxed));
        sys::current_cpu().filter(|c| peer != 0 && c.wrapping_add(1) == peer)
    }

    /// A spin's look at where the peer runs: true when the spin may go on (the peer is
    /// elsewhere, or this thread just moved). `consumer`: the spin is the consumer's (it
    /// then says where it moved to, in `mine`).
    pub(crate) fn spin_on(&self, peer: Option<&AtomicU32>, mine: Option<&AtomicU32>, consumer: bool) -> bool {
        let Some(cpu) = Cpus::peer_here(peer) else { return true };
        let now = Instant::now();
        {
            let mut moved = self.moved.lock().unwrap_or_else(|e| e.into_inner());
            if moved.is_some_and(|t| now.duration_since(t) < MOVE_EVERY) {
                return false;
            }
            *moved = Some(now);
        }
        if !sys::move_off_cpu(cpu) {
            return false;
        }
        if consumer {
            self.say(mine);
        }
        true
    }

    /// When this side last moved (tests).
    #[cfg(test)]
    fn moved(&self) -> Option<Instant> {
        *self.moved.lock().expect("lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` with this thread allowed on `cpus` only, then gives it its CPUs back.
    fn on_cpus<T>(cpus: &[usize], f: impl FnOnce() -> T) -> T {
        use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
        let was = sched_getaffinity(None).expect("affinity");
        let mut only = CpuSet::new();
        cpus.iter().for_each(|&c| only.set(c));
        sched_setaffinity(None, &only).expect("pin");
        let out = f();
        sched_setaffinity(None, &was).expect("unpin");
        out
    }

    /// The CPUs this thread may use.
    fn my_cpus() -> Vec<usize> {
        let set = rustix::thread::sched_getaffinity(None).expect("affinity");
        (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
    }

    /// A side says where it runs (plus one, in its own word, only when that changed); the
    /// peer on that CPU sees it there; a value no CPU has never matches.
    #[test]
    fn a_side_says_where_it_runs() {
        let cpu = my_cpus()[0];
        on_cpus(&[cpu], || {
            let (me, word) = (Cpus::default(), AtomicU32::new(0));
            assert_eq!(Cpus::peer_here(Some(&word)), None, "nothing said yet");
            me.say(Some(&word));
            assert_eq!(word.load(Ordering::Relaxed), cpu as u32 + 1);
            assert_eq!(Cpus::peer_here(Some(&word)), Some(cpu as u32));
            word.store(7, Ordering::Relaxed); // (what a confused peer might do)
            me.say(Some(&word));
            assert_eq!(word.load(Ordering::Relaxed), 7, "unchanged CPU: not written again");
            for nonsense in [u32::MAX, 0, cpu as u32 + 2] {
                word.store(nonsense, Ordering::Relaxed);
                assert_eq!(Cpus::peer_here(Some(&word)), None, "{nonsense}");
            }
            assert_eq!(Cpus::peer_here(None), None);
        });
    }

    /// A spin that finds the peer on its CPU stops at once where it may use no other CPU;
    /// a second find within `MOVE_EVERY` stops too (no move).
    #[test]
    fn with_one_cpu_the_spin_stops() {
        let cpu = my_cpus()[0];
        let peer = AtomicU32::new(cpu as u32 + 1);
        on_cpus(&[cpu], || {
            let me = Cpus::default();
            assert!(!me.spin_on(Some(&peer), None, true), "no other CPU: stop");
            assert!(me.moved().is_some(), "it tried");
            assert!(!me.spin_on(Some(&peer), None, true), "and within MOVE_EVERY it does not try again");
            peer.store(0, Ordering::Relaxed);
            assert!(me.spin_on(Some(&peer), None, true), "a peer that said nothing: spin on");
        });
    }

    /// With another CPU allowed, the spin moves there, says so (a consumer's spin), and
    /// keeps every CPU it had.
    #[test]
    fn the_spin_moves_off_the_peers_cpu() {
        let cpus = my_cpus();
        if cpus.len() < 2 {
            eprintln!("one CPU here: nothing to move to");
            return;
        }
        let (cpu, other) = (cpus[0], cpus[1]);
        let peer = AtomicU32::new(cpu as u32 + 1);
        let mine = AtomicU32::new(0);
        on_cpus(&[cpu, other], || {
            let mask = rustix::thread::sched_getaffinity(None).expect("affinity");
            // On `cpu` (and allowed on both again): the scheduler may still move the thread
            // before the look, so try a few times (bounded).
            for _ in 0..100 {
                let me = Cpus::default();
                on_cpus(&[cpu], || ());
                if sys::current_cpu() != Some(cpu as u32) {
                    continue;
                }
                assert!(me.spin_on(Some(&peer), Some(&mine), true), "moved: spin on");
                assert!(me.moved().is_some());
                assert_eq!(sys::current_cpu(), Some(other as u32), "the only other CPU");
                assert_eq!(mine.load(Ordering::Relaxed), other as u32 + 1, "it says where it went");
                assert!(mask == rustix::thread::sched_getaffinity(None).expect("affinity"), "its CPUs given back");
                return;
            }
            eprintln!("the scheduler never left this thread on CPU {cpu}: not tested");
        });
    }
}
