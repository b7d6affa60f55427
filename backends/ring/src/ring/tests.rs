//! Tests of the ring's waits (a child module: they reach its private state).

use super::*;
use crate::{Ring, RingOptions};

/// Both ends of one connection in this process, each spinning up to `spin`.
fn pair(spin: Duration) -> (Ring, Ring) {
    let opts = RingOptions::new().capacity(4096).spin(spin);
    let (a, fd) = Ring::create(&opts).expect("create");
    let b = Ring::open(fd, 4096, &opts).expect("open");
    (a, b)
}

/// Something to read elsewhere (the socket) ends a sleep before it starts: a nudge
/// sent while the consumer was still awake woke nobody, and the consumer must not
/// sleep through the bytes it announced (it would until its deadline).
#[test]
fn something_elsewhere_ends_the_sleep_as_a_nudge() {
    let (mut a, mut b) = pair(Duration::ZERO);
    // A nudge while the consumer is awake: nobody sleeps, so nothing is woken.
    a.tx.nudger().nudge();
    let far = Instant::now() + Duration::from_secs(30);
    let mut asked = 0;
    let end = b.rx.sleep_for_data_unless(far, || {
        asked += 1;
        true
    });
    assert!(matches!(end, Ok(WaitEnd::Nudged)), "{end:?}");
    assert_eq!(asked, 1, "asked once, before sleeping");
    // Nothing elsewhere: the deadline ends it, as before.
    let end = b.rx.sleep_for_data_unless(Instant::now() + Duration::from_millis(5), || false);
    assert!(matches!(end, Ok(WaitEnd::Deadline)), "{end:?}");
    // A record in the ring wins over something elsewhere.
    a.send(b"x", Instant::now() + Duration::from_secs(5)).expect("send");
    let end = b.rx.sleep_for_data_unless(far, || true);
    assert!(matches!(end, Ok(WaitEnd::Data)), "{end:?}");
}

/// The ring's waits feed the one wait policy ([`ferry_core::spin::SpinHistory`]): a
/// receive that waited far past [`ferry_core::spin::LONG_WAIT_FACTOR`] windows for
/// nothing turns the spin off (the next wait sleeps at once), and one that ends within
/// that bound turns it on again; a frame that is there costs no wait and teaches nothing.
#[test]
fn the_rings_waits_teach_the_wait_policy() {
    let (mut a, mut b) = pair(Duration::from_micros(1));
    let mut buf = Vec::new();
    let r = b.recv(&mut buf, Instant::now() + Duration::from_millis(2));
    assert!(matches!(r, Err(RingError::Timeout)), "{r:?}");
    assert_eq!(b.rx.spin.learned(), None, "2 ms for nothing is past 8 windows of 1 µs: cold");
    a.send(b"x", Instant::now() + Duration::from_secs(5)).expect("send");
    assert_eq!(b.recv(&mut buf, Instant::now()).expect("recv"), 0);
    assert_eq!(buf, b"x");
    assert_eq!(b.rx.spin.learned(), None, "a frame already there is no wait");

    // A window of a minute: 8 minutes count as long; a 2 ms wait is short and warms it.
    let (_a, mut b) = pair(Duration::from_secs(60));
    b.rx.spin.record(Waited::Slept(Duration::from_secs(3600)));
    assert_eq!(b.rx.spin.learned(), None, "made cold");
    let r = b.recv(&mut buf, Instant::now() + Duration::from_millis(2));
    assert!(matches!(r, Err(RingError::Timeout)), "{r:?}");
    assert!(b.rx.spin.learned().is_some_and(|d| !d.is_zero()), "warm again: {:?}", b.rx.spin.learned());
}

/// Spinning off (a zero window) learns nothing and never spins: every wait sleeps.
#[test]
fn a_zero_window_never_spins() {
    let (_a, mut b) = pair(Duration::ZERO);
    let mut buf = Vec::new();
    let r = b.recv(&mut buf, Instant::now() + Duration::from_millis(1));
    assert!(matches!(r, Err(RingError::Timeout)), "{r:?}");
    assert_eq!(b.rx.spin.window(), Duration::ZERO);
    assert_eq!(spin::decide_alone(b.rx.spin.window(), &b.rx.spin, Instant::now()), Spin::Wait(spin::NoSpin::Off));
}

/// A consumer that finds a record without waiting says where it runs ([`Receiver::note_cpu`]),
/// as the end of a wait does: the producer's spin reads it there. A caller whose answers
/// are always there when it looks would otherwise never say it.
#[test]
fn a_read_without_a_wait_says_where_the_consumer_runs() {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    let (a, b) = pair(Duration::ZERO);
    let sh = &a.tx.sh;
    let peer_word = || sh.map.u32_at(sh.tx.consumer_cpu).expect("word").load(Ordering::Relaxed);
    assert_eq!(peer_word(), 0, "nothing said yet");
    // On one CPU while it looks, so that the CPU read here is the one said.
    let was = sched_getaffinity(None).expect("affinity");
    let cpu = (0..CpuSet::MAX_CPU).find(|&c| was.is_set(c)).expect("a CPU");
    let mut only = CpuSet::new();
    only.set(cpu);
    sched_setaffinity(None, &only).expect("pin");
    b.rx.note_cpu();
    let said = peer_word();
    sched_setaffinity(None, &was).expect("unpin");
    assert_eq!(said, cpu as u32 + 1, "the consumer's CPU, plus one");
}

/// Records published together are seen together: the consumer reads both or neither,
/// never the first alone; without room for all, none is written and the ring is as it
/// was (the first record alone would fit).
#[test]
fn records_sent_together_are_seen_together() {
    let (mut a, mut b) = pair(Duration::ZERO);
    let first = [7u8; 100];
    let second = [9u8; 20];
    let sent = a.tx.try_send_records(&[(3, &[&first[..50], &first[50..]]), (5, &[&second])]).expect("send");
    assert_eq!(sent, Pushed::Sent { doorbell: false });
    let mut buf = Vec::new();
    assert_eq!(b.rx.try_recv(&mut buf).expect("recv"), Some(3));
    assert_eq!(buf, first);
    assert_eq!(b.rx.try_recv(&mut buf).expect("recv"), Some(5));
    assert_eq!(buf, second);
    assert_eq!(b.rx.try_recv(&mut buf).expect("recv"), None);
    // Room for the first (3,000 bytes of 4,096) but not for both.
    let big = vec![1u8; 3000];
    let more = vec![2u8; 2000];
    let full = a.tx.try_send_records(&[(3, &[&big]), (5, &[&more])]).expect("send");
    assert_eq!(full, Pushed::Full);
    assert_eq!(b.rx.try_recv(&mut buf).expect("recv"), None, "a record of a batch that did not fit was published");
    // The ring still works, from where it was.
    assert!(matches!(a.tx.try_send_parts(4, &[&big]), Ok(Pushed::Sent { .. })));
    assert_eq!(b.rx.try_recv(&mut buf).expect("recv"), Some(4));
    assert_eq!(buf, big);
}
