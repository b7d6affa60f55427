//! Whether threads wait for a CPU on this machine: the signal that makes every waiter of
//! the [policy](super::decide) wait in the kernel at once.
//!
//! A spinning thread is worth its CPU only while a CPU is free for the thread it waits
//! for. When threads wait for CPUs (CPU burners beside spinning waiters, a build, other
//! services), the spinner takes the CPU the answer needs, and the
//! scheduler may leave the answering thread behind a whole time slice of somebody else.
//!
//! - **Measured as waiting, where the kernel says.** Linux's pressure stall information
//!   (`/proc/pressure/cpu`, its `some` line's `total`: microseconds during which at least
//!   one runnable thread waited for a CPU) gives, between two samples, the share of the
//!   time that some thread waited ([`over_by_stall`]): over when it reaches
//!   [`STALL_ENTER`]; once overloaded, still over until it falls below [`STALL_LEAVE`]
//!   and no more threads are runnable than there are CPUs (beside burners, waiters that
//!   sleep make others wait little, yet a spin would take a burner's CPU). A count of
//!   runnable threads at one instant cannot tell a burner from a kernel thread's few
//!   microseconds: with two spinners on two CPUs, any third thread made it "over", and a
//!   benchmark's fresh peer, sampling while its parent was busy starting it, stopped
//!   spinning for a whole turn (12 µs round trips instead of 4.7). Without pressure
//!   information (older kernels, `psi=0`, other systems), and for a process's first
//!   sample, the runnable threads of `/proc/loadavg` (its `running/total` field, the
//!   reader included) against the CPUs.
//! - **Sampled rarely.** The first waiter to find the last sample older than
//!   [`SAMPLE_EVERY`] takes a new one (a compare-and-swap elects it; the others use the
//!   last): one read of a small `/proc` file, a few µs every 10 ms at most. While the
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
//! - **Portable fallback.** Where neither file exists (not Linux, a sandbox) the load is
//!   unknown and never gates a spin: waiters behave as they did without it.
//!
//! The fallback's CPUs are those this process may use
//! ([`std::thread::available_parallelism`]: affinity and cgroup quota), counted once.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How soon the next sample is due while the last said "fits" (or nothing).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// How soon the next sample is due while the last said "over" ([`LoadState::sample_every`]),
/// and after a process's first pressure reading (a baseline, which says nothing yet).
pub const RECHECK: Duration = Duration::from_millis(1);

/// The share of the time since the last sample during which some thread waited for a CPU
/// that makes a sample "over" (pressure stall information).
pub const STALL_ENTER: f64 = 0.5;

/// The share below which a sample is no longer "over" once overloaded, unless more
/// threads are runnable than there are CPUs ([`over_by_stall`]).
pub const STALL_LEAVE: f64 = 0.05;

/// Two samples over the CPUs count as "in a row" (overloaded) when no further apart.
pub const IN_A_ROW: Duration = Duration::from_millis(20);

/// What the samples so far say about the machine's load ("over": threads waited for CPUs,
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadState {
    /// No sample says anything yet (none could be taken, or only a pressure baseline): the
    /// load never gates a spin.
    Unknown,
    /// The last sample was not over.
    Fits,
    /// The last sample was over, the one before was not (or was more than [`IN_A_ROW`]
    /// earlier).
    OverOnce,
    /// The last two samples (at least), in a row, were over.
    Overloaded,
}

impl LoadState {
    /// Whether the samples so far say "over" (once or more).
    pub fn is_over(self) -> bool {
        matches!(self, LoadState::OverOnce | LoadState::Overloaded)
    }

    /// The state after a sample that found the machine `over` or not (`None`: none could be
    /// taken), taken `gap` after the sample that made this state.
    pub fn next(self, over: Option<bool>, gap: Duration) -> LoadState {
        match over {
            None => LoadState::Unknown,
            Some(false) => LoadState::Fits,
            Some(true) => match self {
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

/// The `some` line's `total` (microseconds) in `/proc/pressure/cpu`'s text
/// (`some avg10=0.00 avg60=0.00 avg300=0.00 total=123`); `None` when it has none.
pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_ascii_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

/// Whether `stalled` (the growth of the pressure total) out of `elapsed` makes a sample
/// over, the state being `was`: [`STALL_ENTER`] to become over; an overloaded state stays
/// while the share is at least [`STALL_LEAVE`] or the machine is `crowded` (more runnable
/// threads than CPUs, asked only then). Beside busy CPUs a waiter that stopped spinning
/// makes others wait little, and would otherwise take that for a free machine and spin
/// again: measured beside two burners, the 24.9 MB Python row then took 69 µs, not 30.
pub fn over_by_stall(was: LoadState, stalled: Duration, elapsed: Duration, crowded: impl FnOnce() -> bool) -> bool {
    if elapsed.is_zero() {
        return was.is_over();
    }
    let share = stalled.as_secs_f64() / elapsed.as_secs_f64();
    share >= STALL_ENTER || (was == LoadState::Overloaded && (share >= STALL_LEAVE || crowded()))
}

/// The runnable threads now (`/proc/loadavg`), if this system says.
fn runnable_now() -> Option<u32> {
    // A portable read: where the file does not exist the load is unknown.
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_loadavg(&text)
}

/// The pressure total now (`/proc/pressure/cpu`), if this system says.
fn stall_total_now() -> Option<u64> {
    parse_psi_some_total(&std::fs::read_to_string("/proc/pressure/cpu").ok()?)
}

/// The CPUs this process may use, counted once (it reads cgroup files).
pub fn cpus() -> u32 {
    static CPUS: OnceLock<u32> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)))
}

/// The process-wide gauge: the state and when the next sample is due (read by every
/// waiter without a lock), and the last sample (taken by one sampler at a time).
struct Gauge {
    start: Instant,
    /// Nanoseconds after `start` when the next sample is due.
    due_ns: AtomicU64,
    state: AtomicU8,
    last: Mutex<Last>,
}

/// The last sample: when, and the pressure total then.
#[derive(Default)]
struct Last {
    at_ns: Option<u64>,
    stall_us: Option<u64>,
}

fn gauge() -> &'static Gauge {
    static G: OnceLock<Gauge> = OnceLock::new();
    G.get_or_init(|| Gauge {
        start: Instant::now(),
        due_ns: AtomicU64::new(0),
        state: AtomicU8::new(0),
        last: Mutex::new(Last::default()),
    })
}

/// Whether threads wait for CPUs on this machine (module docs), as of the last sample;
/// takes a new one when it is due at `now` (a clock the caller read anyway). One waiter
/// samples (`try_lock`); the others answer from the state as it is.
pub fn overloaded_at(now: Instant) -> bool {
    let g = gauge();
    let at = u64::try_from(now.saturating_duration_since(g.start).as_nanos()).unwrap_or(u64::MAX);
    if at >= g.due_ns.load(Ordering::Relaxed)
        && let Ok(mut last) = g.last.try_lock()
        && at >= g.due_ns.load(Ordering::Relaxed)
    {
        let was = LoadState::from_u8(g.state.load(Ordering::Relaxed));
        let gap = last.at_ns.map(|t| Duration::from_nanos(at.saturating_sub(t)));
        let total = stall_total_now();
        let over = match (total, last.stall_us, gap) {
            (Some(now), Some(before), Some(gap)) => {
                let crowded = || runnable_now().is_some_and(|n| n > cpus());
                Some(over_by_stall(was, Duration::from_micros(now.saturating_sub(before)), gap, crowded))
            }
            (Some(_), _, _) => None, // a baseline: the next sample says
            (None, _, _) => runnable_now().map(|n| n > cpus()),
        };
        *last = Last { at_ns: Some(at), stall_us: total };
        let state = was.next(over, gap.unwrap_or(Duration::MAX));
        let every = if over.is_none() && total.is_some() { RECHECK } else { state.sample_every() };
        g.state.store(state.to_u8(), Ordering::Relaxed);
        g.due_ns.store(at.saturating_add(every.as_nanos() as u64), Ordering::Relaxed);
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
        let rows: &[(LoadState, Option<bool>, LoadState)] = &[
            (Unknown, Some(false), Fits),
            (Unknown, Some(true), OverOnce),
            (Fits, Some(false), Fits),
            (Fits, Some(true), OverOnce),
            (OverOnce, Some(true), Overloaded),
            (OverOnce, Some(false), Fits),
            (Overloaded, Some(true), Overloaded),
            (Overloaded, Some(false), Fits),
            (Overloaded, None, Unknown),
            (Fits, None, Unknown),
        ];
        for (before, over, after) in rows {
            assert_eq!(before.next(*over, soon), *after, "{before:?}, over: {over:?}");
        }
        let late: &[(LoadState, Duration, LoadState)] = &[
            (OverOnce, IN_A_ROW, Overloaded),
            (OverOnce, IN_A_ROW + Duration::from_millis(1), OverOnce),
            (OverOnce, Duration::from_millis(160), OverOnce),
            (Overloaded, Duration::from_millis(160), OverOnce),
            (Fits, Duration::from_millis(160), OverOnce),
        ];
        for (before, gap, after) in late {
            assert_eq!(before.next(Some(true), *gap), *after, "{before:?}, over {gap:?} later");
        }
        assert_eq!(Overloaded.next(Some(false), Duration::from_secs(1)), Fits);
        // "Over" is looked at again sooner than "fits".
        assert_eq!((OverOnce.sample_every(), Overloaded.sample_every()), (RECHECK, RECHECK));
        assert_eq!((Fits.sample_every(), Unknown.sample_every()), (SAMPLE_EVERY, SAMPLE_EVERY));
        for s in [Unknown, Fits, OverOnce, Overloaded] {
            assert_eq!(LoadState::from_u8(s.to_u8()), s);
        }
    }

    /// A sample is over when some thread waited for a CPU half the time since the last
    /// one; once overloaded, until that share falls below a twentieth and no more threads
    /// are runnable than there are CPUs.
    #[test]
    fn stall_table() {
        use LoadState::*;
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        let rows: &[(LoadState, Duration, Duration, bool, bool)] = &[
            (Fits, us(0), ms(1), false, false),
            (Fits, us(10), ms(1), false, false), // a kernel thread's moment
            (Fits, us(499), ms(1), true, false), // crowded or not: entering takes waiting
            (Fits, us(500), ms(1), false, true),
            (Unknown, ms(10), ms(10), false, true),
            (OverOnce, us(100), ms(1), true, false), // once is not yet overloaded
            (OverOnce, us(600), ms(1), false, true),
            (Overloaded, us(60), ms(1), false, true),
            (Overloaded, us(49), ms(1), false, false),
            (Overloaded, us(49), ms(1), true, true), // beside burners: stays
            (Overloaded, us(0), ms(10), false, false),
            (Fits, us(5), Duration::ZERO, true, false),
            (Overloaded, us(5), Duration::ZERO, false, true),
        ];
        for (was, stalled, elapsed, crowded, over) in rows {
            assert_eq!(
                over_by_stall(*was, *stalled, *elapsed, || *crowded),
                *over,
                "{was:?}: {stalled:?} of {elapsed:?}, crowded: {crowded}"
            );
        }
    }

    /// `/proc/pressure/cpu`'s `some` total, or nothing.
    #[test]
    fn psi_table() {
        let rows: &[(&str, Option<u64>)] = &[
            (
                "some avg10=5.10 avg60=6.14 avg300=3.26 total=15890232502\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                Some(15_890_232_502),
            ),
            ("full avg10=0.00 avg60=0.00 avg300=0.00 total=7\nsome avg10=0.00 avg60=0.00 avg300=0.00 total=9", Some(9)),
            ("", None),
            ("some avg10=0.00 avg60=0.00 avg300=0.00", None),
            ("some total=x", None),
            ("full avg10=0.00 total=3", None),
        ];
        for (text, want) in rows {
            assert_eq!(parse_psi_some_total(text), *want, "{text:?}");
        }
    }

    /// The gauge takes a sample when one is due and answers from it until the next: on
    /// this machine the answer is whatever the samples say, but asking twice within
    /// [`RECHECK`] (the shorter interval) reads the file once.
    #[test]
    fn the_gauge_samples_at_most_once_per_interval() {
        let when = || gauge().last.lock().expect("lock").at_ns;
        let now = Instant::now();
        let _ = overloaded_at(now);
        let first = when();
        assert!(first.is_some(), "sampled");
        let _ = overloaded_at(now);
        assert_eq!(when(), first, "no second sample at the same instant");
        let later = now + SAMPLE_EVERY * 2;
        let _ = overloaded_at(later);
        assert!(when() > first, "a sample once due");
    }
}
