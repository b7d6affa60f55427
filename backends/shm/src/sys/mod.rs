//! The only unsafe code of ferry-shm: sealed memfd segments and their mappings, behind safe
//! wrappers.
//!
//! - [`OwnSegment`]: a memfd this process creates, sized once, sealed against shrinking and
//!   growing, mapped read-write. Its bytes are reached only through claims
//!   ([`ExclusiveRange`], then [`SharedRange`]); a registry makes sure claims never overlap.
//! - [`PeerSegment`]: a memfd received from a peer, checked (seals, size) and mapped
//!   private (copy-on-write): nothing this process writes reaches the peer, and a write by
//!   foreign code (a torch tensor over a received tensor) copies a page instead of faulting.
//!   Because the peer cannot shrink it, reading any byte below its size can never fault (no
//!   SIGBUS).
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
// Segments and claims are never empty (creation refuses zero lengths), so no `is_empty`.
#![allow(clippy::len_without_is_empty)]

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};

/// Seals every segment must carry: its size can never change.
pub const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// A segment of this process's pool. Writable ranges are handed out as claims
/// ([`OwnSegment::claim`]); a byte is never in two claims at once, which is what makes the
/// writable slices sound.
#[derive(Debug)]
pub struct OwnSegment {
    fd: OwnedFd,
    map: MmapRaw,
    len: usize,
    /// Claimed ranges: start -> end.
    claims: Mutex<BTreeMap<usize, usize>>,
}

impl OwnSegment {
    /// Creates a sealed memfd of `len` bytes (name `ferry-shm`, visible only in
    /// /proc/PID/fd and /proc/PID/maps, never in a filesystem) and maps it read-write.
    pub fn create(len: usize) -> io::Result<Arc<Self>> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty segment"));
        }
        let fd = rustix::fs::memfd_create("ferry-shm", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS)?;
        let map = MmapOptions::new().len(len).map_raw(&fd)?;
        Ok(Arc::new(OwnSegment { fd, map, len, claims: Mutex::new(BTreeMap::new()) }))
    }

    /// A duplicate of the descriptor, to send to a peer.
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Claims `len > 0` bytes at `offset` for exclusive writing. `None` when the range is
    /// outside the segment or overlaps a live claim.
    pub fn claim(self: &Arc<Self>, offset: usize, len: usize) -> Option<ExclusiveRange> {
        let end = offset.checked_add(len)?;
        if len == 0 || end > self.len {
            return None;
        }
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, &prev_end)) = claims.range(..=offset).next_back()
            && prev_end > offset
        {
            return None;
        }
        if let Some((&next_start, _)) = claims.range(offset..).next()
            && next_start < end
        {
            return None;
        }
        claims.insert(offset, end);
        Some(ExclusiveRange(Claim { seg: self.clone(), offset, len }))
    }
}

/// A claimed range; unclaimed on drop.
#[derive(Debug)]
struct Claim {
    seg: Arc<OwnSegment>,
    offset: usize,
    len: usize,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.seg.claims.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.offset);
    }
}

/// A range of an [`OwnSegment`] that only its owner can touch.
#[derive(Debug)]
pub struct ExclusiveRange(Claim);

impl ExclusiveRange {
    /// Offset in the segment.
    pub fn offset(&self) -> usize {
        self.0.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// The bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the range is inside the live read-write mapping (checked by `claim`) of a
        // memfd sealed against shrinking, and the claim registry guarantees no other claim,
        // hence no other slice made by this module, overlaps it while `self` lives.
        unsafe { std::slice::from_raw_parts_mut(self.0.seg.map.as_mut_ptr().add(self.0.offset), self.0.len) }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; `&self` forbids a simultaneous `&mut` from it.
        unsafe { std::slice::from_raw_parts(self.0.seg.map.as_ptr().add(self.0.offset), self.0.len) }
    }

    /// A duplicate of its segment's descriptor (to map the segment again, privately:
    /// [`PeerSegment::open`]).
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.0.seg.dup_fd()
    }

    /// Ends writing: the range becomes read-only and shareable, still claimed.
    pub fn freeze(self) -> SharedRange {
        SharedRange(self.0)
    }
}

/// A claimed, read-only range of an [`OwnSegment`] (a filled tensor, possibly leased).
#[derive(Debug)]
pub struct SharedRange(Claim);

impl SharedRange {
    /// Offset in the segment.
    pub fn offset(&self) -> usize {
        self.0.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// The segment it is in.
    pub fn segment(&self) -> &Arc<OwnSegment> {
        &self.0.seg
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: inside the live mapping (checked by `claim`); the claim is held, so no
        // writable slice of these bytes can exist (a frozen claim is never writable again).
        unsafe { std::slice::from_raw_parts(self.0.seg.map.as_ptr().add(self.0.offset), self.0.len) }
    }
}

/// A segment received from a peer, mapped private (copy-on-write): this process reads the
/// peer's pages, and foreign code that writes into a received tensor (torch has no
/// read-only tensors) gets private copies of the pages it writes, never the peer's memory
/// and never a fault.
#[derive(Debug)]
pub struct PeerSegment {
    map: MmapMut,
    len: usize,
}

/// Why a received segment was refused.
#[derive(Debug)]
pub enum PeerSegmentError {
    /// The descriptor is not a memfd with the required seals.
    NotSealed(String),
    /// Its real size is not the announced one.
    WrongSize {
        /// Announced.
        announced: u64,
        /// Real.
        actual: u64,
    },
    /// A system call failed.
    Io(io::Error),
}

impl PeerSegment {
    /// Checks `fd` (seals, size `len`) and maps it private, without reserving swap (only pages
    /// written, by foreign code, take memory of this process).
    pub fn open(fd: OwnedFd, len: u64) -> Result<Self, PeerSegmentError> {
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| PeerSegmentError::NotSealed(format!("cannot read seals ({e}); not a memfd?")))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(PeerSegmentError::NotSealed(format!("seals are {seals:?}; SHRINK and GROW are required")));
        }
        let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| PeerSegmentError::Io(e.into()))?;
        let actual = st.st_size as u64;
        if actual != len || len == 0 {
            return Err(PeerSegmentError::WrongSize { announced: len, actual });
        }
        let ulen = usize::try_from(len).map_err(|_| PeerSegmentError::WrongSize { announced: len, actual })?;
        // SAFETY: a private mapping: what the peer writes to the memfd may show through
        // (its lease rules say it must not, and bytes it changes can only change the values
        // read, see `slice`), and nothing written here reaches the memfd. The sealed size
        // keeps every byte below `len` mapped.
        let map =
            unsafe { MmapOptions::new().len(ulen).no_reserve_swap().map_copy(&fd) }.map_err(PeerSegmentError::Io)?;
        // The mapping keeps the memory; the descriptor is not needed any more.
        drop(fd);
        peer_maps().insert(map.as_ptr() as usize, ulen);
        Ok(PeerSegment { map, len: ulen })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.map.as_ptr() as usize
    }

    /// Reads `len` bytes at `offset`; `None` when the range is outside the segment.
    pub fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above) of a live mapping (`self.map` lives as long as the
        // returned borrow) of a memfd whose size is sealed, so no access can fault. This
        // process never writes it through Rust (no `&mut` is ever made of it); foreign code
        // writing a received tensor gets private pages (see `PeerSegment`).
        // What this does NOT give: a `&[u8]` whose bytes stay put. The peer owns the memfd
        // and can still write any page this process has not copied, at any time, also while
        // the slice is read (the lease protocol says it must not, but nothing enforces it).
        // Such writes are outside Rust's model of a shared borrow; we accept them because
        // `u8` has no invalid values and no check of this crate (or of core) ever reads from
        // peer memory: ranges, sizes and leases are decided from the descriptor's numbers and
        // the sealed size alone, so a peer's writes can change the values a reader sees
        // (two reads may differ) but never what is in bounds. `Tensor`'s docs say the same
        // to applications.
        Some(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset), len) })
    }
}

impl Drop for PeerSegment {
    fn drop(&mut self) {
        // Before the mapping goes (fields drop after this): `discard_private_pages` holds the
        // registry while it advises, so it never touches an unmapped range.
        peer_maps().remove(&(self.map.as_ptr() as usize));
    }
}

/// The live [`PeerSegment`] mappings of this process: address -> length.
fn peer_maps() -> std::sync::MutexGuard<'static, BTreeMap<usize, usize>> {
    static MAPS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    MAPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops this process's private copies of the pages holding `[addr, addr + len)` when
/// that range lies in a received segment, so that they show the peer's memory again: pages
/// written by foreign code (a torch tensor over a received tensor) became private copies,
/// and would otherwise go on hiding what the peer later puts there. Whole pages are
/// dropped (a tensor of a ferry sender never shares a page: sends of 4 KiB and more are
/// page-aligned, smaller ones travel inline). Returns whether the range was in a received
/// segment (otherwise nothing is done).
pub fn discard_private_pages(addr: usize, len: usize) -> bool {
    let maps = peer_maps();
    let Some((&start, &seg_len)) = maps.range(..=addr).next_back() else { return false };
    let Some(end) = addr.checked_add(len) else { return false };
    if len == 0 || end > start + seg_len {
        return false;
    }
    let page = rustix::param::page_size();
    let lo = addr - (addr - start) % page;
    let hi = (start + (end - start).next_multiple_of(page)).min(start + seg_len);
    // SAFETY: `[lo, hi)` lies inside a live private mapping of a memfd (the registry lock is
    // held, and a segment leaves the registry before it is unmapped). MADV_DONTNEED on a
    // private file mapping only drops this process's copies of written pages; the next read
    // maps the file's (the peer's) pages again, so no reference into the range dangles.
    let r = unsafe { rustix::mm::madvise(lo as *mut std::ffi::c_void, hi - lo, rustix::mm::Advice::LinuxDontNeed) };
    r.is_ok()
}

/// A memfd of `len` bytes without seals (for tests of the refusal path).
#[cfg(any(test, feature = "__testing"))]
pub fn unsealed_memfd(len: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("ferry-shm-unsealed", MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_and_peer_views_agree() {
        let s = OwnSegment::create(1 << 16).unwrap();
        let mut w = s.claim(100, 4).unwrap();
        w.as_mut_slice().copy_from_slice(b"abcd");
        assert!(s.claim(102, 10).is_none(), "overlapping claim");
        assert!(s.claim(90, 11).is_none(), "overlapping claim");
        assert!(s.claim((1 << 16) - 1, 2).is_none(), "outside");
        let other = s.claim(104, 4).unwrap();
        let r = w.freeze();
        assert_eq!(r.as_slice(), b"abcd");
        let p = PeerSegment::open(s.dup_fd().unwrap(), 1 << 16).unwrap();
        assert_eq!(p.slice(100, 4).unwrap(), b"abcd");
        assert!(p.slice(1 << 16, 1).is_none());
        assert!(p.slice(usize::MAX, 2).is_none());
        drop(r);
        assert!(s.claim(100, 4).is_some(), "released claim can be taken again");
        drop(other);
    }

    #[test]
    fn foreign_writes_stay_private_until_discarded() {
        let len = 1 << 16;
        let s = OwnSegment::create(len).unwrap();
        let mut w = s.claim(4096, 8192).unwrap();
        w.as_mut_slice().fill(1);
        let p = PeerSegment::open(s.dup_fd().unwrap(), len as u64).unwrap();
        let at = p.addr() + 4096 + 10;
        // SAFETY: a test standing in for foreign code (torch) writing into a received
        // tensor: in bounds of the live private mapping, and no slice of it is alive.
        unsafe { (at as *mut u8).write(7) };
        assert_eq!(w.as_slice()[10], 1, "a write of the receiver reached the sender");
        assert_eq!(p.slice(4096 + 10, 1).unwrap(), [7]);
        w.as_mut_slice().fill(2); // the sender reuses the memory
        assert_eq!(p.slice(4096 + 10, 1).unwrap(), [7], "the written page is private");
        assert_eq!(p.slice(4096 + 4096, 1).unwrap(), [2], "an unwritten page shows the sender's");
        assert!(discard_private_pages(at, 100));
        assert_eq!(p.slice(4096 + 10, 1).unwrap(), [2], "the discarded page shows the sender's again");
        let heap = [5u8; 100];
        assert!(!discard_private_pages(heap.as_ptr() as usize, heap.len()), "not a received segment");
        assert!(!discard_private_pages(p.addr(), len + 1), "past the segment");
        let addr = p.addr();
        drop(p);
        assert!(!discard_private_pages(addr, 10), "an unmapped segment");
        assert_eq!(heap[0], 5);
    }

    #[test]
    fn refuses_unsealed_and_lying_sizes() {
        let fd = unsealed_memfd(4096).unwrap();
        assert!(matches!(PeerSegment::open(fd, 4096), Err(PeerSegmentError::NotSealed(_))));
        let s = OwnSegment::create(4096).unwrap();
        assert!(matches!(PeerSegment::open(s.dup_fd().unwrap(), 8192), Err(PeerSegmentError::WrongSize { .. })));
        // A sealed segment cannot be shrunk under a reader.
        assert!(rustix::fs::ftruncate(s.dup_fd().unwrap(), 10).is_err());
    }
}
