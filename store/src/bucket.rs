//! A bundle's buckets: on Linux, shared segments of ferry-shm (sealed memfds, lent to readers
//! without a copy and unmapped by them when the bucket goes); elsewhere, aligned heap memory
//! (readers get copies).

use bytes::Bytes;

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::{Arc, Weak};

    use bytes::Bytes;
    use ferry_shm::{SharedSegment, SharedSegmentMut};

    /// A bucket being filled.
    pub struct BucketMut(SharedSegmentMut);

    impl BucketMut {
        pub fn create(len: usize) -> std::io::Result<Self> {
            SharedSegmentMut::create(len.max(1)).map(BucketMut)
        }
        pub fn as_mut_slice(&mut self) -> &mut [u8] {
            self.0.as_mut_slice()
        }
        pub fn freeze(self) -> Bucket {
            Bucket(self.0.freeze())
        }
    }

    /// A filled bucket.
    #[derive(Clone)]
    pub struct Bucket(Arc<SharedSegment>);

    impl Bucket {
        pub fn len(&self) -> usize {
            self.0.len()
        }
        pub fn bytes(&self, offset: usize, len: usize) -> Option<Bytes> {
            self.0.bytes(offset, len)
        }
        /// The bucket `bytes` already lie in, and their offset there (no copy needed).
        pub fn containing(bytes: &[u8]) -> Option<(Bucket, usize)> {
            SharedSegment::containing(bytes).map(|(s, off)| (Bucket(s), off))
        }
        pub fn downgrade(&self) -> WeakBucket {
            WeakBucket(Arc::downgrade(&self.0), self.0.len())
        }
        pub fn same(&self, other: &Bucket) -> bool {
            Arc::ptr_eq(&self.0, &other.0)
        }
        /// Whether this is the last handle (dropping it frees the memory).
        pub fn is_last(&self) -> bool {
            Arc::strong_count(&self.0) == 1
        }
    }

    /// A bucket of a superseded version, alive while readers hold it.
    pub struct WeakBucket(Weak<SharedSegment>, usize);

    impl WeakBucket {
        /// Its bytes while anyone holds it, else `None`.
        pub fn live_bytes(&self) -> Option<usize> {
            (self.0.strong_count() > 0).then_some(self.1)
        }
        pub fn upgrade(&self) -> Option<Bucket> {
            self.0.upgrade().map(Bucket)
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use bytes::Bytes;
    use ferry_core::AlignedBuf;

    /// A bucket being filled.
    pub struct BucketMut(AlignedBuf);

    impl BucketMut {
        pub fn create(len: usize) -> std::io::Result<Self> {
            Ok(BucketMut(AlignedBuf::zeroed(len)))
        }
        pub fn as_mut_slice(&mut self) -> &mut [u8] {
            self.0.as_mut()
        }
        pub fn freeze(self) -> Bucket {
            Bucket(self.0.into_bytes())
        }
    }

    /// A filled bucket.
    #[derive(Clone)]
    pub struct Bucket(Bytes);

    impl Bucket {
        pub fn len(&self) -> usize {
            self.0.len()
        }
        pub fn bytes(&self, offset: usize, len: usize) -> Option<Bytes> {
            let end = offset.checked_add(len)?;
            (end <= self.0.len()).then(|| self.0.slice(offset..end))
        }
        pub fn containing(_: &[u8]) -> Option<(Bucket, usize)> {
            None
        }
        pub fn downgrade(&self) -> WeakBucket {
            WeakBucket
        }
        pub fn same(&self, other: &Bucket) -> bool {
            self.0.as_ptr() == other.0.as_ptr()
        }
        pub fn is_last(&self) -> bool {
            false
        }
    }

    /// A bucket of a superseded version (readers hold copies: nothing to track).
    pub struct WeakBucket;

    impl WeakBucket {
        pub fn live_bytes(&self) -> Option<usize> {
            None
        }
        pub fn upgrade(&self) -> Option<Bucket> {
            None
        }
    }
}

pub(crate) use imp::{Bucket, BucketMut, WeakBucket};

impl Bucket {
    /// The whole bucket as one byte tensor's storage.
    pub(crate) fn whole(&self) -> Bytes {
        self.bytes(0, self.len()).unwrap_or_default()
    }
}
