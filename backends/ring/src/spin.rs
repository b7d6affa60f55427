//! The adaptive spin window: how long a waiting side polls the shared memory before it
//! sleeps on the futex. A pure state machine (durations are passed in, no clock is read),
//! tested as a table below.
//!
//! - The window starts at the configured maximum ([`crate::RingOptions::spin`]); zero
//!   turns spinning off (every wait sleeps at once).
//! - A wait that the spin ended keeps the window (and grows it to twice that wait, up to the
//!   maximum): the peer answers within it.
//! - A wait that slept but ended within [`LONG_WAIT_FACTOR`] times the maximum doubles the
//!   window (at least twice that wait, up to the maximum): the peer answered soon, and a
//!   longer spin might have caught it. The factor is there because a wait that sleeps is
//!   lengthened by the wake-ups themselves (one for the peer, one for the waiter: about 50
//!   µs here between vCPUs); judged against the maximum alone, two sleeping sides would see
//!   every round trip as "long", shrink, and stay asleep for good (measured: a 64-byte round
//!   trip of 45 µs instead of 0.4).
//! - A longer wait halves the window, down to [`MIN_WINDOW`] (or the maximum when that is
//!   below it): the peer is idle or slow, and spinning would only burn CPU.
//!
//! So a side never spins longer than the maximum for one wait, and an idle peer costs at
//! most a shrinking window after each message, then nothing: the waiter sleeps in the
//! kernel until woken.

use std::time::Duration;

/// The smallest window an adaptive spin shrinks to.
pub const MIN_WINDOW: Duration = Duration::from_micros(2);
/// A wait that slept counts as long (the peer idle) only past this many times the maximum.
pub const LONG_WAIT_FACTOR: u32 = 8;

/// A side's spin window.
#[derive(Debug, Clone, Copy)]
pub struct SpinWindow {
    max: Duration,
    window: Duration,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The condition held while spinning, after this long.
    Spun(Duration),
    /// The waiter slept; the whole wait took this long.
    Slept(Duration),
}

impl SpinWindow {
    /// A window that starts at, and never exceeds, `max` (zero: no spinning).
    pub fn new(max: Duration) -> SpinWindow {
        SpinWindow { max, window: max }
    }

    /// The most it spins.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// How long the next wait spins before it sleeps.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Adapts the window to how the last wait ended.
    pub fn record(&mut self, waited: Waited) {
        if self.max.is_zero() {
            return;
        }
        self.window = match waited {
            Waited::Spun(t) => self.window.max(t.saturating_mul(2)).min(self.max),
            Waited::Slept(t) if t <= self.max.saturating_mul(LONG_WAIT_FACTOR) => {
                self.window.saturating_mul(2).max(t.saturating_mul(2)).min(self.max)
            }
            Waited::Slept(_) => (self.window / 2).max(MIN_WINDOW.min(self.max)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn window_table() {
        // (max, window before, how the wait ended, window after)
        let table = [
            (us(50), us(50), Waited::Spun(us(1)), us(50)),
            (us(50), us(4), Waited::Spun(us(3)), us(6)),
            (us(50), us(40), Waited::Spun(us(30)), us(50)),
            (us(50), us(8), Waited::Slept(us(20)), us(40)),
            (us(50), us(8), Waited::Slept(us(9)), us(18)),
            (us(50), us(2), Waited::Slept(us(90)), us(50)),
            (us(50), us(2), Waited::Slept(us(400)), us(50)),
            (us(50), us(50), Waited::Slept(us(401)), us(25)),
            (us(50), us(50), Waited::Slept(us(5_000)), us(25)),
            (us(50), us(3), Waited::Slept(us(5_000)), MIN_WINDOW),
            (us(1), us(1), Waited::Slept(us(5_000)), us(1)),
            (Duration::ZERO, Duration::ZERO, Waited::Slept(us(1)), Duration::ZERO),
            (Duration::ZERO, Duration::ZERO, Waited::Slept(us(5_000)), Duration::ZERO),
        ];
        for (max, before, waited, after) in table {
            let mut w = SpinWindow { max, window: before };
            w.record(waited);
            assert_eq!(w.window(), after, "max {max:?}, window {before:?}, {waited:?}");
        }
    }

    #[test]
    fn an_idle_peer_shrinks_the_window_to_the_minimum() {
        let mut w = SpinWindow::new(us(100));
        for _ in 0..20 {
            w.record(Waited::Slept(Duration::from_secs(1)));
        }
        assert_eq!(w.window(), MIN_WINDOW);
        w.record(Waited::Slept(us(3)));
        assert_eq!(w.window(), us(6), "a wait just past the window grows it again");
    }
}
