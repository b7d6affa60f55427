//! Where everything lives in a ring file. Offsets are this crate's constants; the only
//! number that comes from outside is the capacity, which the opener is told (in the
//! handshake) and checks against the file's sealed size. Nothing here is ever read back
//! from the shared memory to decide a layout.
//!
//! ```text
//! 0     header: magic u64, version u32, zero u32, capacity u64       (written by the creator)
//! 1024  control block of ring 0 (creator -> opener)
//! 2048  control block of ring 1 (opener -> creator)
//! 4096  data of ring 0 (capacity bytes)
//! 4096 + capacity   data of ring 1 (capacity bytes)
//! ```
//!
//! A control block, one word per 128 bytes (so no two words share a cache line or an
//! adjacent-line prefetch pair: the producer's `tail` store never invalidates the line the
//! consumer's `head` is on, and the sleeping words, read after every publish, change only
//! when a side goes to sleep or is woken):
//!
//! ```text
//! +0    tail: u64, bytes ever published (producer)
//! +128  head: u64, bytes ever consumed (consumer)
//! +256  consumer_sleeping: u32 futex word (consumer sets 1 before sleeping on an empty ring)
//! +384  producer_sleeping: u32 futex word (producer sets 1 before sleeping on a full ring)
//! +512  closed: u32, PRODUCER_CLOSED | CONSUMER_CLOSED (orderly close, either side)
//! +640  consumer_cpu: u32, the CPU the consumer ran on when its last wait ended (or it
//!       last found a record without waiting), plus one (0: not said). Advice only: the
//!       producer, waiting on the other ring for the
//!       consumer's answer, stops spinning on the CPU the consumer needs to run on.
//! ```
//!
//! A record in the data area is an 8-byte header (`len: u32` in the low half, `tag: u32`
//! in the high half of one little-endian `u64`), then `len` payload bytes, padded to a
//! multiple of 8. Records start at multiples of 8 and the capacity is a multiple of 8, so a
//! header never straddles the end of the data area; a payload may (it is copied in two
//! pieces).

/// "FERRYRNG" in little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FERRYRNG");
/// The layout's version; a file of another version is refused.
pub const VERSION: u32 = 1;
/// Header offsets.
pub const MAGIC_AT: usize = 0;
/// Offset of the version word.
pub const VERSION_AT: usize = 8;
/// Offset of the capacity word.
pub const CAPACITY_AT: usize = 16;
/// Bytes before the first data area (one page).
pub const HEADER_LEN: usize = 4096;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 8;
/// Smallest capacity of one ring.
pub const MIN_CAPACITY: usize = 4096;
/// Largest capacity of one ring (1 GiB).
pub const MAX_CAPACITY: usize = 1 << 30;

/// `closed` bit: the producer will publish nothing more.
pub const PRODUCER_CLOSED: u32 = 1;
/// `closed` bit: the consumer will read nothing more.
pub const CONSUMER_CLOSED: u32 = 2;

/// Offsets of one ring's words and data.
#[derive(Debug, Clone, Copy)]
pub struct RingLayout {
    /// `tail` word.
    pub tail: usize,
    /// `producer_sleeping` futex word.
    pub producer_sleeping: usize,
    /// `head` word.
    pub head: usize,
    /// `consumer_sleeping` futex word.
    pub consumer_sleeping: usize,
    /// `closed` word.
    pub closed: usize,
    /// `consumer_cpu` word (advice: any value is harmless).
    pub consumer_cpu: usize,
    /// First byte of the data area.
    pub data: usize,
    /// Bytes in the data area (a power of two).
    pub capacity: usize,
}

impl RingLayout {
    /// Ring `index` (0: creator -> opener, 1: opener -> creator) of a file whose rings hold
    /// `capacity` bytes each.
    pub fn new(index: usize, capacity: usize) -> RingLayout {
        let ctrl = 1024 * (index + 1);
        RingLayout {
            tail: ctrl,
            head: ctrl + 128,
            consumer_sleeping: ctrl + 256,
            producer_sleeping: ctrl + 384,
            closed: ctrl + 512,
            consumer_cpu: ctrl + 640,
            data: HEADER_LEN + index * capacity,
            capacity,
        }
    }
}

/// The file length for rings of `capacity` bytes, or why that capacity is refused.
pub fn file_len(capacity: usize) -> Result<usize, String> {
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(format!("ring capacity {capacity} is not a power of two in {MIN_CAPACITY}..={MAX_CAPACITY}"));
    }
    Ok(HEADER_LEN + 2 * capacity)
}

/// Bytes a record with a payload of `len` bytes takes in the ring.
pub fn record_len(len: usize) -> usize {
    RECORD_HEADER + len.next_multiple_of(8)
}

/// The largest payload a ring of `capacity` bytes carries in one record.
pub fn max_frame(capacity: usize) -> usize {
    capacity - RECORD_HEADER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_disjoint_and_in_bounds() {
        let cap = 8192;
        let len = file_len(cap).unwrap();
        let (a, b) = (RingLayout::new(0, cap), RingLayout::new(1, cap));
        let mut words = vec![MAGIC_AT, VERSION_AT, CAPACITY_AT];
        for l in [a, b] {
            words.extend([l.tail, l.producer_sleeping, l.head, l.consumer_sleeping, l.closed, l.consumer_cpu]);
            assert!(l.consumer_cpu + 4 <= l.tail + 1024 && l.consumer_cpu + 4 <= HEADER_LEN, "in its control block");
        }
        let mut sorted = words.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), words.len(), "two words share an offset");
        assert_eq!(a.data + cap, b.data);
        assert_eq!(b.data + cap, len);
        assert!(file_len(4095).is_err() && file_len(6000).is_err() && file_len(1 << 31).is_err());
        assert_eq!(record_len(0), 8);
        assert_eq!(record_len(1), 16);
        assert_eq!(record_len(max_frame(cap)), cap);
    }
}
