//! The receive buffer of one tensor stream: [`ALIGN`]-aligned, its address space reserved
//! for the announced length up front (so the bytes are never copied again), but memory
//! committed only as bytes arrive. A peer that announces 4 GiB and sends 100 bytes costs
//! about a page, not 4 GiB (issue 14: no memory ahead of the bytes).

use ferry_core::ALIGN;

/// An aligned buffer filled by appending, never past the length it was made for.
pub(crate) struct RecvBuf {
    /// `pad` bytes of alignment, then the data; its capacity covers `pad + len`.
    v: Vec<u8>,
    pad: usize,
    len: usize,
}

impl RecvBuf {
    /// Reserves (does not commit) room for `len` bytes; `None` when the address space
    /// cannot be had.
    pub(crate) fn reserve(len: usize) -> Option<RecvBuf> {
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(len.checked_add(ALIGN - 1)?).ok()?;
        let pad = v.as_ptr().align_offset(ALIGN).min(ALIGN - 1);
        v.resize(pad, 0);
        Some(RecvBuf { v, pad, len })
    }

    /// The length it was made for.
    pub(crate) fn capacity(&self) -> usize {
        self.len
    }

    /// Bytes appended so far.
    pub(crate) fn filled(&self) -> usize {
        self.v.len() - self.pad
    }

    /// Empties it for reuse (its memory stays committed: a warm buffer costs no page faults).
    pub(crate) fn clear(&mut self) {
        self.v.truncate(self.pad);
    }

    /// Appends `b`; `false` (and nothing appended) when that would pass the length it was
    /// made for.
    pub(crate) fn push(&mut self, b: &[u8]) -> bool {
        if b.len() > self.len - self.filled() {
            return false;
        }
        // Within the reserved capacity: no reallocation, so the data never moves.
        self.v.extend_from_slice(b);
        true
    }
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        &self.v[self.pad..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_bounded_and_reusable() {
        let mut b = RecvBuf::reserve(100).unwrap();
        assert_eq!((b.capacity(), b.filled()), (100, 0));
        assert!(b.push(&[1; 60]));
        assert!(!b.push(&[2; 41]), "past the announced length");
        assert!(b.push(&[3; 40]));
        assert_eq!(b.filled(), 100);
        assert_eq!(b.as_ref().as_ptr() as usize % ALIGN, 0);
        assert_eq!(&b.as_ref()[58..62], &[1, 1, 3, 3]);
        let at = b.as_ref().as_ptr();
        b.clear();
        assert!(b.push(&[4; 100]));
        assert_eq!(b.as_ref().as_ptr(), at, "reused in place");
        assert!(RecvBuf::reserve(usize::MAX).is_none());
    }

    #[test]
    fn a_huge_reservation_commits_nothing_until_written() {
        // 64 GiB of address space is fine on a 64-bit machine with overcommit; it is never touched.
        if let Some(mut b) = RecvBuf::reserve(64 << 30) {
            assert!(b.push(b"just a few bytes"));
            assert_eq!(&b.as_ref()[..4], b"just");
        }
    }
}
