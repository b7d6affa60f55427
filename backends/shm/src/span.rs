//! [`AddrSpan`]: a first look, with no lock, before a lookup by address.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The lowest start and the highest end of every address range ever added to a map of
/// ranges: a pointer outside it is in none of them. Sending a heap tensor asks three such
/// maps whether they hold it (the pool, the shared segments, the peer's segments); the span
/// answers with two loads where the map's lock would cost two atomic writes per map.
///
/// It never shrinks: a range taken out of its map stays covered, which costs no more than
/// the lookup it would have saved. A range is added before any pointer into it exists, so a
/// pointer that is in it finds it covered.
pub(crate) struct AddrSpan {
    lo: AtomicUsize,
    hi: AtomicUsize,
}

impl AddrSpan {
    /// Covers nothing.
    pub(crate) const fn new() -> AddrSpan {
        AddrSpan { lo: AtomicUsize::new(usize::MAX), hi: AtomicUsize::new(0) }
    }

    /// Covers `[start, start + len)` from now on.
    pub(crate) fn add(&self, start: usize, len: usize) {
        self.lo.fetch_min(start, Ordering::AcqRel);
        self.hi.fetch_max(start.saturating_add(len), Ordering::AcqRel);
    }

    /// False when `[ptr, ptr + len)` is in no range ever added (true: look in the map).
    pub(crate) fn may_hold(&self, ptr: usize, len: usize) -> bool {
        ptr >= self.lo.load(Ordering::Acquire) && ptr.saturating_add(len) <= self.hi.load(Ordering::Acquire)
    }
}

impl Default for AddrSpan {
    fn default() -> AddrSpan {
        AddrSpan::new()
    }
}

#[cfg(test)]
mod tests {
    use super::AddrSpan;

    #[test]
    fn covers_what_was_added_and_between() {
        let s = AddrSpan::new();
        assert!(!s.may_hold(0, 0));
        assert!(!s.may_hold(1000, 8));
        s.add(1000, 100);
        assert!(s.may_hold(1000, 100));
        assert!(s.may_hold(1050, 8));
        assert!(!s.may_hold(999, 8), "starts before the first range");
        assert!(!s.may_hold(1096, 8), "ends past the last range");
        s.add(5000, 10);
        // Between two ranges: covered (a span is one interval; the map answers).
        assert!(s.may_hold(2000, 8));
        assert!(s.may_hold(5000, 10));
        assert!(!s.may_hold(5001, 10));
        assert!(!s.may_hold(usize::MAX, 1), "no overflow at the top of the address space");
    }
}
