//! The wait policy: one rule for every waiter that may spin before it sleeps in the kernel.
//!
//! A waiter that finds nothing to take (bytes on a socket, a record in a ring, a reply, a
//! job for a pool thread) either sleeps in the kernel (and pays a wake-up when it comes:
//! tens of µs on a virtual machine) or polls for a while (and spends a CPU). The waiters:
//! a socket's read half (`ferry-local`), the pipe's reader task and blocking callers on a
//! same-host ring (`ferry-ring`'s link), the bare ring API's senders and receivers
//! (`ferry_ring::Ring`), a writer waiting for room in a full ring, a blocking caller on a
//! bare unix socket ([`caller`]), and the Python binding's `recv` and handler threads. Each asks [`decide`], a pure function
//! tested as a table, what its next wait does. What it looks at:
//!
//! - the *window* ([`BusyPoll::set_window`], from [`crate::EndpointBuilder::busy_poll`],
//!   or a ring's spin option, `RingOptions::spin`): the longest one wait may spin; zero:
//!   never;
//! - whether its owner *armed* it ([`BusyPoll::arm`]): only when the wait is all there is
//!   to do on its thread (a spinning task holds its worker thread);
//! - its *history* ([`SpinHistory`]): a wait that the spin did not end, and that then
//!   took long, makes the next one wait in the kernel at once (the peer is not answering
//!   quickly now); a wait that ended soon warms it again;
//! - the *machine's load* ([`load::overloaded_at`]): while threads wait for CPUs (the
//!   kernel's pressure stall information, else more runnable threads than CPUs), nobody
//!   spins (the spinner would take the CPU the answer needs);
//! - for a socket reader, the listener that accepted its connection ([`ListenerSpin`]):
//!   whether another connection received bytes lately (then the readers take turns on
//!   the workers and must not spin), and how many of its readers spin now.
//!
//! The counts belong to the listener (none process-wide), so two servers in one process,
//! or two tests, never see each other's spinners; the load is process-wide (it is the
//! machine's).

pub mod caller;
pub mod load;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Lets a connection's read half poll its socket for a while before it goes to sleep
/// waiting for bytes (see the [module](self) for who decides). A window of zero (the
/// default) never spins; the read half spins only while *armed*.
#[derive(Debug, Default)]
pub struct BusyPoll {
    window_ns: AtomicU64,
    armed: AtomicBool,
}

impl BusyPoll {
    /// Sets how long a read may poll before it sleeps (zero: never).
    pub fn set_window(&self, window: Duration) {
        self.window_ns.store(u64::try_from(window.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long a read may poll before it sleeps, when armed.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.load(Ordering::Relaxed))
    }

    /// Allows (or forbids) the next reads to poll.
    pub fn arm(&self, yes: bool) {
        self.armed.store(yes, Ordering::Relaxed);
    }

    /// Whether the next reads may poll.
    pub fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }
}

/// What one wait may do before it waits in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// Poll for up to this long.
    Poll(Duration),
    /// Wait in the kernel at once, for this reason.
    Wait(NoSpin),
}

/// Why a wait does not spin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSpin {
    /// Spinning is off (a zero window), or the waiter cannot spin (a connecting side,
    /// whose reader is a client's).
    Off,
    /// Its owner did not arm it: something else waits to run on its thread.
    Disarmed,
    /// Threads wait for CPUs on this machine ([`load::overloaded_at`]): a spin
    /// would take the CPU the answer needs.
    Overloaded,
    /// Its history says the peer is not answering quickly now ([`SpinHistory`], or no
    /// bytes within the window on a socket).
    Cold,
    /// Another connection of its listener received bytes within
    /// [`ListenerSpin::OTHERS_WINDOW`]: the readers take turns on the workers.
    OthersActive,
    /// As many of its listener's (or pool's) waiters spin as may.
    Full,
}

/// Everything [`decide`] looks at, for one wait.
#[derive(Debug, Clone, Copy)]
pub struct SpinInputs {
    /// The longest one wait may spin ([`BusyPoll::window`], a ring's spin option).
    pub window: Duration,
    /// [`BusyPoll::armed`] (a waiter with nothing else to do on its thread: true).
    pub armed: bool,
    /// What past waits say: how long a spin may pay now ([`SpinHistory::learned`]; a
    /// socket reader: the window while bytes came within it); `None`: cold.
    pub learned: Option<Duration>,
    /// [`load::overloaded_at`].
    pub overloaded: bool,
    /// Whether another connection of the listener received bytes lately (false where
    /// there is no listener).
    pub others_active: bool,
    /// How many of the listener's (or pool's) waiters spin now.
    pub spinning: usize,
    /// How many may.
    pub max_spinning: usize,
}

/// The wait policy: whether one wait spins, and for how long (the first reason not to
/// that holds wins).
pub fn decide(i: SpinInputs) -> Spin {
    if i.window.is_zero() {
        Spin::Wait(NoSpin::Off)
    } else if !i.armed {
        Spin::Wait(NoSpin::Disarmed)
    } else if i.overloaded {
        Spin::Wait(NoSpin::Overloaded)
    } else if i.learned.is_none_or(|d| d.is_zero()) {
        Spin::Wait(NoSpin::Cold)
    } else if i.others_active {
        Spin::Wait(NoSpin::OthersActive)
    } else if i.spinning >= i.max_spinning {
        Spin::Wait(NoSpin::Full)
    } else {
        Spin::Poll(i.learned.map_or(i.window, |d| d.min(i.window)))
    }
}

/// [`decide`] for a waiter alone on its thread, with no listener and no count of
/// spinners (a blocking caller, a ring writer): its window, its history and the load
/// now (`now`: a clock the caller read anyway).
pub fn decide_alone(window: Duration, history: &SpinHistory, now: Instant) -> Spin {
    decide(SpinInputs {
        window,
        armed: true,
        learned: history.learned(),
        overloaded: !window.is_zero() && load::overloaded_at(now),
        others_active: false,
        spinning: 0,
        max_spinning: 1,
    })
}

/// A wait counts as long (the peer is not answering quickly: cold) past this many times
/// the window. Not the window alone: a wait that slept is lengthened by the wake-ups
/// themselves (one for the peer, one for the waiter: about 50 µs between vCPUs), and two
/// sleeping sides judged against the window alone would see every round trip as long and
/// stay asleep for good (measured on the ring: 45 µs a round trip instead of 0.4).
pub const LONG_WAIT_FACTOR: u32 = 8;

/// How one wait ended, for [`SpinHistory::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The spin ended it, after this long.
    Spun(Duration),
    /// The waiter slept (the spin did not end it, or there was none); the whole wait took
    /// this long.
    Slept(Duration),
}

/// A waiter's history: how long a spin may pay now. A pure state machine (durations are
/// passed in), tested as a table.
///
/// - It starts warm at the window; a zero window never spins and learns nothing.
/// - A wait the spin ended keeps it warm (at least twice that wait, up to the window).
/// - A wait that slept but ended within [`LONG_WAIT_FACTOR`] times the window warms it
///   (twice as long as before, at least twice that wait, up to the window): the peer
///   answered soon, and a spin might have caught it.
/// - A longer wait makes it cold: the next wait sleeps in the kernel at once, until a
///   wait ends soon again.
#[derive(Debug, Clone, Copy)]
pub struct SpinHistory {
    window: Duration,
    learned: Option<Duration>,
}

impl SpinHistory {
    /// A history for waits of at most `window` (zero: no spinning), warm.
    pub fn new(window: Duration) -> SpinHistory {
        SpinHistory { window, learned: Some(window) }
    }

    /// The window it was made for.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How long the next wait's spin may pay; `None`: cold.
    pub fn learned(&self) -> Option<Duration> {
        self.learned
    }

    /// Whether a spin that ends a wait has anything to teach: `false` when it is warm at
    /// its whole window, where [`SpinHistory::record`] of any [`Waited::Spun`] changes
    /// nothing (so a caller may skip reading the clock for it).
    pub fn learns_from_spins(&self) -> bool {
        !self.window.is_zero() && self.learned != Some(self.window)
    }

    /// Learns from how the last wait ended.
    pub fn record(&mut self, waited: Waited) {
        if self.window.is_zero() {
            return; // never spins: nothing to learn
        }
        let (w, was) = (self.window, self.learned.unwrap_or(Duration::ZERO));
        self.learned = match waited {
            Waited::Spun(t) => Some(was.max(t.saturating_mul(2)).min(w)),
            Waited::Slept(t) if t <= w.saturating_mul(LONG_WAIT_FACTOR) => {
                Some(was.saturating_mul(2).max(t.saturating_mul(2)).min(w))
            }
            Waited::Slept(_) => None,
        };
    }
}

/// `ferry serve`'s (and the Python binding's) default busy-poll window: 50 µs when this
/// process may use 2 or more CPUs (a spinning waiter then leaves the peer a CPU), else
/// none.
pub fn default_busy_poll() -> Duration {
    Duration::from_micros(if load::cpus() >= 2 { 50 } else { 0 })
}

/// A listener's busy polling, as [`SpinStats`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinStats {
    /// Readers polling now.
    pub spinning: usize,
    /// The most that may at once.
    pub max_spinning: usize,
    /// Polls started since the listener started.
    pub polls: u64,
    /// Polls that found bytes (each saved a wake-up).
    pub hits: u64,
}

/// One listener's readers: which received bytes last and when, and how many spin.
///
/// Busy polling pays while one connection is active and costs while several are: a
/// reader that spins holds its worker thread (and the runtime's I/O driver, when it is the
/// only worker), so the other connections' requests wait for its window. 16 clients
/// calling at once on 2 CPUs measured a p99 of 7.7 ms with spinning and 0.2 ms without.
///
/// The activity is two words, each `micros since the listener started (wrapping u32) << 32
/// | reader id`: the last read, and the last read by another reader than that one. Updated
/// without a lock: a lost update only makes one decision on stale data.
#[derive(Debug)]
pub struct ListenerSpin {
    start: Instant,
    last: AtomicU64,
    last_other: AtomicU64,
    /// The last reader id given out (ids start at 1; 0 means "no read yet").
    ids: AtomicU32,
    spinning: AtomicUsize,
    max_spinning: usize,
    polls: AtomicU64,
    hits: AtomicU64,
}

impl Default for ListenerSpin {
    fn default() -> Self {
        Self::with_max(Self::max_spinning())
    }
}

impl ListenerSpin {
    /// How recently another connection must have received bytes to keep a reader from
    /// spinning.
    pub const OTHERS_WINDOW: Duration = Duration::from_millis(1);

    /// At most this many readers of one listener spin at once: half the CPUs this process
    /// may use, at least one (the rest are for the handlers and the peers).
    pub fn max_spinning() -> usize {
        (load::cpus() as usize / 2).max(1)
    }

    /// A listener's state whose readers spin at most `max` at once.
    pub fn with_max(max: usize) -> Self {
        ListenerSpin {
            start: Instant::now(),
            last: AtomicU64::new(0),
            last_other: AtomicU64::new(0),
            ids: AtomicU32::new(0),
            spinning: AtomicUsize::new(0),
            max_spinning: max,
            polls: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// The handle of a new reader (a connection this listener accepted).
    pub fn reader(self: &Arc<Self>) -> SpinReader {
        let id = loop {
            let id = self.ids.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if id != 0 {
                break id;
            }
        };
        SpinReader { listener: self.clone(), id }
    }

    /// Its counts now.
    pub fn stats(&self) -> SpinStats {
        SpinStats {
            spinning: self.spinning.load(Ordering::Acquire),
            max_spinning: self.max_spinning,
            polls: self.polls.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
        }
    }

    /// Microseconds since the listener started, wrapping at 2^32 (71 minutes): only
    /// differences shorter than that are compared.
    fn now_us(&self) -> u32 {
        self.start.elapsed().as_micros() as u32
    }

    /// Reader `id` received bytes at `now` (µs).
    fn read(&self, id: u32, now: u32) {
        let last = self.last.swap((u64::from(now) << 32) | u64::from(id), Ordering::Relaxed);
        if last as u32 != id {
            self.last_other.store(last, Ordering::Relaxed);
        }
    }

    /// Whether a reader other than `id` received bytes within [`Self::OTHERS_WINDOW`] of
    /// `now`.
    fn others_active(&self, id: u32, now: u32) -> bool {
        let window = Self::OTHERS_WINDOW.as_micros() as u32;
        [self.last.load(Ordering::Relaxed), self.last_other.load(Ordering::Relaxed)].into_iter().any(|w| {
            let (at, who) = ((w >> 32) as u32, w as u32);
            who != 0 && who != id && now.wrapping_sub(at) < window
        })
    }
}

/// One reader of a listener ([`ListenerSpin::reader`]).
#[derive(Debug)]
pub struct SpinReader {
    listener: Arc<ListenerSpin>,
    id: u32,
}

impl SpinReader {
    /// Bytes arrived on this reader's connection.
    pub fn received(&self) {
        self.listener.read(self.id, self.listener.now_us());
    }

    /// [`decide`] for a read now, bytes having last arrived `since_data` ago (`None`: not
    /// since the last poll that found none): warm while that is within the window.
    pub fn decide(&self, busy: &BusyPoll, since_data: Option<Duration>) -> Spin {
        let l = &self.listener;
        let window = busy.window();
        let (armed, learned) = (busy.armed(), since_data.filter(|d| *d < window).map(|_| window));
        decide(SpinInputs {
            window,
            armed,
            learned,
            // Read only when it could matter (a clock read and, every 1-10 ms, a file).
            overloaded: !window.is_zero() && armed && learned.is_some() && load::overloaded(),
            others_active: l.others_active(self.id, l.now_us()),
            spinning: l.spinning.load(Ordering::Acquire),
            max_spinning: l.max_spinning,
        })
    }

    /// A place among the listener's spinning readers, given back on drop; `None` when they
    /// are all taken (another reader took the last since [`SpinReader::decide`]).
    pub fn enter(&self) -> Option<SpinPlace<'_>> {
        let l = &self.listener;
        l.spinning.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < l.max_spinning).then_some(n + 1)).ok()?;
        l.polls.fetch_add(1, Ordering::Relaxed);
        Some(SpinPlace { listener: l })
    }
}

/// A reader's place among its listener's spinning readers ([`SpinReader::enter`]).
#[derive(Debug)]
pub struct SpinPlace<'a> {
    listener: &'a ListenerSpin,
}

impl SpinPlace<'_> {
    /// The poll found bytes.
    pub fn hit(&self) {
        self.listener.hits.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for SpinPlace<'_> {
    fn drop(&mut self) {
        self.listener.spinning.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);

    /// The policy, one row per reason: the first that holds wins.
    #[test]
    fn decide_table() {
        let base = SpinInputs {
            window: W,
            armed: true,
            learned: Some(W),
            overloaded: false,
            others_active: false,
            spinning: 0,
            max_spinning: 1,
        };
        let short = Duration::from_micros(6);
        let rows: &[(&str, SpinInputs, Spin)] = &[
            ("all clear", base, Spin::Poll(W)),
            ("zero window", SpinInputs { window: Duration::ZERO, ..base }, Spin::Wait(NoSpin::Off)),
            (
                "zero window wins over the rest",
                SpinInputs {
                    window: Duration::ZERO,
                    armed: false,
                    learned: None,
                    overloaded: true,
                    others_active: true,
                    spinning: 9,
                    ..base
                },
                Spin::Wait(NoSpin::Off),
            ),
            ("disarmed", SpinInputs { armed: false, ..base }, Spin::Wait(NoSpin::Disarmed)),
            (
                "disarmed wins over overloaded and cold",
                SpinInputs { armed: false, overloaded: true, learned: None, ..base },
                Spin::Wait(NoSpin::Disarmed),
            ),
            ("overloaded", SpinInputs { overloaded: true, ..base }, Spin::Wait(NoSpin::Overloaded)),
            (
                "overloaded wins over a warm history",
                SpinInputs { overloaded: true, learned: Some(short), ..base },
                Spin::Wait(NoSpin::Overloaded),
            ),
            (
                "overloaded wins over cold, others active and full",
                SpinInputs { overloaded: true, learned: None, others_active: true, spinning: 1, ..base },
                Spin::Wait(NoSpin::Overloaded),
            ),
            ("cold", SpinInputs { learned: None, ..base }, Spin::Wait(NoSpin::Cold)),
            ("learned nothing", SpinInputs { learned: Some(Duration::ZERO), ..base }, Spin::Wait(NoSpin::Cold)),
            ("learned a shorter spin", SpinInputs { learned: Some(short), ..base }, Spin::Poll(short)),
            ("never past the window", SpinInputs { learned: Some(W * 3), ..base }, Spin::Poll(W)),
            (
                "cold wins over others active",
                SpinInputs { learned: None, others_active: true, ..base },
                Spin::Wait(NoSpin::Cold),
            ),
            ("others active", SpinInputs { others_active: true, ..base }, Spin::Wait(NoSpin::OthersActive)),
            (
                "others active wins over full",
                SpinInputs { others_active: true, spinning: 1, ..base },
                Spin::Wait(NoSpin::OthersActive),
            ),
            ("full", SpinInputs { spinning: 1, ..base }, Spin::Wait(NoSpin::Full)),
            ("over full", SpinInputs { spinning: 3, max_spinning: 2, ..base }, Spin::Wait(NoSpin::Full)),
            ("room left", SpinInputs { spinning: 1, max_spinning: 2, ..base }, Spin::Poll(W)),
            ("no room ever", SpinInputs { max_spinning: 0, ..base }, Spin::Wait(NoSpin::Full)),
        ];
        for (what, inputs, want) in rows {
            assert_eq!(decide(*inputs), *want, "{what}");
        }
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The history, one row per rule: (window, learned before, how the wait ended,
    /// learned after).
    #[test]
    fn history_table() {
        let rows = [
            (us(50), Some(us(50)), Waited::Spun(us(1)), Some(us(50))),
            (us(50), Some(us(4)), Waited::Spun(us(3)), Some(us(6))),
            (us(50), Some(us(40)), Waited::Spun(us(30)), Some(us(50))),
            (us(50), None, Waited::Spun(us(3)), Some(us(6))),
            (us(50), Some(us(8)), Waited::Slept(us(20)), Some(us(40))),
            (us(50), Some(us(8)), Waited::Slept(us(9)), Some(us(18))),
            (us(50), Some(us(2)), Waited::Slept(us(90)), Some(us(50))),
            (us(50), Some(us(50)), Waited::Slept(us(400)), Some(us(50))),
            (us(50), None, Waited::Slept(us(400)), Some(us(50))),
            (us(50), None, Waited::Slept(us(10)), Some(us(20))),
            (us(50), Some(us(50)), Waited::Slept(us(401)), None),
            (us(50), Some(us(3)), Waited::Slept(us(5_000)), None),
            (us(50), None, Waited::Slept(us(5_000)), None),
            (Duration::ZERO, Some(Duration::ZERO), Waited::Slept(us(1)), Some(Duration::ZERO)),
            (Duration::ZERO, Some(Duration::ZERO), Waited::Slept(us(5_000)), Some(Duration::ZERO)),
        ];
        for (window, before, waited, after) in rows {
            let mut h = SpinHistory { window, learned: before };
            let learns = h.learns_from_spins();
            h.record(waited);
            assert_eq!(h.learned(), after, "window {window:?}, learned {before:?}, {waited:?}");
            // A history that says it learns nothing from spins is unchanged by any spin.
            if !learns {
                let mut again = SpinHistory { window, learned: before };
                for t in [us(0), us(1), us(49), us(50), us(10_000)] {
                    again.record(Waited::Spun(t));
                    assert_eq!(again.learned(), before, "window {window:?}, learned {before:?}, spun {t:?}");
                }
            }
        }
    }

    /// A peer gone quiet makes the waiter wait in the kernel at once (decide says Cold);
    /// one answer that comes soon warms it again, and the policy spins again.
    #[test]
    fn a_quiet_peer_turns_the_spin_off_until_it_answers_soon() {
        let window = us(50);
        let mut h = SpinHistory::new(window);
        let inputs = |h: &SpinHistory| SpinInputs {
            window,
            armed: true,
            learned: h.learned(),
            overloaded: false,
            others_active: false,
            spinning: 0,
            max_spinning: 1,
        };
        assert_eq!(decide(inputs(&h)), Spin::Poll(window), "warm at first");
        h.record(Waited::Slept(Duration::from_secs(1)));
        assert_eq!(decide(inputs(&h)), Spin::Wait(NoSpin::Cold));
        h.record(Waited::Slept(us(60)));
        assert_eq!(decide(inputs(&h)), Spin::Poll(window), "an answer within the long-wait bound");
        assert_eq!(decide(SpinInputs { overloaded: true, ..inputs(&h) }), Spin::Wait(NoSpin::Overloaded));
    }

    /// A reader spins while it alone receives bytes, not while another connection of its
    /// listener did within the window (the window counted from the other's last read, in
    /// µs, across the clock's wrap).
    #[test]
    fn a_reader_spins_only_while_no_other_connection_is_active() {
        let a = Arc::new(ListenerSpin::with_max(1));
        let (r1, r2, r3) = (a.reader().id, a.reader().id, a.reader().id);
        assert!(r1 != 0 && r1 != r2 && r2 != r3);
        let w = ListenerSpin::OTHERS_WINDOW.as_micros() as u32;
        let t0 = u32::MAX - 15; // (the µs clock wraps during the test)
        let at = |d: u32| t0.wrapping_add(d);
        assert!(!a.others_active(r1, at(0)), "nothing read yet");
        a.read(r1, at(10));
        a.read(r1, at(20));
        assert!(!a.others_active(r1, at(30)), "only reader 1 is active");
        assert!(a.others_active(r2, at(30)), "for reader 2, reader 1 is active");
        a.read(r2, at(40));
        assert!(a.others_active(r1, at(50)) && a.others_active(r2, at(50)), "both active");
        a.read(r2, at(60));
        a.read(r2, at(70)); // (reader 1's read stays the last other one)
        assert!(a.others_active(r2, at(20 + w - 1)), "reader 1 read within the window");
        assert!(!a.others_active(r2, at(20 + w)), "reader 1 fell out of the window");
        assert!(a.others_active(r1, at(70 + w - 1)) && !a.others_active(r1, at(70 + w)));
        assert!(!a.others_active(r3, at(70 + w)), "nobody within the window");
        // Another listener's readers are not counted.
        let other = Arc::new(ListenerSpin::with_max(1));
        assert!(!other.others_active(other.reader().id, at(71)));
    }

    /// Places are the listener's own, counted and given back; the decision sees them.
    #[test]
    fn places_are_counted_per_listener() {
        let (a, b) = (Arc::new(ListenerSpin::with_max(2)), Arc::new(ListenerSpin::with_max(1)));
        let (ra1, ra2, ra3, rb) = (a.reader(), a.reader(), a.reader(), b.reader());
        let busy = BusyPoll::default();
        busy.set_window(Duration::from_secs(1));
        busy.arm(true);
        let recent = Some(Duration::ZERO);
        let p1 = ra1.enter().expect("a first place");
        let p2 = ra2.enter().expect("a second place");
        assert!(ra3.enter().is_none(), "two at most");
        assert_eq!(ra3.decide(&busy, recent), Spin::Wait(NoSpin::Full));
        assert_eq!(rb.decide(&busy, recent), Spin::Poll(Duration::from_secs(1)), "another listener's readers");
        let pb = rb.enter().expect("its own place");
        p1.hit();
        drop(p1);
        assert_eq!(a.stats(), SpinStats { spinning: 1, max_spinning: 2, polls: 2, hits: 1 });
        assert!(ra3.enter().is_some(), "a place given back is taken again");
        drop((p2, pb));
        assert_eq!(a.stats().spinning, 0);
        assert_eq!(b.stats(), SpinStats { spinning: 0, max_spinning: 1, polls: 1, hits: 0 });
    }
}
