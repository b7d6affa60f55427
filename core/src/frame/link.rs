//! The seam between the frame layer and a link beside the byte stream (a same-host ring,
//! PROTOCOL.md §22): what such a link can do, asked through defaulted capability queries,
//! as quinn asks `quinn-udp` for GSO and GRO. Core names no link: `ferry-ring` implements
//! these traits and plugs in through [`LinkProvider`] (`EndpointBuilder::link`). Without a
//! link, or where a link says "not here", the frame layer takes the byte stream.
//!
//! The contract a link keeps:
//!
//! - **One order.** Frames and packed records reach the reader in the order the writer
//!   wrote them, whichever way each travelled (a frame the link cannot carry goes on the
//!   byte stream, and the link keeps its place).
//! - **Checked like the socket.** Every frame read through the link is checked against the
//!   same limits ([`SocketReader::limits`], [`super::FramePrefix::check`]); what a peer
//!   wrote into shared memory is never trusted, and a bad byte is a [`PipeError`], never a
//!   panic.
//! - **Writes are counted.** A write the link finished whole counts
//!   ([`SocketWriter::count_write`]), so that a dropped send is settled as on the socket; a
//!   write cut part-way marks the stream torn ([`SocketWriter::set_torn`]).
//! - **The socket's end is the end.** A reader with nothing in the link reads the byte
//!   stream for its end (and for frames the link points to).

use super::WaitSpin;
use super::{Frame, FrameKind, FramePrefix, FrameReader, FrameWriter, OutFrame, Received, SocketReader, SocketWriter};
use crate::error::PipeError;

/// The reading half of a link ([`FrameReader::attach_link`]).
#[async_trait::async_trait]
pub trait LinkRead: Send + 'static {
    /// Whether packed message records may come this way (PROTOCOL.md §22.5; both sides
    /// agreed to [`crate::wire::FEATURE_RING_MESSAGES`]).
    fn carries_packed(&self) -> bool {
        false
    }

    /// Whether a blocking reader (`Pipe::recv_blocking`, on its own thread) waits on the
    /// link itself, woken by the writer directly: [`LinkRead::wait_readable`] then keeps a
    /// [`WaitSpin::Blocking`] deadline itself, and [`LinkRead::packed_now`] may read.
    fn wakes_blocking_reader(&self) -> bool {
        false
    }

    /// The next frame (or packed record) in the writer's order.
    async fn read(&mut self, sock: &mut SocketReader) -> Result<Received, PipeError>;

    /// Waits until something can be read, or the stream ended or failed: as
    /// `FrameReader::wait_readable`, cancel-safe. False: the deadline of
    /// [`WaitSpin::Blocking`] passed first.
    async fn wait_readable(&mut self, sock: &mut SocketReader, spin: WaitSpin) -> Result<bool, PipeError>;

    /// The blocking caller's fast path: waits on the link for one slice and, when the next
    /// record is a packed message, hands its bytes to `unpack` on this thread (CONTROL
    /// frames met on the way go to `control`). `None`: the next thing to read is something
    /// else (kept for [`LinkRead::read`]), or the slice ended, or the link cannot.
    fn packed_now(
        &mut self,
        sock: &mut SocketReader,
        deadline: Option<std::time::Instant>,
        control: &mut dyn FnMut(Frame) -> Result<(), PipeError>,
        unpack: &mut dyn FnMut(&[u8]) -> Result<(), PipeError>,
    ) -> Option<Result<(), PipeError>> {
        let _ = (sock, deadline, control, unpack);
        None
    }

    /// The CONTROL frames at the head of the link's order, handed to `control` now, with
    /// no wait; anything else stays for the ordinary reads. Default: nothing (a link whose
    /// CONTROL frames the reader meets in order anyway).
    fn controls_now(
        &mut self,
        sock: &mut SocketReader,
        control: &mut dyn FnMut(Frame) -> Result<(), PipeError>,
    ) -> Result<(), PipeError> {
        let _ = (sock, control);
        Ok(())
    }
}

/// The writing half of a link ([`FrameWriter::attach_link`]).
#[async_trait::async_trait]
pub trait LinkWrite: Send + 'static {
    /// Whether frames go through [`LinkWrite::write_frames`] (else on the byte stream).
    fn carries_frames(&self) -> bool {
        false
    }

    /// The largest packed message record the link carries (`None`: it carries none).
    fn max_packed_record(&self) -> Option<usize> {
        None
    }

    /// Writes a frame (`prefix`, `frame`'s header and payload; its descriptors are attached
    /// to the stream already) and `trailing` header-only frames behind it, in order.
    async fn write_frames(
        &mut self,
        sock: &mut SocketWriter,
        prefix: FramePrefix,
        frame: &OutFrame,
        trailing: &[(FrameKind, &[u8])],
    ) -> Result<(), PipeError> {
        sock.write_parts(prefix, frame, trailing).await
    }

    /// Writes a packed message record, waiting for room; counts as one write once out.
    async fn write_packed(&mut self, sock: &mut SocketWriter, record: &[u8]) -> Result<(), PipeError> {
        let _ = (sock, record);
        Err(PipeError::ApiMisuse("a packed message on a link that carries none".into()))
    }

    /// Publishes a packed message record now, if it can without waiting: `Some(doorbell)`
    /// when published (`doorbell`: [`LinkWrite::pay_doorbell`] must run now), `None` when
    /// nothing was written.
    fn try_write_packed_now(&mut self, sock: &mut SocketWriter, record: &[u8]) -> Option<bool> {
        let _ = (sock, record);
        None
    }

    /// [`LinkWrite::try_write_packed_now`] with CONTROL frames (their headers) right
    /// behind the record, made visible to the peer together with it: `Some(doorbell)`
    /// when both went out, `None` when nothing was written (the link cannot, or not now).
    fn try_write_packed_with_controls_now(
        &mut self,
        sock: &mut SocketWriter,
        record: &[u8],
        controls: &[Vec<u8>],
    ) -> Option<bool> {
        let _ = (sock, record, controls);
        None
    }

    /// Writes what the peer is owed to wake up (a doorbell), if anything.
    async fn pay_doorbell(&mut self, sock: &mut SocketWriter) -> Result<(), PipeError> {
        let _ = sock;
        Ok(())
    }

    /// Something that ends the link's waits from outside when this side closes the pipe
    /// (a write waiting for room on a plain thread, where no close signal reaches it).
    fn closer(&self) -> Option<Box<dyn Fn() + Send + Sync>> {
        None
    }
}

/// Both halves of a link, ready to attach.
pub struct Link {
    /// The reading half.
    pub read: Box<dyn LinkRead>,
    /// The writing half.
    pub write: Box<dyn LinkWrite>,
}

/// Makes and opens links in the handshake (PROTOCOL.md §22): the server makes one and
/// sends its descriptor with the WELCOME; the client opens it. Core speaks the handshake
/// (features, WELCOME fields, the RING answer); the provider supplies the memory.
/// `ferry-ring`'s provider is set with `EndpointBuilder::link` (or its `RingExt::ring`).
#[cfg(unix)]
pub trait LinkProvider: Send + Sync + 'static {
    /// Server: makes a link for a client that offered one (`packed`: packed records
    /// agreed). Its capacity (for the WELCOME), the link, and the descriptor to send.
    fn create(&self, packed: bool) -> Result<(u64, Link, std::os::fd::OwnedFd), String>;

    /// Client: opens the link the server described (`capacity`) and sent (`fd`).
    fn open(&self, fd: std::os::fd::OwnedFd, capacity: u64, packed: bool) -> Result<Link, String>;
}

impl FrameReader {
    /// The blocking caller's fast path (`Pipe::recv_blocking`, PROTOCOL.md §22.5): on a
    /// link that wakes a blocking reader, with nothing else pending, waits on it for one
    /// slice and, when the next record is a packed message, hands its bytes to `unpack` on
    /// this thread (CONTROL frames met on the way go to `control`, also on this thread).
    /// `None`: no such link, or the next thing to read is something else (kept for
    /// [`FrameReader::read_frame`] and [`FrameReader::wait_readable`]), or the slice ended.
    pub(crate) fn packed_now<T>(
        &mut self,
        deadline: Option<std::time::Instant>,
        mut control: impl FnMut(Frame) -> Result<(), PipeError>,
        unpack: impl FnOnce(&[u8]) -> Result<T, PipeError>,
    ) -> Option<Result<T, PipeError>> {
        let link = self.link.as_mut().filter(|l| l.wakes_blocking_reader())?;
        let mut unpack = Some(unpack);
        let mut got = None;
        let mut take = |record: &[u8]| {
            let f = unpack.take().ok_or_else(|| PipeError::ApiMisuse("packed_now unpacked twice".into()))?;
            got = Some(f(record)?);
            Ok(())
        };
        match link.packed_now(&mut self.sock, deadline, &mut control, &mut take)? {
            Ok(()) => got.map(Ok),
            Err(e) => Some(Err(e)),
        }
    }
}

impl FrameReader {
    /// [`LinkRead::controls_now`] of this reader's link (nothing without one): the CONTROL
    /// frames already waiting at the head, such as the peer's releases of leases, handled
    /// now by a blocking caller that is about to send rather than read.
    pub(crate) fn controls_now(
        &mut self,
        mut control: impl FnMut(Frame) -> Result<(), PipeError>,
    ) -> Result<(), PipeError> {
        match self.link.as_mut() {
            Some(link) => link.controls_now(&mut self.sock, &mut control),
            None => Ok(()),
        }
    }
}

/// Ends a link's waits from outside its halves, when this side closes the pipe: a write
/// waiting for room in a ring its peer stopped reading (on a plain thread, where no close
/// signal reaches its future) fails at once with [`PipeError::Closed`]. Without a link it
/// does nothing.
#[derive(Default)]
pub(crate) struct RingCloser {
    close: Option<Box<dyn Fn() + Send + Sync>>,
}

impl RingCloser {
    /// Fails every wait of the link, now and later (nothing is written to the peer).
    pub(crate) fn close(&self) {
        if let Some(c) = &self.close {
            c();
        }
    }
}

impl FrameWriter {
    /// A [`RingCloser`] for this writer's link (one that does nothing without a link).
    pub(crate) fn ring_closer(&self) -> RingCloser {
        RingCloser { close: self.link.as_ref().and_then(|l| l.closer()) }
    }

    /// The largest packed record the link takes (`None`: no link that carries them).
    pub(crate) fn ring_max_record(&self) -> Option<usize> {
        self.link.as_ref().and_then(|l| l.max_packed_record())
    }

    /// Writes a packed message (PROTOCOL.md §22.5; `crate::pipe::packed`) as one link
    /// record. It counts as one write ([`FrameWriter::writes_done`]) once published.
    pub(crate) async fn write_packed(&mut self, record: &[u8]) -> Result<(), PipeError> {
        match &mut self.link {
            Some(link) => link.write_packed(&mut self.sock, record).await,
            None => Err(PipeError::ApiMisuse("a packed message on a pipe without a ring".into())),
        }
    }

    /// Publishes a packed message record now, if it can without waiting: `Some(doorbell)`
    /// when published (`doorbell`: the peer waits for one, and
    /// [`FrameWriter::pay_ring_doorbell`] must write it now), `None` when nothing was written
    /// (no link, the ring is full or broken, or a doorbell is owed from before).
    pub(crate) fn try_write_packed_now(&mut self, record: &[u8]) -> Option<bool> {
        self.link.as_mut()?.try_write_packed_now(&mut self.sock, record)
    }

    /// [`FrameWriter::try_write_packed_now`] with CONTROL frames made visible together
    /// with the record ([`LinkWrite::try_write_packed_with_controls_now`]).
    pub(crate) fn try_write_packed_with_controls_now(&mut self, record: &[u8], controls: &[Vec<u8>]) -> Option<bool> {
        self.link.as_mut()?.try_write_packed_with_controls_now(&mut self.sock, record, controls)
    }

    /// Writes the doorbell the link's peer is owed, if any.
    pub(crate) async fn pay_ring_doorbell(&mut self) -> Result<(), PipeError> {
        match &mut self.link {
            Some(link) => link.pay_doorbell(&mut self.sock).await,
            None => Ok(()),
        }
    }
}
