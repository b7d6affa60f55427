//! Two processes on one CPU: a blocking waiter whose peer last began its own wait on this
//! very CPU (the advisory `consumer_cpu` word of the ring layout, [`crate::layout`]) must
//! not spin there. Its spin would keep the peer off the CPU the answer needs, and the pair
//! would settle into round trips of two whole spin windows each (measured from Python: 116
//! µs instead of 4, with the other CPU idle). The scheduler puts such a pair together
//! after they sleep (a wake-up places the woken process beside its waker), and the load
//! gate cannot see it (two runnable threads on two CPUs is not overload).
//!
//! So one side of the pair (the ring's creator: [`crate::Receiver::steps_aside`]) steps
//! aside when its peer's last wait began on its own CPU: it moves itself off that CPU,
//! within its own affinity mask (the mask without this CPU, then the mask as it was: two
//! `sched_setaffinity` calls, leaving the user's mask as found), says its new CPU at once,
//! and spins as usual; at most once per [`EVERY`]. When it cannot (one CPU allowed, too
//! soon again, the machine overloaded), it sleeps at once instead of spinning. The other
//! side spins as usual: were it to sleep, the wake-up would place it beside its waker
//! again (measured: both stepping, or the other side sleeping, left the pair together).

use std::time::{Duration, Instant};

use ferry_core::spin;

/// The least time between two steps of one waiter.
pub(crate) const EVERY: Duration = Duration::from_millis(1);

/// One waiter's steps.
#[derive(Debug, Default)]
pub(crate) struct Aside {
    last: Option<Instant>,
}

/// What a waiter that shares its CPU with its peer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shared {
    /// It moved to another CPU: it may spin.
    Stepped,
    /// It could not: it sleeps at once.
    Stay,
}

impl Aside {
    /// This waiter, at `now` on `cpu`, found its peer's last wait began on the same CPU.
    pub(crate) fn sharing(&mut self, now: Instant) -> Shared {
        if self.last.is_some_and(|t| now.duration_since(t) < EVERY) || spin::load::overloaded_at(now) {
            return Shared::Stay;
        }
        self.last = Some(now);
        if step_aside() { Shared::Stepped } else { Shared::Stay }
    }
}

/// The CPU this thread runs on now.
pub(crate) fn this_cpu() -> usize {
    rustix::thread::sched_getcpu()
}

/// Moves this thread off the CPU it runs on, within its affinity mask, and gives the mask
/// back; false when it could not (one CPU allowed, or the calls failed).
fn step_aside() -> bool {
    use rustix::thread::{sched_getaffinity, sched_setaffinity};
    let cpu = this_cpu();
    let Ok(mask) = sched_getaffinity(None) else { return false };
    if mask.count() < 2 || !mask.is_set(cpu) {
        return false;
    }
    let mut other = mask;
    other.unset(cpu);
    if sched_setaffinity(None, &other).is_err() {
        return false;
    }
    sched_setaffinity(None, &mask).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stepping aside moves the thread to another allowed CPU and leaves its mask as it was.
    #[test]
    fn stepping_aside_moves_off_this_cpu_and_keeps_the_mask() {
        use rustix::thread::sched_getaffinity;
        let before = sched_getaffinity(None).unwrap();
        if before.count() < 2 {
            return; // nothing to step to: one CPU allowed
        }
        let cpu = this_cpu();
        assert!(step_aside());
        assert_ne!(this_cpu(), cpu, "moved off CPU {cpu}");
        assert_eq!(sched_getaffinity(None).unwrap(), before, "the mask is as it was");
    }

    /// A waiter steps at most once per `EVERY`, and stays (sleeps at once) in between.
    #[test]
    fn a_waiter_steps_at_most_once_per_interval() {
        let mut a = Aside::default();
        let t = Instant::now();
        let first = a.sharing(t);
        assert_eq!(a.sharing(t + EVERY / 2), Shared::Stay, "too soon after {first:?}");
        if first == Shared::Stepped {
            assert_eq!(a.last, Some(t));
        }
    }
}
