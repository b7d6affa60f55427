//! What the pipe asks of the same-host ring (feature `ring`, Linux; PROTOCOL.md §22.5),
//! in methods that exist with or without it: without a ring they say "not here", and the
//! pipe takes its ordinary path.

use super::{Frame, FrameReader, FrameWriter};
use crate::error::PipeError;

impl FrameReader {
    /// The blocking caller's fast path (`Pipe::recv_blocking`, PROTOCOL.md §22.5): on a
    /// same-host ring with nothing else pending, waits on the ring for one slice and, when
    /// the next record is a packed message, hands its bytes to `unpack` on this thread
    /// (CONTROL frames met on the way go to `control`, also on this thread).
    /// `None`: no ring, or the next thing to read is something else (kept for
    /// [`FrameReader::read_frame`] and [`FrameReader::wait_readable`]), or the slice ended.
    pub(crate) fn packed_now<T>(
        &mut self,
        deadline: Option<std::time::Instant>,
        control: impl FnMut(Frame) -> Result<(), PipeError>,
        unpack: impl FnOnce(&[u8]) -> Result<T, PipeError>,
    ) -> Option<Result<T, PipeError>> {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        return self.ring_packed_now(deadline, control, unpack);
        #[cfg(not(all(feature = "ring", target_os = "linux")))]
        {
            let _ = (deadline, control, unpack);
            None
        }
    }
}

/// Ends a same-host ring's waits from outside its halves, when this side closes the pipe:
/// a write waiting for room in a ring its peer stopped reading (on a plain thread, where no
/// close signal reaches its future) fails at once with [`PipeError::Closed`]. Without a
/// ring it does nothing.
#[derive(Default)]
pub(crate) struct RingCloser {
    #[cfg(all(feature = "ring", target_os = "linux"))]
    notice: Option<ferry_ring::PeerNotice>,
}

impl RingCloser {
    /// Fails every wait of the ring, now and later (nothing is written to the peer).
    pub(crate) fn close(&self) {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        if let Some(n) = &self.notice {
            n.close_here();
        }
    }
}

impl FrameWriter {
    /// A [`RingCloser`] for this writer's ring (one that does nothing without a ring).
    pub(crate) fn ring_closer(&self) -> RingCloser {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        return RingCloser { notice: self.ring_notice() };
        #[cfg(not(all(feature = "ring", target_os = "linux")))]
        RingCloser::default()
    }

    /// The largest record the same-host ring takes (`None`: no ring).
    pub(crate) fn ring_max_record(&self) -> Option<usize> {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        return self.ring.as_ref().map(|r| r.max_record());
        #[cfg(not(all(feature = "ring", target_os = "linux")))]
        None
    }

    /// Writes a packed message (PROTOCOL.md §22.5; `crate::pipe::packed`) as one ring
    /// record. It counts as one write ([`FrameWriter::writes_done`]) once published.
    pub(crate) async fn write_packed(&mut self, record: &[u8]) -> Result<(), PipeError> {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        if self.ring.is_some() {
            return self.write_ring_packed(record).await;
        }
        let _ = record;
        Err(PipeError::ApiMisuse("a packed message on a pipe without a ring".into()))
    }

    /// Publishes a packed message record now, if it can without waiting: `Some(doorbell)`
    /// when published (`doorbell`: the peer waits for one, and
    /// [`FrameWriter::pay_ring_doorbell`] must write it now), `None` when nothing was written
    /// (no ring, the ring is full or broken, or a doorbell is owed from before).
    pub(crate) fn try_write_packed_now(&mut self, record: &[u8]) -> Option<bool> {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        return self.try_ring_packed_now(record);
        #[cfg(not(all(feature = "ring", target_os = "linux")))]
        {
            let _ = record;
            None
        }
    }

    /// Writes the doorbell the ring's peer is owed, if any.
    pub(crate) async fn pay_ring_doorbell(&mut self) -> Result<(), PipeError> {
        #[cfg(all(feature = "ring", target_os = "linux"))]
        return self.pay_doorbell().await;
        #[cfg(not(all(feature = "ring", target_os = "linux")))]
        Ok(())
    }
}
