//! The two halves of a connection's rings: [`Sender`] (producer of one ring) and
//! [`Receiver`] (consumer of the other), and the waiting both share.
//!
//! Publishing and waking (the producer; the consumer's side is symmetric with `head` and
//! `producer_sleeping`):
//!
//! 1. write the record's bytes, then store `tail` (Release);
//! 2. a SeqCst fence, then read `consumer_sleeping`; only when it is non-zero, swap it to 0
//!    and `FUTEX_WAKE` it.
//!
//! A waiter stores 1 into its `*_sleeping` word, fences (SeqCst), looks at the indices
//! (and its local state) once more, and only then sleeps with `FUTEX_WAIT(word, 1)`. One of
//! the two always sees the other's store (the fences order the store before the load on both
//! sides), so a wake-up is never lost; a spinning waiter costs the producer no system call.
//!
//! Every index and length read from the shared memory is checked before use (see
//! [`take`] and [`Sender::free`]); a check that fails poisons the half, marks the connection
//! corrupt (the other half fails too) and tells the peer the rings are closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering, fence};
use std::time::{Duration, Instant};

use ferry_core::spin::{self, Spin, SpinHistory, Waited};

use crate::RingError;
use crate::cpu::Cpus;
use crate::layout::{self, CONSUMER_CLOSED, PRODUCER_CLOSED, RingLayout};
use crate::sys::{self, SharedMap};

/// The connection is usable.
const OPEN: u8 = 0;
/// The death notice arrived ([`PeerNotice::peer_gone`]).
const PEER_GONE: u8 = 1;
/// One half found the shared memory corrupt.
const CORRUPT: u8 = 2;
/// This process ended the connection itself ([`PeerNotice::close_here`]).
const CLOSED_HERE: u8 = 3;

/// A `*_sleeping` word's value meaning "asleep on something else than the futex (an async
/// reader waiting on its socket): tell the caller to ring the doorbell" (see
/// [`Receiver::arm_doorbell`] and [`Pushed::Sent`]).
const DOORBELL: u32 = 2;

/// What [`Sender::try_send_parts`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// The record is published. `doorbell`: the consumer had armed its doorbell
    /// ([`Receiver::arm_doorbell`]) and waits elsewhere; the caller must wake it (write the
    /// doorbell on the socket).
    Sent {
        /// The consumer waits for a doorbell.
        doorbell: bool,
    },
    /// No room now; nothing was written. Try again once the consumer made room.
    Full,
}

/// What both halves of a connection share in this process.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) map: SharedMap,
    /// The ring this side produces into.
    pub(crate) tx: RingLayout,
    /// The ring this side consumes from.
    pub(crate) rx: RingLayout,
    state: AtomicU8,
    /// Where the two sides run ([`crate::cpu`]).
    cpus: Cpus,
}

impl Shared {
    pub(crate) fn new(map: SharedMap, tx: RingLayout, rx: RingLayout) -> Shared {
        Shared { map, tx, rx, state: AtomicU8::new(OPEN), cpus: Cpus::default() }
    }

    /// A spin's look at where the peer runs (every 32 polls), `sleeping` naming the wait:
    /// true when the spin may go on ([`crate::cpu`]).
    fn spin_on(&self, sleeping: usize) -> bool {
        let (peer, mine) = (self.map.u32_at(self.tx.consumer_cpu), self.map.u32_at(self.rx.consumer_cpu));
        self.cpus.spin_on(peer, mine, sleeping == self.rx.consumer_sleeping)
    }

    fn check_state(&self) -> Result<(), RingError> {
        match self.state.load(Ordering::SeqCst) {
            OPEN => Ok(()),
            PEER_GONE => Err(RingError::PeerGone),
            CLOSED_HERE => Err(RingError::Closed),
            _ => Err(RingError::Corrupt("the other direction of this connection was corrupted by the peer".into())),
        }
    }

    /// Moves the connection out of `OPEN` (first reason wins) and wakes this process's
    /// waiters, which then see the state.
    fn end(&self, reason: u8) {
        let _ = self.state.compare_exchange(OPEN, reason, Ordering::SeqCst, Ordering::SeqCst);
        self.wake(self.rx.consumer_sleeping);
        self.wake(self.tx.producer_sleeping);
    }

    /// Swaps the sleeping word at `offset` to 0 and wakes its futex sleepers if it was set.
    /// Returns true when it held [`DOORBELL`]: the waiter sleeps elsewhere and the caller
    /// must ring its doorbell. (A hostile peer can store anything there; the worst it gets
    /// is a futex wake or a doorbell it did not need.)
    fn wake(&self, offset: usize) -> bool {
        if let Some(word) = self.map.u32_at(offset)
            && word.load(Ordering::SeqCst) != 0
        {
            match word.swap(0, Ordering::SeqCst) {
                0 => {}
                DOORBELL => return true,
                _ => sys::futex_wake(word),
            }
        }
        false
    }

    /// Sets `bits` in a ring's `closed` word and wakes the peer's waiter on that ring.
    fn close_ring(&self, ring: &RingLayout, bits: u32, wake: usize) {
        if let Some(w) = self.map.u32_at(ring.closed) {
            w.fetch_or(bits, Ordering::SeqCst);
        }
        self.wake(wake);
    }

    fn closed_bits(&self, ring: &RingLayout) -> u32 {
        self.map.u32_at(ring.closed).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// A corrupt ring: the connection is over. The peer is told (closed bits) in case it is
    /// merely confused rather than hostile.
    fn corrupt(&self, what: String) -> RingError {
        self.end(CORRUPT);
        self.close_ring(&self.tx, PRODUCER_CLOSED, self.tx.consumer_sleeping);
        self.close_ring(&self.rx, CONSUMER_CLOSED, self.rx.producer_sleeping);
        RingError::Corrupt(what.into())
    }

    fn u64(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        self.map.u64_at(offset).expect("ring words are in bounds and aligned (layout tests)")
    }

    /// Waits until `ready` says so: spins while the wait policy allows
    /// ([`spin::decide_alone`]: the window, what `history` learned, the machine's load),
    /// then sleeps on the futex word at `sleeping` until woken or `deadline`; `history`
    /// learns how the wait ended. A spin that finds the peer on its CPU moves off it, or
    /// stops ([`crate::cpu`]). `ready` returns `Ok(true)` when done and an error for a
    /// closed or corrupt ring; the local state is checked too. With `stop_on_wake`, a
    /// wake-up that finds nothing (the peer nudged this side: [`Nudge`]) ends the wait with
    /// `Ok(false)`.
    fn wait_until(
        &self,
        sleeping: usize,
        history: &mut SpinHistory,
        deadline: Instant,
        stop_on_wake: bool,
        mut ready: impl FnMut() -> Result<bool, RingError>,
    ) -> Result<bool, RingError> {
        let start = Instant::now();
        if let Spin::Poll(window) = spin::decide_alone(history.window(), history, start) {
            let mut polls = 0u32;
            // The clock as last read: a wait the spin ends records how long it spun from
            // this, not from a fresh read (the answer is there: every nanosecond now is
            // latency). It falls short by at most 32 polls, which only makes the window
            // grow a little less.
            let mut seen = start;
            loop {
                if ready()? {
                    history.record(Waited::Spun(seen.duration_since(start)));
                    self.ended_wait(sleeping);
                    return Ok(true);
                }
                std::hint::spin_loop();
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(32) {
                    self.check_state()?;
                    seen = Instant::now();
                    if seen.duration_since(start) >= window || seen >= deadline {
                        break;
                    }
                    if !self.spin_on(sleeping) {
                        break;
                    }
                }
            }
        }
        let word = self.map.u32_at(sleeping).expect("futex words are in bounds and aligned (layout tests)");
        loop {
            let now = Instant::now();
            if now >= deadline {
                history.record(Waited::Slept(now.duration_since(start)));
                return Err(RingError::Timeout);
            }
            word.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            // A frame (or room) that is there wins over a death notice that came with it.
            let r = match ready() {
                Ok(false) => self.check_state().map(|()| false),
                other => other,
            };
            if !matches!(r, Ok(false)) {
                word.store(0, Ordering::Relaxed);
                history.record(Waited::Slept(start.elapsed()));
                if r.is_ok() {
                    self.ended_wait(sleeping);
                }
                return r.map(|_| true);
            }
            sys::futex_wait(word, 1, deadline.saturating_duration_since(now));
            // The peer stores 0 before it wakes this side (a timeout or a signal leaves 1).
            if stop_on_wake && word.load(Ordering::SeqCst) == 0 {
                let r = ready()?;
                history.record(Waited::Slept(start.elapsed()));
                self.ended_wait(sleeping);
                return Ok(r);
            }
        }
    }

    /// A wait on the futex word at `sleeping` ended: the consumer's waits say where it runs.
    fn ended_wait(&self, sleeping: usize) {
        if sleeping == self.rx.consumer_sleeping {
            self.cpus.say(self.map.u32_at(self.rx.consumer_cpu));
        }
    }
}

/// A handle that ends the connection from outside its halves: the death notice (socket EOF,
/// see [`crate::DeathWatch`]) calls [`PeerNotice::peer_gone`], which wakes this process's
/// waiters; every wait and every later call then fails with [`RingError::PeerGone`] (frames
/// already published are still received first).
#[derive(Debug, Clone)]
pub struct PeerNotice(pub(crate) Arc<Shared>);

impl PeerNotice {
    /// The peer is gone: fail every wait of this connection.
    pub fn peer_gone(&self) {
        self.0.end(PEER_GONE);
    }

    /// This process is done with the connection (its owner closed it): fail every wait
    /// and every later call of both halves with [`RingError::Closed`], at once. A sender
    /// waiting for room in a ring its peer stopped reading ends this way, without waiting
    /// for the peer. Nothing is written to the shared memory.
    pub fn close_here(&self) {
        self.0.end(CLOSED_HERE);
    }

    /// Whether the connection is still open (no death notice, no corruption).
    pub fn is_open(&self) -> bool {
        self.0.check_state().is_ok()
    }
}

/// The producing half: sends frames into this side's outgoing ring. One per connection
/// (single producer); `Send`, so it can live on its own thread.
#[derive(Debug)]
pub struct Sender {
    pub(crate) sh: Arc<Shared>,
    /// Bytes ever published (this side is the only writer of `tail`; the shared copy is
    /// never read back).
    tail: u64,
    /// A `head` seen earlier and checked: the space it proves free is still free.
    head_seen: u64,
    /// What this half's waits taught the wait policy (its window: [`crate::RingOptions::spin`]).
    spin: SpinHistory,
    poisoned: Option<RingError>,
}

impl Sender {
    pub(crate) fn new(sh: Arc<Shared>, spin: Duration) -> Sender {
        Sender { sh, tail: 0, head_seen: 0, spin: SpinHistory::new(spin), poisoned: None }
    }

    /// A [`PeerNotice`] for this connection (both halves share it).
    pub fn notice(&self) -> PeerNotice {
        PeerNotice(self.sh.clone())
    }

    /// A [`Nudge`] for this ring's consumer.
    pub fn nudger(&self) -> Nudge {
        Nudge(self.sh.clone())
    }

    /// The largest payload one frame can carry; larger ones get [`RingError::TooLarge`].
    pub fn max_frame(&self) -> usize {
        layout::max_frame(self.sh.tx.capacity)
    }

    /// Sends `payload` with tag 0. See [`Sender::send_tagged`].
    pub fn send(&mut self, payload: &[u8], deadline: Instant) -> Result<(), RingError> {
        self.send_tagged(0, payload, deadline)
    }

    /// Sends one frame: `tag` (a number for the caller's protocol, e.g. "the next frame is on
    /// the socket") and `payload`. Waits for room until `deadline` (spinning, then sleeping).
    /// A payload over [`Sender::max_frame`] is refused with [`RingError::TooLarge`] and the
    /// ring is unchanged (send it over the socket instead).
    pub fn send_tagged(&mut self, tag: u32, payload: &[u8], deadline: Instant) -> Result<(), RingError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let r = self.send_inner(tag, payload, deadline);
        if let Err(e @ RingError::Corrupt(_)) = &r {
            self.poisoned = Some(e.clone());
        }
        r
    }

    /// Publishes one record made of `parts` (concatenated: a frame's prefix, header and
    /// payload pieces, with no copy first) if there is room now, without waiting. A record
    /// over [`Sender::max_frame`] is [`RingError::TooLarge`]; a full ring is
    /// [`Pushed::Full`] (the consumer frees room as it reads; a caller that cannot block
    /// tries again later). On success, [`Pushed::Sent`] says whether the consumer must be
    /// woken through its doorbell.
    pub fn try_send_parts(&mut self, tag: u32, parts: &[&[u8]]) -> Result<Pushed, RingError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let r = self.check_send(len).and_then(|(len32, need)| {
            let cap = self.sh.tx.capacity as u64;
            if cap - (self.tail - self.head_seen) < need {
                self.head_seen = Sender::free(&self.sh, self.tail)?;
                if cap - (self.tail - self.head_seen) < need {
                    return Ok(Pushed::Full);
                }
            }
            Ok(Pushed::Sent { doorbell: self.publish(tag, len32, need, parts) })
        });
        if let Err(e @ RingError::Corrupt(_)) = &r {
            self.poisoned = Some(e.clone());
        }
        r
    }

    /// Publishes several records at once (each `(tag, parts)` as [`Sender::try_send_parts`]
    /// makes one), if there is room for them all now: the consumer sees all of them or
    /// none. E.g. an answer and the release of the memory it returns, so that a peer which
    /// loses its CPU between the two never leaves the answer's receiver without the
    /// release. [`Pushed::Full`]: nothing was written.
    pub fn try_send_records(&mut self, records: &[(u32, &[&[u8]])]) -> Result<Pushed, RingError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let r = (|| {
            let mut sized = Vec::with_capacity(records.len());
            let mut total = 0u64;
            for &(tag, parts) in records {
                let (len32, need) = self.check_send(parts.iter().map(|p| p.len()).sum())?;
                total += need;
                sized.push((tag, len32, need, parts));
            }
            let cap = self.sh.tx.capacity as u64;
            if cap - (self.tail - self.head_seen) < total {
                self.head_seen = Sender::free(&self.sh, self.tail)?;
                if cap - (self.tail - self.head_seen) < total {
                    return Ok(Pushed::Full);
                }
            }
            let start = self.tail;
            for (tag, len32, need, parts) in sized {
                self.write_record(tag, len32, parts);
                self.tail += need;
            }
            Ok(Pushed::Sent { doorbell: self.commit(start) })
        })();
        if let Err(e @ RingError::Corrupt(_)) = &r {
            self.poisoned = Some(e.clone());
        }
        r
    }

    /// Checks that a record of `len` bytes may be sent now; returns its length as written
    /// and the ring bytes it takes.
    fn check_send(&self, len: usize) -> Result<(u32, u64), RingError> {
        let (sh, ring) = (&*self.sh, self.sh.tx);
        let max = layout::max_frame(ring.capacity);
        let len32 = u32::try_from(len).ok().filter(|_| len <= max);
        let Some(len32) = len32 else { return Err(RingError::TooLarge { len, max }) };
        sh.check_state()?;
        if sh.closed_bits(&ring) & CONSUMER_CLOSED != 0 {
            return Err(RingError::Closed);
        }
        Ok((len32, layout::record_len(len) as u64))
    }

    /// Writes the record at the tail (room is checked), publishes it and wakes the
    /// consumer; returns true when the consumer waits for its doorbell.
    fn publish(&mut self, tag: u32, len32: u32, need: u64, parts: &[&[u8]]) -> bool {
        let start = self.tail;
        self.write_record(tag, len32, parts);
        self.tail += need;
        self.commit(start)
    }

    /// Writes a record at the tail (room is checked), unpublished.
    fn write_record(&self, tag: u32, len32: u32, parts: &[&[u8]]) {
        let (sh, ring) = (&*self.sh, self.sh.tx);
        let at = (self.tail % ring.capacity as u64) as usize;
        let header = u64::from(len32) | (u64::from(tag) << 32);
        sh.u64(ring.data + at).store(header, Ordering::Relaxed);
        let mut pos = (at + layout::RECORD_HEADER) % ring.capacity;
        for part in parts {
            let first = part.len().min(ring.capacity - pos);
            let ok =
                sh.map.write(ring.data + pos, &part[..first]).and_then(|()| sh.map.write(ring.data, &part[first..]));
            debug_assert!(ok.is_some(), "record inside the data area");
            pos = (pos + part.len()) % ring.capacity;
        }
    }

    /// Publishes what was written since the tail was `start` (the tail is past it now) and
    /// wakes the consumer; returns true when the consumer waits for its doorbell.
    fn commit(&mut self, start: u64) -> bool {
        let (sh, ring) = (&*self.sh, self.sh.tx);
        sh.u64(ring.tail).store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        // The consumer reads the records and the tail next: from the shared cache, not ours.
        let at = (start % ring.capacity as u64) as usize;
        sh.map.demote(ring.data + at, ((self.tail - start) as usize).min(ring.capacity - at));
        sh.map.demote(ring.tail, 8);
        sh.wake(ring.consumer_sleeping)
    }

    fn send_inner(&mut self, tag: u32, payload: &[u8], deadline: Instant) -> Result<(), RingError> {
        let (len32, need) = self.check_send(payload.len())?;
        let (sh, ring) = (&*self.sh, self.sh.tx);
        let cap = ring.capacity as u64;
        if cap - (self.tail - self.head_seen) < need {
            let (tail, head_seen) = (self.tail, &mut self.head_seen);
            let mut room = || -> Result<bool, RingError> {
                *head_seen = Sender::free(sh, tail)?;
                if cap - (tail - *head_seen) >= need {
                    return Ok(true);
                }
                if sh.closed_bits(&ring) & CONSUMER_CLOSED != 0 {
                    return Err(RingError::Closed);
                }
                Ok(false)
            };
            if !room()? {
                sh.wait_until(ring.producer_sleeping, &mut self.spin, deadline, false, room)?;
            }
        }
        // A blocking sender's consumer sleeps on the futex; one that armed a doorbell
        // is served by the async senders (`try_send_parts`), which report it.
        self.publish(tag, len32, need, &[payload]);
        Ok(())
    }

    /// Reads and checks the consumer's `head`: at most `tail`, at most a capacity behind it,
    /// a multiple of 8. Returns it.
    fn free(sh: &Shared, tail: u64) -> Result<u64, RingError> {
        let ring = sh.tx;
        let head = sh.u64(ring.head).load(Ordering::Acquire);
        let used = tail.wrapping_sub(head);
        if used > ring.capacity as u64 || !head.is_multiple_of(8) {
            return Err(sh.corrupt(format!(
                "the consumer's head index {head} is not within {} bytes behind the tail {tail}, or misaligned",
                ring.capacity
            )));
        }
        Ok(head)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let ring = self.sh.tx;
        self.sh.close_ring(&ring, PRODUCER_CLOSED, ring.consumer_sleeping);
    }
}

/// How [`Receiver::wait_for_data`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// A record (or a close) is there.
    Data,
    /// The deadline passed.
    Deadline,
    /// The producer nudged this side ([`Nudge`]) with nothing in the ring: look at the
    /// socket beside it.
    Nudged,
}

/// Wakes the consumer of a ring from its futex without publishing anything (made by
/// [`Sender::nudger`]), for a producer about to fill the socket beside the ring with a
/// frame the consumer must read before the ring says so.
#[derive(Debug, Clone)]
pub struct Nudge(Arc<Shared>);

impl Nudge {
    /// Wakes the consumer if it sleeps on the futex (a consumer waiting behind its doorbell
    /// waits on the socket already, and is left alone).
    pub fn nudge(&self) {
        let sh = &*self.0;
        if let Some(word) = sh.map.u32_at(sh.tx.consumer_sleeping)
            && word.compare_exchange(1, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        {
            sys::futex_wake(word);
        }
    }
}

/// The consuming half: receives frames from this side's incoming ring. One per connection
/// (single consumer); `Send`, so it can live on its own thread, or be moved into a blocking
/// pool by an async caller (see the crate docs).
#[derive(Debug)]
pub struct Receiver {
    pub(crate) sh: Arc<Shared>,
    /// Bytes ever consumed (this side is the only writer of `head`).
    head: u64,
    /// What this half's waits taught the wait policy (its window: [`crate::RingOptions::spin`]).
    spin: SpinHistory,
    poisoned: Option<RingError>,
}

impl Receiver {
    pub(crate) fn new(sh: Arc<Shared>, spin: Duration) -> Receiver {
        Receiver { sh, head: 0, spin: SpinHistory::new(spin), poisoned: None }
    }

    /// Receives the next frame into `buf` (cleared first) and returns its tag, waiting until
    /// `deadline` (spinning while the wait policy allows, then sleeping on the futex). Frames
    /// published before the peer closed or died are received before [`RingError::Closed`] or
    /// [`RingError::PeerGone`].
    pub fn recv(&mut self, buf: &mut Vec<u8>, deadline: Instant) -> Result<u32, RingError> {
        self.guard(|rx| {
            let (sh, head) = (&*rx.sh, &mut rx.head);
            let mut tag = None;
            let mut ready = || -> Result<bool, RingError> {
                tag = take(sh, head, buf)?;
                if tag.is_none() && sh.closed_bits(&sh.rx) & PRODUCER_CLOSED != 0 {
                    // Closed after its last publish: look once more, then report the close.
                    tag = take(sh, head, buf)?;
                    if tag.is_none() {
                        return Err(RingError::Closed);
                    }
                }
                Ok(tag.is_some())
            };
            if !ready()? {
                sh.check_state()?;
                sh.wait_until(sh.rx.consumer_sleeping, &mut rx.spin, deadline, false, ready)?;
            }
            Ok(tag.unwrap_or_default())
        })
    }

    /// Receives a frame if one is there, without waiting: `Ok(None)` when the ring is empty.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> Result<Option<u32>, RingError> {
        self.guard(|rx| {
            let tag = take(&rx.sh, &mut rx.head, buf)?;
            if tag.is_none() {
                rx.sh.check_state()?;
                if rx.sh.closed_bits(&rx.sh.rx) & PRODUCER_CLOSED != 0 {
                    return take(&rx.sh, &mut rx.head, buf)?.map(Some).ok_or(RingError::Closed);
                }
            }
            Ok(tag)
        })
    }

    /// Arms the doorbell before an async consumer waits somewhere else (its socket): stores
    /// the doorbell mark (`DOORBELL`) in this ring's sleeping word, then looks once more.
    /// Returns `Ok(true)` when armed (nothing to read: the next [`Sender::try_send_parts`] reports
    /// `doorbell: true` to the producer, which must then wake this side), `Ok(false)` when a
    /// record, a close or a death notice is already there (not armed: read it). Call
    /// [`Receiver::disarm`] after waking for any reason.
    pub fn arm_doorbell(&mut self) -> Result<bool, RingError> {
        self.guard(|rx| {
            let sh = &*rx.sh;
            let word = sh.map.u32_at(sh.rx.consumer_sleeping).expect("futex words are in bounds and aligned");
            word.store(DOORBELL, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let tail = sh.u64(sh.rx.tail).load(Ordering::Acquire);
            let closed = sh.closed_bits(&sh.rx) & PRODUCER_CLOSED != 0;
            if tail != rx.head || closed || sh.check_state().is_err() {
                word.store(0, Ordering::SeqCst);
                return Ok(false);
            }
            Ok(true)
        })
    }

    /// The tag of the next record, without taking it; `None` when none is published (or
    /// its header is not where a record's can be: [`Receiver::try_recv`] then says why).
    pub fn next_tag(&self) -> Option<u32> {
        let sh = &*self.sh;
        let ring = sh.rx;
        let tail = sh.u64(ring.tail).load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.head);
        if avail == 0 || avail > ring.capacity as u64 || !avail.is_multiple_of(8) {
            return None;
        }
        let at = (self.head % ring.capacity as u64) as usize;
        Some((sh.u64(ring.data + at).load(Ordering::Relaxed) >> 32) as u32)
    }

    /// Whether a record (or a close) is waiting, without taking it (for a caller that
    /// polls before it sleeps).
    pub fn has_data(&self) -> bool {
        let sh = &*self.sh;
        sh.u64(sh.rx.tail).load(Ordering::Acquire) != self.head || sh.closed_bits(&sh.rx) & PRODUCER_CLOSED != 0
    }

    /// Waits on this thread for a record (or a close) until `deadline`: spins for the
    /// window the wait policy allows, then sleeps on the futex, where the producer's next publish wakes it
    /// directly (no doorbell: one wake-up, not a socket's two). It also ends when the
    /// producer nudges it ([`Sender::nudger`]: bytes are coming on the socket beside the
    /// ring). It does not notice a dead peer by itself (a futex cannot): wait in slices and
    /// look at the socket between them, or give the ring a [`PeerNotice`].
    pub fn wait_for_data(&mut self, deadline: Instant) -> Result<WaitEnd, RingError> {
        self.wait_data(deadline, true, || false)
    }

    /// [`Receiver::wait_for_data`] without the spin: sleeps on the futex at once. For a
    /// caller that spun already by a policy of its own (ferry's pipe: `ferry_core::spin`),
    /// polling [`Receiver::has_data`].
    pub fn sleep_for_data(&mut self, deadline: Instant) -> Result<WaitEnd, RingError> {
        self.wait_data(deadline, false, || false)
    }

    /// [`Receiver::sleep_for_data`], ended with [`WaitEnd::Nudged`] also when `elsewhere`
    /// says there is something to read elsewhere (the socket). It is asked after this side
    /// says it sleeps and before it sleeps, so something the producer put there before a
    /// [`Nudge`] that found this side awake (and so woke nobody) is never slept through.
    pub fn sleep_for_data_unless(
        &mut self,
        deadline: Instant,
        elsewhere: impl FnMut() -> bool,
    ) -> Result<WaitEnd, RingError> {
        self.wait_data(deadline, false, elsewhere)
    }

    /// Polls for a record until `end` (a spin that finds the peer on its CPU moves to
    /// another CPU, or stops); true when one came. For
    /// a caller with a wait policy of its own (ferry's pipe), before
    /// [`Receiver::sleep_for_data`]. Looks at the clock every 32 polls only.
    pub fn spin_for_data(&mut self, end: Instant) -> bool {
        let mut polls = 0u32;
        loop {
            if self.has_data() {
                self.sh.ended_wait(self.sh.rx.consumer_sleeping);
                return true;
            }
            std::hint::spin_loop();
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(32) {
                if Instant::now() >= end {
                    return false;
                }
                if !self.sh.spin_on(self.sh.rx.consumer_sleeping) {
                    return false;
                }
            }
        }
    }

    /// Says where this consumer runs (its `consumer_cpu` word, PROTOCOL.md §22.1) after a read
    /// that found a record without waiting: a caller whose answers are always there when it
    /// looks never ends a wait, and would never say it (its peer then spun, on the CPU this
    /// caller needed, for its whole window every round trip: measured in Python, 64 µs
    /// round trips for whole runs of a fresh pair that started on one CPU).
    pub fn note_cpu(&self) {
        self.sh.ended_wait(self.sh.rx.consumer_sleeping);
    }

    /// The longest a wait of this half spins ([`crate::RingOptions::spin`]).
    pub fn spin_max(&self) -> Duration {
        self.spin.window()
    }

    fn wait_data(
        &mut self,
        deadline: Instant,
        spin: bool,
        mut elsewhere: impl FnMut() -> bool,
    ) -> Result<WaitEnd, RingError> {
        self.guard(|rx| {
            if rx.has_data() {
                return Ok(WaitEnd::Data);
            }
            let (sh, head) = (&*rx.sh, rx.head);
            let here =
                || sh.u64(sh.rx.tail).load(Ordering::Acquire) != head || sh.closed_bits(&sh.rx) & PRODUCER_CLOSED != 0;
            let ready = || Ok(here() || elsewhere());
            let mut none = SpinHistory::new(Duration::ZERO);
            let history = if spin { &mut rx.spin } else { &mut none };
            match sh.wait_until(sh.rx.consumer_sleeping, history, deadline, true, ready) {
                Ok(true) if here() => Ok(WaitEnd::Data),
                Ok(_) => Ok(WaitEnd::Nudged),
                Err(RingError::Timeout) => Ok(WaitEnd::Deadline),
                Err(e) => Err(e),
            }
        })
    }

    /// Takes the doorbell down again (after a wake-up, or when the wait was abandoned).
    pub fn disarm(&mut self) {
        if let Some(word) = self.sh.map.u32_at(self.sh.rx.consumer_sleeping) {
            word.store(0, Ordering::SeqCst);
        }
    }

    fn guard<T>(&mut self, f: impl FnOnce(&mut Receiver) -> Result<T, RingError>) -> Result<T, RingError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let r = f(self);
        if let Err(e @ RingError::Corrupt(_)) = &r {
            self.poisoned = Some(e.clone());
        }
        r
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let ring = self.sh.rx;
        self.sh.close_ring(&ring, CONSUMER_CLOSED, ring.producer_sleeping);
    }
}

/// Takes the next record of the incoming ring into `buf`, if one is published. Checks, in
/// order: the producer's `tail` is ahead of `head` by at most the capacity and by a
/// multiple of 8; the record's length is at most the largest frame and its record lies
/// within the published bytes. Each shared word is read once.
fn take(sh: &Shared, head: &mut u64, buf: &mut Vec<u8>) -> Result<Option<u32>, RingError> {
    let ring = sh.rx;
    let cap = ring.capacity;
    let tail = sh.u64(ring.tail).load(Ordering::Acquire);
    let avail = tail.wrapping_sub(*head);
    if avail == 0 {
        return Ok(None);
    }
    if avail > cap as u64 || !avail.is_multiple_of(8) {
        return Err(sh.corrupt(format!(
            "the producer's tail index {tail} is not within {cap} bytes ahead of the head {head}, or misaligned"
        )));
    }
    let at = (*head % cap as u64) as usize;
    let header = sh.u64(ring.data + at).load(Ordering::Relaxed);
    let len = (header & 0xffff_ffff) as usize;
    let tag = (header >> 32) as u32;
    let max = layout::max_frame(cap);
    if len > max || layout::record_len(len) as u64 > avail {
        return Err(sh.corrupt(format!("a frame claims {len} bytes but {avail} are published (largest frame {max})")));
    }
    buf.clear();
    buf.resize(len, 0);
    let start = (at + layout::RECORD_HEADER) % cap;
    let first = len.min(cap - start);
    let ok = sh.map.read(ring.data + start, &mut buf[..first]).and_then(|()| sh.map.read(ring.data, &mut buf[first..]));
    if ok.is_none() {
        return Err(sh.corrupt("a frame outside the data area".into()));
    }
    *head += layout::record_len(len) as u64;
    sh.u64(ring.head).store(*head, Ordering::Release);
    fence(Ordering::SeqCst);
    sh.wake(ring.producer_sleeping);
    Ok(Some(tag))
}

#[cfg(test)]
mod tests;
