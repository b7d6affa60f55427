//! `Nudge` (a producer waking its consumer from the futex without publishing, before a
//! frame it writes to the socket beside the ring) and `Receiver::wait_for_data`: a nudged
//! sleeper returns `Nudged`, a record returns `Data`, a deadline `Deadline`; a consumer
//! waiting behind its doorbell is left alone. One process, two threads.

#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use ferry_ring::{Ring, RingOptions, WaitEnd};

fn pair(spin: Duration) -> (Ring, Ring) {
    let opts = RingOptions::new().spin(spin);
    let (creator, fd) = Ring::create(&opts).unwrap();
    let opener = Ring::open(fd, creator.capacity(), &opts).unwrap();
    (creator, opener)
}

#[test]
fn a_nudge_wakes_a_sleeping_consumer_without_a_record() {
    let (creator, opener) = pair(Duration::ZERO);
    let (mut tx, _creator_rx) = creator.into_split();
    let (_opener_tx, mut rx) = opener.into_split();
    let nudge = tx.nudger();
    let waiter = std::thread::spawn(move || {
        let end = rx.wait_for_data(Instant::now() + Duration::from_secs(30));
        (rx, end)
    });
    // The waiter may not sleep yet when a nudge comes (then it changes nothing): nudge
    // until it returns, a bounded number of times.
    for _ in 0..5000 {
        if waiter.is_finished() {
            break;
        }
        nudge.nudge();
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut rx, end) = waiter.join().unwrap();
    assert_eq!(end.unwrap(), WaitEnd::Nudged);
    assert!(!rx.has_data());
    // A record ends the wait as data; no record and no nudge, as the deadline.
    tx.send(b"x", Instant::now() + Duration::from_secs(5)).unwrap();
    assert_eq!(rx.wait_for_data(Instant::now() + Duration::from_secs(5)).unwrap(), WaitEnd::Data);
    let mut buf = Vec::new();
    assert_eq!(rx.try_recv(&mut buf).unwrap(), Some(0));
    assert_eq!(rx.wait_for_data(Instant::now() + Duration::from_millis(20)).unwrap(), WaitEnd::Deadline);
}

#[test]
fn a_nudge_leaves_an_armed_doorbell_alone() {
    let (creator, opener) = pair(Duration::ZERO);
    let (mut tx, _creator_rx) = creator.into_split();
    let (_opener_tx, mut rx) = opener.into_split();
    assert!(rx.arm_doorbell().unwrap());
    tx.nudger().nudge();
    // Still armed: the next publish tells the producer to ring it.
    let pushed = tx.try_send_parts(0, &[b"y"]).unwrap();
    assert_eq!(pushed, ferry_ring::Pushed::Sent { doorbell: true });
    rx.disarm();
}
