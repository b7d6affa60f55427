//! The writing half of a pipe's ring (see the parent module): one record per write, the
//! socket and divert records for what the ring cannot carry, the doorbell, and a full
//! ring's wait, which gives up when the peer is gone or this side closed.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::{Duration, Instant};

use ferry_core::PipeError;
use ferry_core::frame::{COALESCE, FrameKind, FramePrefix, LinkWrite, OutFrame, PREFIX_LEN, SocketWriter};

use super::{TAG_DIVERT, TAG_FRAMES, TAG_MESSAGE, ring_error};
use crate::{Pushed, Sender};
use ferry_core::spin::{self, Spin, SpinHistory};

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
    /// Packed message records were agreed.
    packed: bool,
}

impl RingWrite {
    /// The writing half of a ring the handshake agreed on; `packed`: packed message
    /// records were agreed (`FEATURE_RING_MESSAGES`).
    pub(crate) fn new(tx: Sender, packed: bool) -> RingWrite {
        RingWrite { tx, scratch: Vec::new(), doorbell_owed: false, packed }
    }
}

#[async_trait::async_trait]
impl LinkWrite for RingWrite {
    fn carries_frames(&self) -> bool {
        true
    }

    fn max_packed_record(&self) -> Option<usize> {
        self.packed.then(|| self.tx.max_frame())
    }

    async fn write_frames(
        &mut self,
        s: &mut SocketWriter,
        prefix: FramePrefix,
        frame: &OutFrame,
        trailing: &[(FrameKind, &[u8])],
    ) -> Result<(), PipeError> {
        self.write_ring_parts(s, prefix, frame, trailing).await
    }

    async fn write_packed(&mut self, s: &mut SocketWriter, record: &[u8]) -> Result<(), PipeError> {
        self.write_ring_packed(s, record).await
    }

    fn try_write_packed_now(&mut self, s: &mut SocketWriter, record: &[u8]) -> Option<bool> {
        self.try_ring_packed_now(s, record)
    }

    fn try_write_packed_with_controls_now(
        &mut self,
        s: &mut SocketWriter,
        record: &[u8],
        controls: &[Vec<u8>],
    ) -> Option<bool> {
        self.try_ring_packed_with_controls_now(s, record, controls)
    }

    async fn pay_doorbell(&mut self, s: &mut SocketWriter) -> Result<(), PipeError> {
        self.pay_doorbell(s).await
    }

    fn closer(&self) -> Option<Box<dyn Fn() + Send + Sync>> {
        let notice = self.tx.notice();
        Some(Box::new(move || notice.close_here()))
    }
}

impl RingWrite {
    /// `SocketWriter::write_parts` with a ring: one record when the frames fit and carry
    /// no descriptors, else the socket and divert records.
    async fn write_ring_parts(
        &mut self,
        s: &mut SocketWriter,
        prefix: FramePrefix,
        frame: &OutFrame,
        trailing: &[(FrameKind, &[u8])],
    ) -> Result<(), PipeError> {
        self.pay_doorbell(s).await?;
        let ring = &mut *self;
        let trailing_len: usize = trailing.iter().map(|(_, h)| PREFIX_LEN + h.len()).sum();
        let len = (PREFIX_LEN + frame.header.len()) as u64 + prefix.payload_len + trailing_len as u64;
        if prefix.fds != 0 || len > ring.tx.max_frame() as u64 {
            // The socket carries the frames; a divert record per frame keeps their place.
            // The diverts go out as soon as the frames' first byte is on the socket (a cut
            // from then on tears the stream), so that a reader sleeping on the ring's
            // futex starts reading the socket at once and has the frame at its last byte,
            // not when this side next runs (on a busy machine, a scheduler's time slice
            // later). A doorbell they find armed is paid behind the frames: the reader may
            // have read them from the socket already and be waiting for their diverts.
            let diverts = 1 + trailing.len();
            // (Atomics only because the write's future must be `Send`: one thread uses them.)
            let published = AtomicUsize::new(0);
            let rang = AtomicBool::new(false);
            let nudge = ring.tx.nudger();
            {
                let tx = &mut ring.tx;
                let mut started = || {
                    while published.load(Relaxed) < diverts {
                        match tx.try_send_parts(TAG_DIVERT, &[]) {
                            Ok(Pushed::Sent { doorbell }) => {
                                published.fetch_add(1, Relaxed);
                                rang.fetch_or(doorbell, Relaxed);
                            }
                            // A full (or broken) ring: the rest go out behind the frames.
                            Ok(Pushed::Full) | Err(_) => break,
                        }
                    }
                };
                let mut write = std::pin::pin!(s.write_parts_started(prefix, frame, trailing, Some(&mut started)));
                let mut first = true;
                std::future::poll_fn(|cx| {
                    let r = write.as_mut().poll(cx);
                    // A full ring kept a divert back, and the socket cannot take the frames
                    // at once: nudge a reader sleeping on the futex to read them meanwhile.
                    if std::mem::take(&mut first) && r.is_pending() && published.load(Relaxed) < diverts {
                        nudge.nudge();
                    }
                    r
                })
                .await?;
            }
            self.doorbell_owed |= rang.into_inner();
            // Until the last divert is published the stream is torn: a cut here would
            // leave frames on the socket that the ring never points to.
            s.set_torn(true);
            for _ in published.into_inner()..diverts {
                self.push(s, TAG_DIVERT, None).await?;
            }
            s.set_torn(false);
            return self.pay_doorbell(s).await;
        }
        let mut record = std::mem::take(&mut ring.scratch);
        record.clear();
        record.extend_from_slice(&prefix.encode());
        record.extend_from_slice(&frame.header);
        let small = record.len() + prefix.payload_len as usize <= COALESCE;
        if small {
            for p in &frame.payload {
                record.extend_from_slice(p);
            }
        }
        append_headers(&mut record, trailing.iter().copied())?;
        let r = if small {
            self.push(s, TAG_FRAMES, Some(&[&record])).await
        } else {
            // Large payload parts go in without a copy into a scratch buffer first.
            let split = PREFIX_LEN + frame.header.len();
            let mut parts: Vec<&[u8]> = Vec::with_capacity(frame.payload.len() + 2);
            parts.push(&record[..split]);
            parts.extend(frame.payload.iter().map(|p| &p[..]));
            parts.push(&record[split..]);
            self.push(s, TAG_FRAMES, Some(&parts)).await
        };
        self.scratch = record;
        r?;
        // Published: the frames are the peer's now, whatever happens to the doorbell.
        s.count_write();
        self.pay_doorbell(s).await
    }

    /// `FrameWriter::write_packed` with a ring.
    async fn write_ring_packed(&mut self, s: &mut SocketWriter, record: &[u8]) -> Result<(), PipeError> {
        self.pay_doorbell(s).await?;
        self.push(s, TAG_MESSAGE, Some(&[record])).await?;
        s.count_write();
        self.pay_doorbell(s).await
    }

    /// Publishes a packed message record now, if it can without waiting: `Some(doorbell)`
    /// when published (`doorbell`: the peer waits for one, [`RingWrite::pay_doorbell`]
    /// must write it now), `None` when nothing was written (the ring is full or broken, or
    /// a doorbell is owed from before).
    fn try_ring_packed_now(&mut self, s: &mut SocketWriter, record: &[u8]) -> Option<bool> {
        if self.doorbell_owed {
            return None;
        }
        let r = self.tx.try_send_parts(TAG_MESSAGE, &[record]);
        self.published_now(s, r)
    }

    /// [`RingWrite::try_ring_packed_now`] with a frames record of CONTROL frames behind the
    /// message record, both published at once (`Sender::try_send_records`).
    fn try_ring_packed_with_controls_now(
        &mut self,
        s: &mut SocketWriter,
        record: &[u8],
        controls: &[Vec<u8>],
    ) -> Option<bool> {
        if self.doorbell_owed || controls.is_empty() {
            return None;
        }
        let mut frames = std::mem::take(&mut self.scratch);
        frames.clear();
        let r = append_headers(&mut frames, controls.iter().map(|h| (FrameKind::Control, &h[..])))
            .ok()
            .map(|()| self.tx.try_send_records(&[(TAG_MESSAGE, &[record]), (TAG_FRAMES, &[&frames])]));
        self.scratch = frames;
        self.published_now(s, r?)
    }

    /// What [`RingWrite::try_ring_packed_now`] says of a try to publish without waiting
    /// (no doorbell was owed before it).
    fn published_now(&mut self, s: &mut SocketWriter, r: Result<Pushed, crate::RingError>) -> Option<bool> {
        match r {
            Ok(Pushed::Sent { doorbell }) => {
                self.doorbell_owed = doorbell;
                s.count_write();
                Some(doorbell)
            }
            Ok(Pushed::Full) | Err(_) => None,
        }
    }

    /// Publishes one record, waiting while the ring is full. When the peer waits for its
    /// doorbell, a doorbell is owed ([`RingWrite::pay_doorbell`]).
    ///
    /// A full ring waits for the peer to read. While it waits (yielding for as long as the
    /// wait policy allows, then sleeping [`FULL_SLEEP`] between tries) it asks the transport
    /// whether the peer is still there (`ferry_core::PeerLiveness`): a dead peer never reads
    /// again, so the write fails with [`PipeError::PeerGone`] within a sleep of the death,
    /// whoever else reads the socket. A local close ([`crate::PeerNotice::close_here`]) ends
    /// the wait too.
    async fn push(&mut self, s: &mut SocketWriter, tag: u32, parts: Option<&[&[u8]]>) -> Result<(), PipeError> {
        let mut yielding: Option<(Instant, Duration)> = None;
        loop {
            let ring = &mut *self;
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
                        if s.liveness().is_some_and(|l| l.peer_gone()) {
                            return Err(PipeError::PeerGone);
                        }
                        tokio::time::sleep(FULL_SLEEP).await;
                    }
                }
            }
        }
    }

    /// Writes the doorbell the peer is owed, if any. A write dropped before its doorbell
    /// went out leaves it owed, and the next write pays it first; one dropped part-way
    /// through it tears the stream (the pipe closes).
    async fn pay_doorbell(&mut self, s: &mut SocketWriter) -> Result<(), PipeError> {
        if self.doorbell_owed {
            ring_doorbell(s).await?;
            self.doorbell_owed = false;
        }
        Ok(())
    }
}

/// Writes a RING frame (the doorbell) to the socket.
async fn ring_doorbell(s: &mut SocketWriter) -> Result<(), PipeError> {
    let p = FramePrefix { kind: FrameKind::Ring as u8, flags: 0, fds: 0, header_len: 0, payload_len: 0 };
    s.write_bytes(&p.encode()).await
}

/// Appends frames without a payload (a kind and a header each: CONTROL frames behind a
/// message) to a frames record.
fn append_headers<'a>(
    record: &mut Vec<u8>,
    frames: impl Iterator<Item = (FrameKind, &'a [u8])>,
) -> Result<(), PipeError> {
    for (kind, header) in frames {
        let header_len =
            u32::try_from(header.len()).map_err(|_| PipeError::ApiMisuse("frame header over 4 GiB".into()))?;
        let p = FramePrefix { kind: kind as u8, flags: 0, fds: 0, header_len, payload_len: 0 };
        record.extend_from_slice(&p.encode());
        record.extend_from_slice(header);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use ferry_core::frame::{FrameKind, FramePrefix, FrameWriter, OutFrame, PREFIX_LEN};
    use tokio::io::AsyncReadExt;

    use super::{RingWrite, TAG_DIVERT};
    use crate::{Ring, RingOptions};

    const LONG: Duration = Duration::from_secs(30);

    /// A frame writer with a ring of 4 KiB over one end of a socket pair; the other end's
    /// socket and ring receiver.
    fn setup() -> (FrameWriter, tokio::net::UnixStream, crate::Receiver) {
        let opts = RingOptions::default().capacity(4096);
        let (creator, fd) = Ring::create(&opts).unwrap();
        let opener = Ring::open(fd, creator.capacity(), &opts).unwrap();
        let (tx, _) = creator.into_split();
        let (_, rx) = opener.into_split();
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let mut w = FrameWriter::new(Box::new(a), None);
        w.attach_link(Box::new(RingWrite::new(tx, false)));
        (w, b, rx)
    }

    /// A frame with a 2-byte header and `n` bytes of 7s, too large for the ring.
    fn big(n: usize) -> OutFrame {
        OutFrame { header: b"{}".to_vec(), payload: vec![Bytes::from(vec![7u8; n])], ..Default::default() }
    }

    /// The divert record is in the ring while the frame is still being written (a reader
    /// asleep on the ring reads the socket at once), not only after its last byte.
    #[tokio::test]
    async fn a_diverted_frame_is_pointed_to_while_it_is_written() {
        let (mut w, mut far, mut rx) = setup();
        // Far more than a socket pair buffers: the write waits for the reader.
        let n = 16 << 20;
        let mut write = std::pin::pin!(w.write_frame(FrameKind::Message, big(n)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(write.as_mut().poll(&mut cx).is_pending(), "nothing reads the socket yet");
        assert!(rx.has_data(), "the divert is published once the frame's first byte is out");
        let mut record = Vec::new();
        assert_eq!(rx.try_recv(&mut record).unwrap(), Some(TAG_DIVERT));
        // The reader takes the frame from the socket while it is written.
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; PREFIX_LEN + 2 + n];
            far.read_exact(&mut got).await.unwrap();
            assert!(got[PREFIX_LEN + 2..].iter().all(|&b| b == 7));
        });
        tokio::time::timeout(LONG, write).await.expect("the write ends").unwrap();
        tokio::time::timeout(LONG, reader).await.expect("the frame is read").unwrap();
        assert!(!rx.has_data(), "one divert for one frame");
    }

    /// A reader that took the frame off the socket before its divert was published, and
    /// then armed its doorbell to wait for the divert, gets the doorbell behind the frame.
    #[tokio::test]
    async fn a_doorbell_armed_before_an_early_divert_is_rung_behind_the_frame() {
        let (mut w, mut far, mut rx) = setup();
        assert!(rx.arm_doorbell().unwrap());
        let n = 8 << 10;
        tokio::time::timeout(LONG, w.write_frame(FrameKind::Message, big(n)))
            .await
            .expect("the socket takes 8 KiB at once")
            .unwrap();
        rx.disarm();
        let mut got = vec![0u8; PREFIX_LEN + 2 + n + PREFIX_LEN];
        tokio::time::timeout(LONG, far.read_exact(&mut got)).await.expect("the frame and a doorbell").unwrap();
        let bell = FramePrefix::decode(got[got.len() - PREFIX_LEN..].try_into().unwrap());
        assert_eq!((bell.kind, bell.header_len, bell.payload_len), (FrameKind::Ring as u8, 0, 0));
        let mut record = Vec::new();
        assert_eq!(rx.try_recv(&mut record).unwrap(), Some(TAG_DIVERT));
    }
}
