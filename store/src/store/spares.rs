//! Work the store does off its callers' time: spare buckets made ready for the next
//! publish, and old versions freed, on threads of their own at a low priority.

use std::sync::Arc;

use super::{Store, Version, lock};
use crate::bucket::{Bucket, BucketMut};

/// Lowers the calling thread's priority (nice 10; on Linux the nice value is per thread):
/// background work takes the cores that publishers and readers leave.
pub(super) fn background_priority() {
    #[cfg(target_os = "linux")]
    let _ = rustix::process::setpriority_process(None, 10);
}

/// Makes spare buckets of `lens` ready for the next publish ([`StoreOptions::spare_buckets`])
/// on a thread of its own at a low priority: each page written once, so the next publish
/// copies into memory already there. Never past the budget, and never more spare bytes
/// than `lens` add up to.
pub(super) fn make_spares(store: Arc<Store>, lens: Vec<usize>) {
    let total: u64 = lens.iter().map(|&l| l as u64).sum();
    let _ = std::thread::Builder::new().name("ferry-store-spare".into()).spawn(move || {
        background_priority();
        for len in lens {
            {
                let st = lock(&store.state);
                let spare: u64 = st.spares.iter().map(|b| b.as_slice().len() as u64).sum();
                if spare + len as u64 > total || st.used() + len as u64 > store.opts.budget_bytes {
                    return;
                }
            }
            let Ok(mut b) = BucketMut::create(len) else { return };
            for x in b.as_mut_slice().iter_mut().step_by(4096) {
                *x = 0;
            }
            let mut st = lock(&store.state);
            // Checked again under the lock: publishes at once each make spares, and
            // without this they would together keep more than one publish's worth.
            let spare: u64 = st.spares.iter().map(|b| b.as_slice().len() as u64).sum();
            if spare + len as u64 > total || st.used() + len as u64 > store.opts.budget_bytes {
                return; // (another publish's spares, or a publish took the room: `b` is freed)
            }
            st.spares.push(b);
        }
    });
}

/// Drops `versions`; where that frees memory (about 0.2 s per GiB to unmap), on a thread of
/// its own, not on the caller's time.
pub(crate) fn free_later(versions: Vec<Version>) {
    if versions.iter().any(|v| v.buckets.iter().any(Bucket::is_last)) {
        let _ = std::thread::Builder::new().name("ferry-store-free".into()).spawn(move || drop(versions));
    }
}
