//! Per-tensor BLAKE3 digests of a version ([`crate::Version::tensor_digests`]): computed
//! once (the first caller computes, the others wait for it), several tensors at a time, and
//! inherited from the version before for every tensor that lies in the same range of the
//! same bucket: a bucket never changes once published (a sealed, frozen segment nobody
//! holds writable), so the same range has the same bytes and the same digest. A version
//! that shares 99% of its tensors with the one before hashes 1% of its bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

use crate::bucket::Bucket;
use crate::{Entry, Manifest};

/// The version before (held weakly: the link never keeps it alive) and, for each entry,
/// the index of its entry in the same bucket range.
type Link = (Weak<Manifest>, Vec<Option<u32>>);

/// Where a version's entries can take their digests from. Taken by the first computation.
#[derive(Debug, Default)]
pub(crate) struct Inherit(Mutex<Option<Link>>);

impl Inherit {
    /// The entries of a version (`entries` over `buckets`) that lie where entries of `prev`
    /// lie (`prev.entries` over `prev_buckets`). Host buckets only.
    pub(crate) fn of(prev: &Arc<Manifest>, prev_buckets: &[Bucket], entries: &[Entry], buckets: &[Bucket]) -> Inherit {
        let key = |bs: &[Bucket], e: &Entry| -> Option<(usize, u64, u64)> {
            let b = bs.get(e.3 as usize).filter(|b| matches!(b, Bucket::Host(_)))?;
            Some((b.key(), e.4, e.byte_len()?))
        };
        let before: HashMap<(usize, u64, u64), u32> =
            prev.entries.iter().enumerate().filter_map(|(j, e)| Some((key(prev_buckets, e)?, j as u32))).collect();
        let map: Vec<Option<u32>> =
            entries.iter().map(|e| key(buckets, e).and_then(|k| before.get(&k).copied())).collect();
        if map.iter().all(Option::is_none) {
            return Inherit::default();
        }
        Inherit(Mutex::new(Some((Arc::downgrade(prev), map))))
    }

    /// The digests the version before has already computed, per entry of this version (taken:
    /// a second call gets none).
    pub(crate) fn take(&self) -> Vec<Option<[u8; 32]>> {
        let link = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some((prev, map)) = link else { return Vec::new() };
        let Some(digests) = prev.upgrade().and_then(|m| m.tensor_digests()) else { return Vec::new() };
        map.iter().map(|j| j.and_then(|j| digests.get(j as usize).copied())).collect()
    }
}

/// BLAKE3 of each of `bytes`, taking the digest from `known` where it is given (same
/// order; shorter: the rest unknown). Returns the digests and the bytes hashed.
pub(crate) fn compute(bytes: &[Bytes], known: &[Option<[u8; 32]>]) -> (Vec<[u8; 32]>, u64) {
    let todo: Vec<usize> = (0..bytes.len()).filter(|&i| known.get(i).copied().flatten().is_none()).collect();
    let hashed = parallel_map(todo.len(), |k| *blake3::hash(&bytes[todo[k]]).as_bytes());
    let mut out: Vec<[u8; 32]> =
        (0..bytes.len()).map(|i| known.get(i).copied().flatten().unwrap_or_default()).collect();
    let mut n = 0u64;
    for (k, d) in hashed.into_iter().enumerate() {
        out[todo[k]] = d;
        n += bytes[todo[k]].len() as u64;
    }
    (out, n)
}

/// `f(0..n)`, in order, computed on up to as many threads as the machine has cores (at most
/// 8), each taking the next index as it finishes one.
pub(crate) fn parallel_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |c| c.get()).min(8).min(n);
    if threads <= 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut parts: Vec<Vec<(usize, T)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break mine;
                        }
                        mine.push((i, f(i)));
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut all: Vec<(usize, T)> = parts.iter_mut().flat_map(std::mem::take).collect();
    all.sort_unstable_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_the_order() {
        assert_eq!(parallel_map(1000, |i| i * 2), (0..1000).map(|i| i * 2).collect::<Vec<_>>());
        assert!(parallel_map(0, |i| i).is_empty());
    }

    #[test]
    fn compute_hashes_what_is_not_known_and_counts_it() {
        let bytes = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"defg")];
        let (d, n) = compute(&bytes, &[]);
        assert_eq!(d, vec![*blake3::hash(b"abc").as_bytes(), *blake3::hash(b"defg").as_bytes()]);
        assert_eq!(n, 7);
        let (d2, n2) = compute(&bytes, &[Some(d[0])]);
        assert_eq!((d2, n2), (d, 4), "the known digest is taken, the other hashed");
    }
}
