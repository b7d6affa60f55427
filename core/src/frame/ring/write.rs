//! The writing half of a pipe's ring (see the parent module): one record per write, the
//! socket and divert records for what the ring cannot carry, the doorbell, and a full
//! ring's wait, which gives up when the peer is gone or this side closed.

use std::time::{Duration, Instant};

use ferry_ring::{Pushed, Sender};

use super::super::{FrameKind, FramePrefix, FrameWriter, OutFrame, PREFIX_LEN, put};
use super::{TAG_DIVERT, TAG_FRAMES, TAG_MESSAGE, ring_error};
use crate::error::PipeError;
use crate::spin::{self, Spin, SpinHistory};

/// How long a writer facing a full ring may yield between tries (the wait policy's
/// window, [`spin::decide_alone`]) before it sleeps between them.
const YIELD_WHEN_FULL: Duration = Duration::from_micros(100);
/// The writer's sleep between tries of a ring that stays full.
const FULL_SLEEP: Duration = Duration::from_micros(200);

/// The writing half of a pipe's ring.
pub(crate) struct RingWrite {
    tx: Sender,
    scratch: Vec<u8>,
    /// A record went out while the peer waited for its doorbell, and the doorbell has not
    /// been written yet.
    doorbell_owed: bool,
}

impl RingWrite {
    /// The largest record the ring takes.
    pub(in crate::frame) fn max_record(&self) -> usize {
        self.tx.max_frame()
    }
}

impl FrameWriter {
    /// Writes through the ring from now on (after the handshake agreed on one).
    pub(crate) fn attach_ring(&mut self, tx: Sender) {
        self.ring = Some(RingWrite { tx, scratch: Vec::new(), doorbell_owed: false });
    }

    /// [`FrameWriter::write_parts`] with a ring: one record when the frames fit and carry
    /// no descriptors, else the socket and divert records.
    pub(in crate::frame) async fn write_ring_parts(
        &mut self,
        prefix: FramePrefix,
        frame: &OutFrame,
        trailing: &[(FrameKind, &[u8])],
    ) -> Result<(), PipeError> {
        self.pay_doorbell().await?;
        let ring = self.ring.as_mut().expect("write_ring_parts is called with a ring");
        let trailing_len: usize = trailing.iter().map(|(_, h)| PREFIX_LEN + h.len()).sum();
        let len = (PREFIX_LEN + frame.header.len()) as u64 + prefix.payload_len + trailing_len as u64;
        if prefix.fds != 0 || len > ring.tx.max_frame() as u64 {
            // The socket carries the frames; a divert record per frame keeps their place.
            // Until the last divert is published the stream is torn: a cut here would
            // leave frames on the socket that the ring never points to.
            // A blocking reader sleeping on the ring's futex would see nothing until the
            // divert record, which comes after the whole frame: when the socket cannot take
            // the frame at once, nudge it to read the socket meanwhile.
            let nudge = ring.tx.nudger();
            {
                let mut write = std::pin::pin!(self.write_parts(prefix, frame, trailing));
                let mut first = true;
                std::future::poll_fn(|cx| {
                    let r = write.as_mut().poll(cx);
                    if std::mem::take(&mut first) && r.is_pending() {
                        nudge.nudge();
                    }
                    r
                })
                .await?;
            }
            self.torn = true;
            for _ in 0..=trailing.len() {
                self.push(TAG_DIVERT, None).await?;
            }
            self.torn = false;
            return self.pay_doorbell().await;
        }
        let mut record = std::mem::take(&mut ring.scratch);
        record.clear();
        record.extend_from_slice(&prefix.encode());
        record.extend_from_slice(&frame.header);
        let small = record.len() + prefix.payload_len as usize <= super::super::COALESCE;
        if small {
            for p in &frame.payload {
                record.extend_from_slice(p);
            }
        }
        for (kind, header) in trailing {
            let header_len =
                u32::try_from(header.len()).map_err(|_| PipeError::ApiMisuse("frame header over 4 GiB".into()))?;
            let p = FramePrefix { kind: *kind as u8, flags: 0, fds: 0, header_len, payload_len: 0 };
            record.extend_from_slice(&p.encode());
            record.extend_from_slice(header);
        }
        let r = if small {
            self.push(TAG_FRAMES, Some(&[&record])).await
        } else {
            // Large payload parts go in without a copy into a scratch buffer first.
            let split = PREFIX_LEN + frame.header.len();
            let mut parts: Vec<&[u8]> = Vec::with_capacity(frame.payload.len() + 2);
            parts.push(&record[..split]);
            parts.extend(frame.payload.iter().map(|p| &p[..]));
            parts.push(&record[split..]);
            self.push(TAG_FRAMES, Some(&parts)).await
        };
        if let Some(ring) = self.ring.as_mut() {
            ring.scratch = record;
        }
        r?;
        // Published: the frames are the peer's now, whatever happens to the doorbell.
        self.done += 1;
        self.pay_doorbell().await
    }

    /// [`FrameWriter::write_packed`] with a ring.
    pub(in crate::frame) async fn write_ring_packed(&mut self, record: &[u8]) -> Result<(), PipeError> {
        self.pay_doorbell().await?;
        self.push(TAG_MESSAGE, Some(&[record])).await?;
        self.done += 1;
        self.pay_doorbell().await
    }

    /// Publishes a packed message record now, if it can without waiting: `Some(doorbell)`
    /// when published (`doorbell`: the peer waits for one, [`FrameWriter::pay_doorbell`]
    /// must write it now), `None` when nothing was written (the ring is full or broken, or
    /// a doorbell is owed from before).
    pub(in crate::frame) fn try_ring_packed_now(&mut self, record: &[u8]) -> Option<bool> {
        let ring = self.ring.as_mut().filter(|r| !r.doorbell_owed)?;
        match ring.tx.try_send_parts(TAG_MESSAGE, &[record]) {
            Ok(Pushed::Sent { doorbell }) => {
                ring.doorbell_owed = doorbell;
                self.done += 1;
                Some(doorbell)
            }
            Ok(Pushed::Full) | Err(_) => None,
        }
    }

    /// Publishes one record, waiting while the ring is full. When the peer waits for its
    /// doorbell, a doorbell is owed ([`FrameWriter::pay_doorbell`]).
    ///
    /// A full ring waits for the peer to read. While it waits (yielding for as long as the
    /// wait policy allows, then sleeping [`FULL_SLEEP`] between tries) it asks the transport whether the peer is still there
    /// ([`crate::PeerLiveness`]): a dead peer never reads again, so the write fails with
    /// [`PipeError::PeerGone`] within a sleep of the death, whoever else reads the socket.
    /// A local close ([`ferry_ring::PeerNotice::close_here`]) ends the wait too.
    async fn push(&mut self, tag: u32, parts: Option<&[&[u8]]>) -> Result<(), PipeError> {
        let mut yielding: Option<(Instant, Duration)> = None;
        loop {
            let ring = self.ring.as_mut().expect("still attached");
            match ring.tx.try_send_parts(tag, parts.unwrap_or(&[])).map_err(ring_error)? {
                Pushed::Sent { doorbell } => {
                    ring.doorbell_owed |= doorbell;
                    return Ok(());
                }
                Pushed::Full => {
                    let now = Instant::now();
                    let (since, window) = *yielding.get_or_insert_with(|| {
                        let spin = spin::decide_alone(YIELD_WHEN_FULL, &SpinHistory::new(YIELD_WHEN_FULL), now);
                        (now, if let Spin::Poll(d) = spin { d } else { Duration::ZERO })
                    });
                    if now.duration_since(since) < window {
                        tokio::task::yield_now().await;
                    } else {
                        if self.liveness.as_ref().is_some_and(|l| l.peer_gone()) {
                            return Err(PipeError::PeerGone);
                        }
                        tokio::time::sleep(FULL_SLEEP).await;
                    }
                }
            }
        }
    }

    /// A handle that ends this ring's waits from outside (`super::RingCloser`).
    pub(in crate::frame) fn ring_notice(&self) -> Option<ferry_ring::PeerNotice> {
        self.ring.as_ref().map(|r| r.tx.notice())
    }

    /// Writes the doorbell the peer is owed, if any. A write dropped before its doorbell
    /// went out leaves it owed, and the next write pays it first; one dropped part-way
    /// through it tears the stream (the pipe closes).
    pub(in crate::frame) async fn pay_doorbell(&mut self) -> Result<(), PipeError> {
        if self.ring.as_ref().is_some_and(|r| r.doorbell_owed) {
            self.ring_doorbell().await?;
            if let Some(r) = self.ring.as_mut() {
                r.doorbell_owed = false;
            }
        }
        Ok(())
    }

    /// Writes a RING frame (the doorbell) to the socket.
    async fn ring_doorbell(&mut self) -> Result<(), PipeError> {
        let p = FramePrefix { kind: FrameKind::Ring as u8, flags: 0, fds: 0, header_len: 0, payload_len: 0 };
        let was = self.torn;
        put(&mut self.inner, &mut self.torn, &p.encode()).await?;
        self.torn = was;
        tokio::io::AsyncWriteExt::flush(&mut self.inner).await?;
        Ok(())
    }
}
