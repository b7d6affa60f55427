//! The only unsafe code of ferry-ring, and its calls into the system: the shared mapping of
//! a ring file and the accesses to it, behind safe wrappers; the futex; where this thread
//! runs (`sched_getcpu`, and a move to another CPU).
//!
//! - [`SharedMap`]: a sealed memfd mapped shared and read-write, created here
//!   ([`SharedMap::create`]) or received from the peer and checked first
//!   ([`SharedMap::open`]: seals, size).
//! - Every access to its bytes is atomic (`AtomicU64` / `AtomicU32` / `AtomicU8`): the peer
//!   can write any byte at any time, so a plain load or `copy_nonoverlapping` would be a data
//!   race. Bounds and alignment are checked on every access; an access out of bounds is
//!   refused (`None`), never performed.
//! - The futex calls ([`futex_wait`], [`futex_wake`]) are shared (not `FUTEX_PRIVATE`)
//!   futexes on words of the mapping, so a waiter in one process is woken by the other.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::thread::futex;

use crate::OpenError;

/// Seals a ring file carries: its size never changes, and no seal can be added (so the peer
/// cannot add `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE` after the fact).
pub const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// A memfd mapped shared and read-write in this process; its size is sealed, so no byte
/// below [`SharedMap::len`] can ever fault.
#[derive(Debug)]
pub struct SharedMap {
    map: MmapRaw,
    len: usize,
}

impl SharedMap {
    /// Creates a sealed memfd of `len` bytes (name `ferry-ring`, never in a filesystem:
    /// nothing is left behind when a process dies) and maps it. Returns the map and the
    /// descriptor to hand to the peer.
    pub fn create(len: usize) -> io::Result<(SharedMap, OwnedFd)> {
        if len == 0 || !len.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring file length must be a non-zero multiple of 8",
            ));
        }
        let fd = rustix::fs::memfd_create("ferry-ring", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS)?;
        let map = MmapOptions::new().len(len).map_raw(&fd)?;
        Ok((SharedMap { map, len }, fd))
    }

    /// Checks a descriptor received from the peer (a memfd carrying [`REQUIRED_SEALS`], of
    /// exactly `len` bytes) and maps it shared. The descriptor is closed afterwards; the
    /// mapping keeps the memory.
    pub fn open(fd: OwnedFd, len: usize) -> Result<SharedMap, OpenError> {
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| OpenError::NotSealed(format!("cannot read seals ({e}); not a memfd?")))?;
        if !seals.contains(REQUIRED_SEALS) {
            return Err(OpenError::NotSealed(format!("seals are {seals:?}; SHRINK, GROW and SEAL are required")));
        }
        let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| OpenError::Io(io::Error::from(e).into()))?;
        let actual = u64::try_from(st.st_size).unwrap_or(0);
        if actual != len as u64 || len == 0 {
            return Err(OpenError::WrongSize { expected: len as u64, actual });
        }
        let map = MmapOptions::new().len(len).map_raw(&fd).map_err(|e| OpenError::Io(e.into()))?;
        Ok(SharedMap { map, len })
    }

    /// Hints the CPU to move the cache lines of `[offset, offset + len)` out of this core's
    /// private caches into the shared last-level cache (x86 `CLDEMOTE`): the other process
    /// reads them from there, instead of waiting for this core to hand them over. Only a
    /// hint: it changes no byte, and a CPU without the instruction runs it as a no-op.
    /// Ranges out of bounds are skipped.
    pub fn demote(&self, offset: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let Some(end) = offset.checked_add(len).filter(|e| *e <= self.len) else { return };
            let mut line = offset & !63;
            while line < end {
                let p = self.map.as_mut_ptr().wrapping_add(line);
                // SAFETY: CLDEMOTE reads and writes no memory and cannot fault (it is a hint;
                // older CPUs decode it as a NOP); `p` is inside this live mapping anyway.
                unsafe { std::arch::asm!("cldemote byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags)) };
                line += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    /// The 8-aligned `u64` word at `offset`; `None` when out of bounds or misaligned.
    pub fn u64_at(&self, offset: usize) -> Option<&AtomicU64> {
        let end = offset.checked_add(8)?;
        if end > self.len || !offset.is_multiple_of(8) {
            return None;
        }
        // SAFETY: in bounds of a live mapping (`&self` keeps `self.map` alive for the returned
        // borrow) of a memfd whose size is sealed, so the access cannot fault; the mapping is
        // page-aligned and `offset` a multiple of 8, so the pointer is aligned for `AtomicU64`.
        // This process reaches these bytes only through atomics (this module makes no other
        // kind of reference to the mapping); the peer's accesses are outside this process.
        Some(unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(offset).cast::<u64>()) })
    }

    /// The 4-aligned `u32` word at `offset` (a futex word); `None` when out of bounds or
    /// misaligned.
    pub fn u32_at(&self, offset: usize) -> Option<&AtomicU32> {
        let end = offset.checked_add(4)?;
        if end > self.len || !offset.is_multiple_of(4) {
            return None;
        }
        // SAFETY: as in `u64_at`, with 4-byte alignment.
        Some(unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(offset).cast::<u32>()) })
    }

    /// The byte at `offset`; the caller has checked `offset < len`.
    fn u8_at(&self, offset: usize) -> &AtomicU8 {
        debug_assert!(offset < self.len);
        // SAFETY: every caller passes an offset below `self.len` (checked in `read` and
        // `write` before any access), inside the live sealed mapping; a byte has no alignment.
        unsafe { AtomicU8::from_ptr(self.map.as_mut_ptr().add(offset)) }
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`, with relaxed atomic loads (word-sized
    /// where aligned). `None` (and nothing read) when the range is out of bounds.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Option<()> {
        let end = offset.checked_add(dst.len())?;
        if end > self.len {
            return None;
        }
        let mut i = 0;
        while i < dst.len() && !(offset + i).is_multiple_of(8) {
            dst[i] = self.u8_at(offset + i).load(Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= dst.len() {
            let w = self.u64_at(offset + i)?.load(Ordering::Relaxed);
            dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        }
        while i < dst.len() {
            dst[i] = self.u8_at(offset + i).load(Ordering::Relaxed);
            i += 1;
        }
        Some(())
    }

    /// Copies `src` to `offset`, with relaxed atomic stores (word-sized where aligned). `None`
    /// (and nothing written) when the range is out of bounds.
    pub fn write(&self, offset: usize, src: &[u8]) -> Option<()> {
        let end = offset.checked_add(src.len())?;
        if end > self.len {
            return None;
        }
        let mut i = 0;
        while i < src.len() && !(offset + i).is_multiple_of(8) {
            self.u8_at(offset + i).store(src[i], Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= src.len() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&src[i..i + 8]);
            self.u64_at(offset + i)?.store(u64::from_ne_bytes(w), Ordering::Relaxed);
            i += 8;
        }
        while i < src.len() {
            self.u8_at(offset + i).store(src[i], Ordering::Relaxed);
            i += 1;
        }
        Some(())
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout`: returns at once when the word
/// differs, on a wake-up, on a signal or at the timeout (the caller re-checks its condition
/// in every case). A shared futex: the waker may be another process mapping the same file.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::thread::futex::Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // EAGAIN (the word changed), ETIMEDOUT and EINTR all mean: look again.
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every thread (of any process) sleeping on `word`.
pub fn futex_wake(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), u32::MAX);
}

/// The CPU this thread runs on now, or `None` where the system cannot say. glibc 2.35 and
/// later read it from the thread's rseq area, older ones from the vDSO: no system call
/// either way on x86-64, so a spinning waiter can ask often.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: `sched_getcpu` takes no arguments, touches no memory of ours and only
    // returns a number (or -1).
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}

/// Moves this thread off CPU `cpu` now, to another CPU it may run on (the kernel picks
/// which), and gives it back every CPU it had: the kernel migrates a thread at once when
/// its mask leaves out the CPU it runs on, and a restored mask does not move it back.
/// False when it may run on no other CPU, or the system refused. (An affinity that
/// somebody else sets for this thread between the two calls is undone.)
pub fn move_off_cpu(cpu: u32) -> bool {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    if cpu as usize >= CpuSet::MAX_CPU {
        return false; // beyond what a mask here can name
    }
    let Ok(mask) = sched_getaffinity(None) else { return false };
    let mut others = mask;
    others.unset(cpu as usize);
    if others.count() == 0 || sched_setaffinity(None, &others).is_err() {
        return false;
    }
    // Given back, whatever happens: a thread left without one of its CPUs would stay so.
    if sched_setaffinity(None, &mask).is_err() && sched_setaffinity(None, &mask).is_err() {
        tracing::warn!("ferry-ring: could not give this thread its CPUs back after moving it off CPU {cpu}");
        return false;
    }
    true
}

/// A memfd of `len` bytes without seals (for tests of the refusal path).
#[cfg(any(test, feature = "__testing"))]
pub fn unsealed_memfd(len: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("ferry-ring-unsealed", MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mappings_see_the_same_bytes() {
        let (a, fd) = SharedMap::create(4096).unwrap();
        let b = SharedMap::open(fd, 4096).unwrap();
        let src: Vec<u8> = (0..100u8).collect();
        a.write(3, &src).unwrap();
        let mut dst = vec![0u8; 100];
        b.read(3, &mut dst).unwrap();
        assert_eq!(dst, src);
        b.u64_at(8).unwrap().store(77, Ordering::Relaxed);
        assert_eq!(a.u64_at(8).unwrap().load(Ordering::Relaxed), 77);
        assert!(a.read(4000, &mut dst).is_none(), "past the end");
        assert!(a.write(usize::MAX - 2, &src).is_none(), "overflowing offset");
        assert!(a.u64_at(4).is_none(), "misaligned");
        assert!(a.u32_at(4096).is_none(), "past the end");
    }

    #[test]
    fn demoting_lines_changes_no_byte_and_skips_what_is_out_of_bounds() {
        let (a, fd) = SharedMap::create(4096).unwrap();
        let b = SharedMap::open(fd, 4096).unwrap();
        let src: Vec<u8> = (0..=255u8).cycle().take(300).collect();
        a.write(60, &src).unwrap();
        // Lines the range starts and ends inside, a whole mapping, empty and out-of-bounds
        // ranges (skipped, never touched).
        for (offset, len) in [(60, 300), (0, 4096), (4095, 1), (100, 0), (4000, 200), (usize::MAX, 2)] {
            a.demote(offset, len);
        }
        let mut dst = vec![0u8; 300];
        b.read(60, &mut dst).unwrap();
        assert_eq!(dst, src, "a hint, not a write");
    }

    #[test]
    fn refuses_unsealed_and_wrong_sizes() {
        let fd = unsealed_memfd(4096).unwrap();
        assert!(matches!(SharedMap::open(fd, 4096), Err(OpenError::NotSealed(_))));
        let (_a, fd) = SharedMap::create(4096).unwrap();
        let fd2 = fd.try_clone().unwrap();
        assert!(matches!(SharedMap::open(fd, 8192), Err(OpenError::WrongSize { .. })));
        assert!(rustix::fs::ftruncate(&fd2, 10).is_err(), "a sealed file cannot shrink");
    }
}
