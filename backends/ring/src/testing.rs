//! Writes a hostile (or dying) peer would make to the shared words. Test-only, behind the
//! `__testing` feature: not part of the API.

use std::sync::atomic::Ordering;

use crate::Ring;

impl Ring {
    fn word(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        self.tx.sh.map.u64_at(offset).expect("in bounds")
    }
}

/// Stores `value` as the `tail` of the ring this side produces into (a lying producer).
pub fn set_tail(ring: &Ring, value: u64) {
    ring.word(ring.tx.sh.tx.tail).store(value, Ordering::Release);
}

/// The published `tail` of the ring this side produces into.
pub fn tail(ring: &Ring) -> u64 {
    ring.word(ring.tx.sh.tx.tail).load(Ordering::Acquire)
}

/// Stores `value` as the `head` of the ring this side consumes (a lying consumer).
pub fn set_head(ring: &Ring, value: u64) {
    ring.word(ring.tx.sh.rx.head).store(value, Ordering::Release);
}

/// Writes a record header claiming `len` bytes with `tag` at the current tail, then
/// publishes `advance` bytes (a producer lying about a frame's length).
pub fn publish_header(ring: &Ring, len: u32, tag: u32, advance: u64) {
    let l = ring.tx.sh.tx;
    let t = tail(ring);
    let at = l.data + (t % l.capacity as u64) as usize;
    ring.word(at).store(u64::from(len) | (u64::from(tag) << 32), Ordering::Relaxed);
    set_tail(ring, t + advance);
}

/// Writes `bytes` where the next record would go, without publishing them (a producer that
/// dies in the middle of a write).
pub fn write_unpublished(ring: &Ring, bytes: &[u8]) {
    let l = ring.tx.sh.tx;
    let at = l.data + (tail(ring) % l.capacity as u64) as usize;
    let n = bytes.len().min(l.capacity - (at - l.data));
    let _ = ring.tx.sh.map.write(at, &bytes[..n]);
}

/// A memfd without seals (which [`Ring::open`] must refuse).
pub fn unsealed_memfd(len: u64) -> std::io::Result<std::os::fd::OwnedFd> {
    crate::sys::unsealed_memfd(len)
}

/// A sealed memfd of `len` zero bytes: the right seals and size, but no ring header.
pub fn sealed_memfd(len: usize) -> std::io::Result<std::os::fd::OwnedFd> {
    crate::sys::SharedMap::create(len).map(|(_map, fd)| fd)
}

/// Stores `value` at byte `offset` of the ring file (8-aligned; ignored when out of bounds):
/// a peer scribbling over the shared memory.
pub fn scribble(ring: &Ring, offset: usize, value: u64) {
    if let Some(w) = ring.tx.sh.map.u64_at(offset) {
        w.store(value, Ordering::Relaxed);
    }
}

/// Bytes in the ring file.
pub fn file_len(ring: &Ring) -> usize {
    crate::layout::HEADER_LEN + 2 * ring.tx.sh.tx.capacity
}
