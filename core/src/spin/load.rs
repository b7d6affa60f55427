//! Whether the machine has more runnable threads than CPUs: the signal that makes every
//! waiter of the [policy](super::decide) wait in the kernel at once.
//!
//! A spinning thread is worth its CPU only while a CPU is free for the thread it waits
//! for. When more threads are runnable than there are CPUs (CPU burners beside a
//! benchmark, a build, other services), the spinner takes the CPU the answer needs, and the
//! scheduler may leave the answering thread behind a whole time slice of somebody else.
//!
//! - **Sampled rarely.** The first waiter to find the last sample older than
//!   [`SAMPLE_EVERY`] takes a new one (a compare-and-swap elects it; the others use the
//!   last): one read of `/proc/loadavg` (its `running/total` field: the threads runnable
//!   on every CPU now, the reader included), a few µs every 10 ms at most. While the
//!   samples say "over", every [`RECHECK`]: a wrong "overloaded" costs every wait a
//!   wake-up, a wrong "fits" only a spin (in a benchmark, a fresh peer's two samples at
//!   its start, taken while its parent was busy, had kept it from spinning for 10 ms).
//! - **Smoothed.** One sample is one instant; [`LoadState::next`] calls the machine
//!   overloaded only after two samples in a row over the CPUs (no more than
//!   [`IN_A_ROW`] apart), and not any more at the first sample that is not. Samples
//!   further apart are two instants, not a load: a process whose waits come in bursts
//!   (a benchmark's turns, a client's calls) samples at the start of each burst, when its
//!   peer is often busy starting, and two such samples 160 ms apart once turned a
//!   benchmark's spinning off for the whole of the next burst.
//! - **Portable fallback.** Where there is no `/proc/loadavg` (not Linux, a sandbox) the
//!   load is unknown and never gates a spin: waiters behave as they did without it.
//!
//! The CPUs compared against are those this process may use
//! ([`std::thread::available_parallelism`]: affinity and cgroup quota), counted once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The most often the load is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// How soon the next sample is due while the last said "over" ([`LoadState::sample_every`]).
pub const RECHECK: Duration = Duration::from_millis(1);

/// Two samples over the CPUs count as "in a row" (overloaded) when no further apart.
pub const IN_A_ROW: Duration = Duration::from_millis(20);

/// What the samples so far say about the machine's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadState {
    /// No sample could be taken (no `/proc/loadavg`): the load never gates a spin.
    Unknown,
    /// The last sample had no more runnable threads than CPUs.
    Fits,
    /// The last sample had more runnable threads than CPUs, the one before did not.
    OverOnce,
    /// The last two samples (at least) had more runnable threads than CPUs.
    Overloaded,
}

impl LoadState {
    /// The state after a sample of `runnable` threads (`None`: none could be taken) on
    /// `cpus` CPUs, taken `gap` after the sample that made this state.
    pub fn next(self, runnable: Option<u32>, cpus: u32, gap: Duration) -> LoadState {
        match runnable {
            None => LoadState::Unknown,
            Some(n) if n <= cpus => LoadState::Fits,
            Some(_) => match self {
                LoadState::OverOnce | LoadState::Overloaded if gap <= IN_A_ROW => LoadState::Overloaded,
                _ => LoadState::OverOnce,
            },
        }
    }

    /// How long a sample that left this state holds before the next is due.
    pub fn sample_every(self) -> Duration {
        match self {
            LoadState::OverOnce | LoadState::Overloaded => RECHECK,
            LoadState::Unknown | LoadState::Fits => SAMPLE_EVERY,
        }
    }

    fn from_u8(v: u8) -> LoadState {
        match v {
            1 => LoadState::Fits,
            2 => LoadState::OverOnce,
            3 => LoadState::Overloaded,
            _ => LoadState::Unknown,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            LoadState::Unknown => 0,
            LoadState::Fits => 1,
            LoadState::OverOnce => 2,
            LoadState::Overloaded => 3,
        }
    }
}

/// The runnable threads in `/proc/loadavg`'s text (`0.35 1.01 1.38 3/90 4555`: the fourth
/// field's number before the slash); `None` when the text is not of that form.
pub fn parse_loadavg(text: &str) -> Option<u32> {
    let field = text.split_ascii_whitespace().nth(3)?;
    let (running, total) = field.split_once('/')?;
    total.parse::<u32>().ok()?;
    running.parse().ok()
}

/// One sample: the runnable threads now, if this system says.
fn sample() -> Option<u32> {
    // A portable read: where the file does not exist the load is unknown.
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_loadavg(&text)
}

/// The CPUs this process may use, counted once (it reads cgroup files).
pub fn cpus() -> u32 {
    static CPUS: OnceLock<u32> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)))
}

/// The process-wide gauge: the last state and when it was sampled.
struct Gauge {
    start: Instant,
    /// Nanoseconds after `start` of the last sample ([`NEVER`]: none yet).
    last_ns: AtomicU64,
    state: AtomicU8,
}

/// [`Gauge::last_ns`] before the first sample.
const NEVER: u64 = u64::MAX;

fn gauge() -> &'static Gauge {
    static G: OnceLock<Gauge> = OnceLock::new();
    G.get_or_init(|| Gauge { start: Instant::now(), last_ns: AtomicU64::new(NEVER), state: AtomicU8::new(0) })
}

/// Whether more threads are runnable than this process has CPUs, as of the last sample;
/// takes a new one when it is due at `now` (a clock the caller read anyway).
pub fn overloaded_at(now: Instant) -> bool {
    let g = gauge();
    let at = u64::try_from(now.saturating_duration_since(g.start).as_nanos()).unwrap_or(u64::MAX);
    let last = g.last_ns.load(Ordering::Relaxed);
    let was = LoadState::from_u8(g.state.load(Ordering::Relaxed));
    let due = last == NEVER || at >= last.saturating_add(was.sample_every().as_nanos() as u64);
    if due && g.last_ns.compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        let gap = if last == NEVER { Duration::MAX } else { Duration::from_nanos(at.saturating_sub(last)) };
        g.state.store(was.next(sample(), cpus(), gap).to_u8(), Ordering::Relaxed);
    }
    LoadState::from_u8(g.state.load(Ordering::Relaxed)) == LoadState::Overloaded
}

/// [`overloaded_at`] now.
pub fn overloaded() -> bool {
    overloaded_at(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_table() {
        let rows: &[(&str, Option<u32>)] = &[
            ("0.35 1.01 1.38 1/90 4555\n", Some(1)),
            ("2.00 2.00 2.00 5/312 99", Some(5)),
            ("0.00 0.00 0.00 0/0 1", Some(0)),
            ("", None),
            ("0.35 1.01 1.38", None),
            ("0.35 1.01 1.38 1-90 4555", None),
            ("0.35 1.01 1.38 x/90 4555", None),
            ("0.35 1.01 1.38 1/ 4555", None),
            ("0.35 1.01 1.38 -1/90 4555", None),
        ];
        for (text, want) in rows {
            assert_eq!(parse_loadavg(text), *want, "{text:?}");
        }
    }

    /// Two samples in a row over the CPUs make it overloaded; one at or under ends it;
    /// no sample makes it unknown; samples more than `IN_A_ROW` apart are not in a row.
    #[test]
    fn state_table() {
        use LoadState::*;
        let soon = SAMPLE_EVERY;
        let rows: &[(LoadState, Option<u32>, u32, LoadState)] = &[
            (Unknown, Some(1), 2, Fits),
            (Unknown, Some(3), 2, OverOnce),
            (Fits, Some(2), 2, Fits),
            (Fits, Some(3), 2, OverOnce),
            (OverOnce, Some(3), 2, Overloaded),
            (OverOnce, Some(2), 2, Fits),
            (Overloaded, Some(9), 2, Overloaded),
            (Overloaded, Some(2), 2, Fits),
            (Overloaded, None, 2, Unknown),
            (Fits, None, 2, Unknown),
            (Fits, Some(16), 16, Fits),
            (OverOnce, Some(17), 16, Overloaded),
        ];
        for (before, sample, cpus, after) in rows {
            assert_eq!(before.next(*sample, *cpus, soon), *after, "{before:?}, {sample:?} runnable on {cpus} CPUs");
        }
        let late: &[(LoadState, Duration, LoadState)] = &[
            (OverOnce, IN_A_ROW, Overloaded),
            (OverOnce, IN_A_ROW + Duration::from_millis(1), OverOnce),
            (OverOnce, Duration::from_millis(160), OverOnce),
            (Overloaded, Duration::from_millis(160), OverOnce),
            (Fits, Duration::from_millis(160), OverOnce),
        ];
        for (before, gap, after) in late {
            assert_eq!(before.next(Some(3), 2, *gap), *after, "{before:?}, 3 runnable on 2 CPUs {gap:?} later");
        }
        assert_eq!(Overloaded.next(Some(2), 2, Duration::from_secs(1)), Fits);
        // "Over" is looked at again sooner than "fits".
        assert_eq!((OverOnce.sample_every(), Overloaded.sample_every()), (RECHECK, RECHECK));
        assert_eq!((Fits.sample_every(), Unknown.sample_every()), (SAMPLE_EVERY, SAMPLE_EVERY));
        for s in [Unknown, Fits, OverOnce, Overloaded] {
            assert_eq!(LoadState::from_u8(s.to_u8()), s);
        }
    }

    /// The gauge takes a sample when one is due and answers from it until the next: on
    /// this machine the answer is whatever the samples say, but asking twice within
    /// [`RECHECK`] (the shorter interval) reads the file once.
    #[test]
    fn the_gauge_samples_at_most_once_per_interval() {
        let now = Instant::now();
        let _ = overloaded_at(now);
        let last = gauge().last_ns.load(Ordering::Relaxed);
        assert_ne!(last, NEVER, "sampled");
        let _ = overloaded_at(now);
        assert_eq!(gauge().last_ns.load(Ordering::Relaxed), last, "no second sample within the interval");
        let later = now + SAMPLE_EVERY * 2;
        let _ = overloaded_at(later);
        assert!(gauge().last_ns.load(Ordering::Relaxed) > last, "a sample once due");
    }
}
