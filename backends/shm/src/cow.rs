//! [`CowBuf`]: bytes their owner writes in place and lends as copy-on-write views, so that
//! foreign code writing into a view (torch has no read-only tensors) changes its own pages
//! and never the owner's bytes (a weights subscriber's verified copy, `ferry.weights`).

use std::io;
use std::sync::Arc;

use bytes::Bytes;

use crate::sys::{ExclusiveRange, OwnSegment, PeerSegment};

/// A buffer in a sealed memfd: written in place by its owner (`&mut`, so never while a
/// view of it lives when it is shared as `Arc<CowBuf>`: [`Arc::get_mut`] says so), and lent
/// as views ([`CowBuf::view`]) that map it privately. A write through a view copies the
/// pages it touches into that view's mapping: the buffer, and every other view, keep their
/// bytes.
#[derive(Debug)]
pub struct CowBuf {
    range: ExclusiveRange,
}

impl CowBuf {
    /// A buffer holding a copy of `src` (`src` not empty).
    pub fn copy_from(src: &[u8]) -> io::Result<CowBuf> {
        let seg = OwnSegment::create(src.len())?;
        let mut range =
            seg.claim(0, src.len()).ok_or_else(|| io::Error::other("a new segment could not be claimed"))?;
        range.as_mut_slice().copy_from_slice(src);
        Ok(CowBuf { range })
    }

    /// Length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when empty (never: creation refuses empty buffers).
    pub fn is_empty(&self) -> bool {
        self.range.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.range.as_slice()
    }

    /// The bytes, to write in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.range.as_mut_slice()
    }

    /// A view of the bytes as they are now, in a private (copy-on-write) mapping of the
    /// buffer's memfd: no copy is made, and what foreign code writes through the view's
    /// address stays in that view. The view keeps the buffer alive (an `Arc` clone), which
    /// is what keeps its owner from writing in place while it lives.
    pub fn view(self: &Arc<Self>) -> io::Result<Bytes> {
        let map = PeerSegment::open(self.range.dup_fd()?, self.len() as u64).map_err(|e| match e {
            crate::sys::PeerSegmentError::Io(e) => e,
            other => io::Error::other(format!("{other:?}")),
        })?;
        Ok(Bytes::from_owner(CowView { map, _buf: self.clone() }))
    }
}

/// A private mapping of a [`CowBuf`], keeping the buffer.
struct CowView {
    map: PeerSegment,
    _buf: Arc<CowBuf>,
}

impl AsRef<[u8]> for CowView {
    fn as_ref(&self) -> &[u8] {
        self.map.slice(0, self.map.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pointer of a view's bytes, to write through as foreign code (torch) would.
    fn write_through(view: &Bytes, at: usize, byte: u8) {
        let p = view.as_ptr() as usize + at;
        // A foreign write into a private mapping is simulated with the file's own API:
        // /proc/self/mem writes into this process's memory like any store would.
        use std::io::{Seek, SeekFrom, Write};
        let mut mem = std::fs::OpenOptions::new().write(true).open("/proc/self/mem").unwrap();
        mem.seek(SeekFrom::Start(p as u64)).unwrap();
        mem.write_all(&[byte]).unwrap();
    }

    #[test]
    fn a_write_through_a_view_stays_in_that_view() {
        let buf = Arc::new(CowBuf::copy_from(&[7u8; 10_000]).unwrap());
        let a = buf.view().unwrap();
        let b = buf.view().unwrap();
        assert_ne!(a.as_ptr(), buf.as_slice().as_ptr(), "a view is its own mapping");
        write_through(&a, 5_000, 1);
        assert_eq!(a[5_000], 1, "the writer sees its write");
        assert_eq!(buf.as_slice()[5_000], 7, "the buffer keeps its bytes");
        assert_eq!(b[5_000], 7, "another view keeps its bytes");
        assert_eq!(buf.view().unwrap()[5_000], 7, "a later view shows the buffer");
    }

    #[test]
    fn the_owner_writes_in_place_only_without_views() {
        let mut buf = Arc::new(CowBuf::copy_from(&[1u8; 4096]).unwrap());
        let v = buf.view().unwrap();
        assert!(Arc::get_mut(&mut buf).is_none(), "a live view keeps the owner from writing");
        drop(v);
        Arc::get_mut(&mut buf).unwrap().as_mut_slice()[0] = 9;
        assert_eq!(buf.view().unwrap()[0], 9);
    }

    #[test]
    fn empty_buffers_are_refused() {
        assert!(CowBuf::copy_from(&[]).is_err());
    }
}
