//! Where a version's tensors go: buckets and offsets.

use ferry_core::ALIGN;

/// Places tensors of `lens` bytes in buckets of at most `bucket_bytes` (a larger tensor gets
/// a bucket of its own): tensors of 4 KiB and more start on a page, smaller ones on 64
/// bytes. Returns each tensor's (bucket, offset) and each bucket's length.
pub(crate) fn plan(lens: &[u64], bucket_bytes: u64) -> (Vec<(u32, u64)>, Vec<u64>) {
    let mut places = Vec::with_capacity(lens.len());
    let mut buckets: Vec<u64> = Vec::new();
    for &len in lens {
        let align = if len >= 4096 { 4096 } else { ALIGN as u64 };
        let fits = buckets.last().map(|&used| used.next_multiple_of(align).saturating_add(len) <= bucket_bytes);
        if fits != Some(true) {
            buckets.push(0);
        }
        let last = buckets.last_mut().expect("a bucket was just made");
        let off = last.next_multiple_of(align);
        *last = off + len;
        places.push(((buckets.len() - 1) as u32, off));
    }
    (places, buckets)
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn plan_packs_and_aligns() {
        let (p, b) = plan(&[10, 5000, 100, 1 << 20], 1 << 20);
        assert_eq!(p, vec![(0, 0), (0, 4096), (0, 9152), (1, 0)]);
        assert_eq!(b, vec![9252, 1 << 20]);
        let (p, b) = plan(&[3 << 20], 1 << 20);
        assert_eq!((p, b), (vec![(0, 0)], vec![3 << 20]), "a large tensor gets its own bucket");
        assert_eq!(plan(&[], 1 << 20), (vec![], vec![]));
    }
}
