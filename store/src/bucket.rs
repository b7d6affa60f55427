//! A bundle's buckets: on Linux, shared segments of ferry-shm (sealed memfds, lent to readers
//! without a copy and unmapped by them when the bucket goes); elsewhere, aligned heap memory
//! (readers get copies).

use std::sync::{Arc, Weak};

use bytes::Bytes;
use ferry_core::{DType, DeviceBuffer, Storage, Tensor, TensorMeta};

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
        pub fn as_slice(&self) -> &[u8] {
            self.0.as_slice()
        }
        pub fn freeze(self) -> HostBucket {
            HostBucket(self.0.freeze())
        }
    }

    /// A filled bucket.
    #[derive(Clone)]
    pub struct HostBucket(Arc<SharedSegment>);

    impl HostBucket {
        pub fn len(&self) -> usize {
            self.0.len()
        }
        pub fn bytes(&self, offset: usize, len: usize) -> Option<Bytes> {
            self.0.bytes(offset, len)
        }
        /// The bucket `bytes` already lie in, and their offset there (no copy needed).
        pub fn containing(bytes: &[u8]) -> Option<(HostBucket, usize)> {
            SharedSegment::containing(bytes).map(|(s, off)| (HostBucket(s), off))
        }
        pub fn downgrade(&self) -> WeakHost {
            WeakHost(Arc::downgrade(&self.0), self.0.len())
        }
        pub fn same(&self, other: &HostBucket) -> bool {
            Arc::ptr_eq(&self.0, &other.0)
        }
        /// Its identity while it lives (the allocation's address).
        pub fn key(&self) -> usize {
            Arc::as_ptr(&self.0) as usize
        }
        /// Whether this is the last handle (dropping it frees the memory).
        pub fn is_last(&self) -> bool {
            Arc::strong_count(&self.0) == 1
        }
    }

    /// A bucket of a superseded version, alive while readers hold it.
    pub struct WeakHost(Weak<SharedSegment>, usize);

    impl WeakHost {
        /// Its bytes while anyone holds it, else `None`.
        pub fn live_bytes(&self) -> Option<usize> {
            (self.0.strong_count() > 0).then_some(self.1)
        }
        pub fn upgrade(&self) -> Option<HostBucket> {
            self.0.upgrade().map(HostBucket)
        }
        /// The identity of the bucket it points to (stable while this handle lives).
        pub fn key(&self) -> usize {
            self.0.as_ptr() as usize
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
        pub fn as_slice(&self) -> &[u8] {
            self.0.as_ref()
        }
        pub fn freeze(self) -> HostBucket {
            HostBucket(self.0.into_bytes())
        }
    }

    /// A filled bucket.
    #[derive(Clone)]
    pub struct HostBucket(Bytes);

    impl HostBucket {
        pub fn len(&self) -> usize {
            self.0.len()
        }
        pub fn bytes(&self, offset: usize, len: usize) -> Option<Bytes> {
            let end = offset.checked_add(len)?;
            (end <= self.0.len()).then(|| self.0.slice(offset..end))
        }
        pub fn containing(_: &[u8]) -> Option<(HostBucket, usize)> {
            None
        }
        pub fn downgrade(&self) -> WeakHost {
            WeakHost
        }
        pub fn same(&self, other: &HostBucket) -> bool {
            self.0.as_ptr() == other.0.as_ptr()
        }
        pub fn key(&self) -> usize {
            self.0.as_ptr() as usize
        }
        pub fn is_last(&self) -> bool {
            false
        }
    }

    /// A bucket of a superseded version (readers hold copies: nothing to track).
    pub struct WeakHost;

    impl WeakHost {
        pub fn live_bytes(&self) -> Option<usize> {
            None
        }
        pub fn upgrade(&self) -> Option<HostBucket> {
            None
        }
        pub fn key(&self) -> usize {
            0
        }
    }
}

pub(crate) use imp::BucketMut;
use imp::{HostBucket, WeakHost};

/// A filled bucket: host memory (shared segments on Linux), or a device allocation a
/// producer made and filled (a `u8` vector tensor on `cuda:N`, lent over cuda-ipc with one
/// IPC handle per bucket).
#[derive(Clone)]
pub(crate) enum Bucket {
    Host(HostBucket),
    Device(Tensor),
}

impl From<HostBucket> for Bucket {
    fn from(b: HostBucket) -> Self {
        Bucket::Host(b)
    }
}

impl Bucket {
    pub(crate) fn len(&self) -> usize {
        match self {
            Bucket::Host(b) => b.len(),
            Bucket::Device(t) => t.nbytes(),
        }
    }

    /// Host bytes at `offset` (`None` for a device bucket or out of range).
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<Bytes> {
        match self {
            Bucket::Host(b) => b.bytes(offset, len),
            Bucket::Device(_) => None,
        }
    }

    /// The host bucket `bytes` already lie in, and their offset there.
    pub(crate) fn containing(bytes: &[u8]) -> Option<(Bucket, usize)> {
        HostBucket::containing(bytes).map(|(b, off)| (Bucket::Host(b), off))
    }

    pub(crate) fn downgrade(&self) -> WeakBucket {
        match self {
            Bucket::Host(b) => WeakBucket::Host(b.downgrade()),
            Bucket::Device(t) => match t.storage() {
                Storage::Device(buf) => WeakBucket::Device(Arc::downgrade(buf), t.meta().clone()),
                _ => WeakBucket::Gone,
            },
        }
    }

    pub(crate) fn same(&self, other: &Bucket) -> bool {
        match (self, other) {
            (Bucket::Host(a), Bucket::Host(b)) => a.same(b),
            (Bucket::Device(a), Bucket::Device(b)) => {
                a.device_buffer().zip(b.device_buffer()).is_some_and(|(a, b)| Arc::ptr_eq(a, b))
            }
            _ => false,
        }
    }

    /// Its identity while it lives: two handles on one bucket have the same key, which
    /// [`WeakBucket::key`] shares (memory shared by several versions is counted once).
    pub(crate) fn key(&self) -> usize {
        match self {
            Bucket::Host(b) => b.key(),
            Bucket::Device(t) => t.device_buffer().map_or(0, |b| Arc::as_ptr(b) as *const () as usize),
        }
    }

    /// Whether this is the last handle (dropping it frees the memory).
    pub(crate) fn is_last(&self) -> bool {
        match self {
            Bucket::Host(b) => b.is_last(),
            Bucket::Device(t) => t.device_buffer().is_some_and(|b| Arc::strong_count(b) == 1),
        }
    }

    /// The whole bucket as one `u8` vector tensor.
    pub(crate) fn tensor(&self) -> Tensor {
        match self {
            Bucket::Host(b) => {
                let whole = b.bytes(0, b.len()).unwrap_or_default();
                Tensor::new(TensorMeta::new(DType::U8, vec![whole.len() as u64]), whole)
                    .expect("a u8 vector over a whole bucket is valid")
            }
            Bucket::Device(t) => t.clone(),
        }
    }
}

/// A bucket of a superseded version, alive while readers hold it.
pub(crate) enum WeakBucket {
    Host(WeakHost),
    Device(Weak<dyn DeviceBuffer>, TensorMeta),
    Gone,
}

impl WeakBucket {
    /// Its bytes while anyone holds it, else `None`.
    pub(crate) fn live_bytes(&self) -> Option<usize> {
        match self {
            WeakBucket::Host(w) => w.live_bytes(),
            WeakBucket::Device(w, _) => w.upgrade().map(|b| b.len()),
            WeakBucket::Gone => None,
        }
    }

    /// The key ([`Bucket::key`]) of the bucket it points to; stable while this handle lives
    /// (a weak handle keeps the address from being reused).
    pub(crate) fn key(&self) -> usize {
        match self {
            WeakBucket::Host(w) => w.key(),
            WeakBucket::Device(w, _) => w.as_ptr() as *const () as usize,
            WeakBucket::Gone => 0,
        }
    }

    pub(crate) fn upgrade(&self) -> Option<Bucket> {
        match self {
            WeakBucket::Host(w) => w.upgrade().map(Bucket::Host),
            WeakBucket::Device(w, meta) => Tensor::from_device(meta.clone(), w.upgrade()?).ok().map(Bucket::Device),
            WeakBucket::Gone => None,
        }
    }
}
