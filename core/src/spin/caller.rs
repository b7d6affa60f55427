//! The wait policy for a blocking caller's waits on a bare socket
//! ([`crate::Pipe::recv_blocking`] without a ring): [`super::decide_alone`], and a back-off
//! for a peer that a spin cannot see.
//!
//! A ring knows on which CPU its peer runs and never spins on the peer's own CPU, where the
//! spin only delays the answer (`ferry-ring`'s `cpu` module). A socket does not say. So a
//! caller that spun and was not answered within its spin sits the next waits out, twice as
//! many after each such miss in a row (up to [`CallerSpin::MAX_SIT_OUT`]), and spins at
//! every wait again once a spin catches an answer. A peer answering on another CPU within
//! the window keeps every wait spinning; a peer that shares the caller's CPU, or that
//! takes longer than the window, costs one wasted spin per [`CallerSpin::MAX_SIT_OUT`]
//! waits, plus one.
//!
//! However many callers wait, on however many sockets, at most half the CPUs this process
//! may use spin at once ([`Place`]): the rest wait in the kernel, leaving the CPUs to the
//! peers that answer them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{ListenerSpin, NoSpin, Spin, SpinHistory, SpinInputs, Waited, decide};

/// A blocking caller's spin state on one socket: its [`SpinHistory`] and its back-off. A
/// pure state machine (times are passed in), tested as a table.
#[derive(Debug, Clone, Copy)]
pub struct CallerSpin {
    history: SpinHistory,
    /// Spins in a row that the answer did not end.
    misses: u32,
    /// Waits still to sit out before the next spin.
    sit_out: u32,
    /// Whether the wait under way spins (set by [`CallerSpin::next`]).
    spinning: bool,
}

impl CallerSpin {
    /// The most waits a caller sits out after a miss: after many misses in a row it spins
    /// once every `MAX_SIT_OUT + 1` waits. A missed spin costs at most the window of CPU
    /// (50 µs by default: about 0.8 µs a wait here); a caught one saves a wake-up. Kept
    /// small so that a caller whose peer was slow for a while (starting up, a burst of
    /// work) spins again within about a hundred waits once it is quick.
    pub const MAX_SIT_OUT: u32 = 64;

    /// A caller's state for spins of at most `window` (zero: never spins).
    pub fn new(window: Duration) -> CallerSpin {
        CallerSpin { history: SpinHistory::new(window), misses: 0, sit_out: 0, spinning: false }
    }

    /// The window it was made for.
    pub fn window(&self) -> Duration {
        self.history.window()
    }

    /// What the next wait does: [`decide`] for a waiter on its own thread (`overloaded`:
    /// [`super::load::overloaded_at`]; `place`: whether it holds one of the process's
    /// places to spin, [`Place::take`]), unless the caller sits this wait out
    /// ([`NoSpin::Cold`]: its last spins missed).
    pub fn next(&mut self, overloaded: bool, place: bool) -> Spin {
        self.spinning = false;
        let window = self.history.window();
        if window.is_zero() {
            return Spin::Wait(NoSpin::Off);
        }
        if self.sit_out > 0 {
            self.sit_out -= 1;
            return Spin::Wait(NoSpin::Cold);
        }
        let d = decide(SpinInputs {
            window,
            armed: true,
            learned: self.history.learned(),
            overloaded,
            others_active: false,
            spinning: usize::from(!place),
            max_spinning: 1,
        });
        self.spinning = matches!(d, Spin::Poll(_));
        d
    }

    /// Learns from how the wait [`CallerSpin::next`] decided ended.
    pub fn record(&mut self, waited: Waited) {
        self.history.record(waited);
        match waited {
            Waited::Spun(_) => {
                self.misses = 0;
                self.sit_out = 0;
            }
            Waited::Slept(_) if self.spinning => {
                self.misses = self.misses.saturating_add(1);
                self.sit_out =
                    1u32.checked_shl(self.misses).map_or(Self::MAX_SIT_OUT, |n| (n - 1).min(Self::MAX_SIT_OUT));
            }
            Waited::Slept(_) => {}
        }
        self.spinning = false;
    }
}

/// Blocking callers spinning now, in this process.
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// One of the process's places for a blocking caller's spin: at most
/// [`ListenerSpin::max_spinning`] callers (half the CPUs this process may use, at least one)
/// spin at once, whatever their sockets, so that many callers waiting together leave CPUs
/// to the peers that answer them. Given back when dropped.
#[derive(Debug)]
pub struct Place(());

impl Place {
    /// A place, if one is free now.
    pub fn take() -> Option<Place> {
        Self::take_of(ListenerSpin::max_spinning())
    }

    fn take_of(max: usize) -> Option<Place> {
        SPINNING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Place(()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);

    /// Counts the spins `caller` decides over `waits` waits (each spin a hit when `hit`;
    /// every other wait slept).
    fn spins(caller: &mut CallerSpin, waits: usize, hit: bool) -> usize {
        let mut n = 0;
        for _ in 0..waits {
            match caller.next(false, true) {
                Spin::Poll(_) => {
                    n += 1;
                    caller.record(if hit { Waited::Spun(Duration::from_micros(5)) } else { Waited::Slept(W * 2) });
                }
                Spin::Wait(_) => caller.record(Waited::Slept(Duration::from_micros(20))),
            }
        }
        n
    }

    /// The back-off, as a table: how many of a run of waits spin, by how they end.
    #[test]
    fn back_off_table() {
        // (what, window, waits, each spin a hit, spins expected)
        let rows: &[(&str, Duration, usize, bool, usize)] = &[
            ("answers within the spin: every wait spins", W, 100, true, 100),
            ("no window: never", Duration::ZERO, 100, true, 0),
            // Spins at waits 1, 3, 7, 15, 31, 63 (sitting out 1, 3, 7, 15, 31 between).
            ("misses: twice as many waits sat out after each", W, 100, false, 6),
            // The 7th spin (wait 127) would sit out 127: 64 (MAX_SIT_OUT), then one spin per 65.
            ("misses for long: one spin per MAX_SIT_OUT + 1 waits", W, 127 + 65 * 2, false, 7 + 2),
        ];
        for &(what, window, waits, hit, want) in rows {
            let mut c = CallerSpin::new(window);
            assert_eq!(spins(&mut c, waits, hit), want, "{what}");
        }
    }

    /// One hit after misses: every wait spins again.
    #[test]
    fn a_hit_ends_the_back_off() {
        let mut c = CallerSpin::new(W);
        assert_eq!(spins(&mut c, 100, false), 6);
        // Sit out what is left, then the next spin catches the answer.
        let mut now_spins = 0;
        for _ in 0..200 {
            if let Spin::Poll(_) = c.next(false, true) {
                c.record(Waited::Spun(Duration::from_micros(5)));
                now_spins += 1;
                break;
            }
            c.record(Waited::Slept(Duration::from_micros(20)));
        }
        assert_eq!(now_spins, 1, "it spins again after sitting out");
        assert_eq!(spins(&mut c, 50, true), 50, "and at every wait after a hit");
    }

    /// A wait that may not spin (a busy machine; no place free among the process's
    /// spinners) does not, and no miss is counted for it: the next wait that may, spins.
    #[test]
    fn waits_that_may_not_spin_count_no_miss() {
        // (what, overloaded, place, why not)
        let rows = [("overloaded", true, true, NoSpin::Overloaded), ("no place", false, false, NoSpin::Full)];
        for (what, overloaded, place, why) in rows {
            let mut c = CallerSpin::new(W);
            assert_eq!(c.next(overloaded, place), Spin::Wait(why), "{what}");
            c.record(Waited::Slept(W * 2));
            assert!(matches!(c.next(false, true), Spin::Poll(_)), "{what}: no miss was counted");
        }
    }

    /// The places are counted: no more than the most are taken, and a dropped one is free
    /// again. (Other tests of this binary may hold a place meanwhile: the count starts from
    /// whatever they hold.)
    #[test]
    fn places_are_counted_and_given_back() {
        let held = SPINNING.load(Ordering::Acquire);
        let max = held + 2;
        let a = Place::take_of(max).expect("a first place");
        let b = Place::take_of(max).expect("a second place");
        assert!(Place::take_of(max).is_none(), "no third");
        drop(a);
        let c = Place::take_of(max).expect("a place given back is free");
        drop((b, c));
    }

    /// A wait that did not spin (sat out) teaches the back-off nothing.
    #[test]
    fn waits_sat_out_are_not_misses() {
        let mut c = CallerSpin::new(W);
        assert!(matches!(c.next(false, true), Spin::Poll(_)));
        c.record(Waited::Slept(W * 2)); // one miss: sit out 1
        assert_eq!(c.next(false, true), Spin::Wait(NoSpin::Cold));
        c.record(Waited::Slept(W * 2)); // slept without spinning: no second miss
        assert!(matches!(c.next(false, true), Spin::Poll(_)), "one wait sat out after one miss");
    }
}
