//! Remote tensor references kept in shared memory: [`shared_copy`] is the
//! [`ferry_rpc::RefCopy`] that makes `ferry.ref.fetch` zero-copy over shm, and
//! [`shared_tensor_mut`] the same memory to fill in place (a handler's result kept with
//! `CallContext::keep`).

use bytes::Bytes;
use ferry_core::{Tensor, TensorMeta, TensorMut, WritableStorage};

use crate::bucket::BucketMut;

/// Copies a host tensor into a sealed shared segment of its own (Linux; elsewhere into
/// aligned heap memory), so that every later send of it over an shm connection lends the
/// segment instead of copying it. For [`ferry_rpc::ServerBuilder::ref_copy`].
pub fn shared_copy(t: &Tensor) -> Result<Tensor, String> {
    let src =
        t.host_bytes().ok_or_else(|| format!("a {} tensor cannot be kept here: send a cpu tensor", t.device()))?;
    let mut b = BucketMut::create(src.len()).map_err(|e| format!("cannot allocate shared memory: {e}"))?;
    b.as_mut_slice()[..src.len()].copy_from_slice(src);
    let bytes = b.freeze().bytes(0, src.len()).ok_or("the copy is shorter than the tensor")?;
    // The meta as it is (strides included): the bytes are the source's span.
    Tensor::new(t.meta().clone(), bytes).map_err(|e| e.to_string())
}

/// The [`ferry_rpc::RefCopy`] of a server whose references may be device tensors (a store
/// with a device tier): a host tensor as [`shared_copy`]; a tensor on one of `chan`'s
/// devices copied on its device into `chan`'s pool
/// ([`ferry_cuda_ipc::CudaIpcChannel::copy_on_device`]), so that the kept copy outlives the
/// sender's lease and is lent again without a copy. It blocks its runtime worker for the
/// copy (`block_in_place`): on a current-thread runtime a device tensor is refused.
#[cfg(feature = "cuda")]
pub fn device_or_shared_copy(chan: ferry_cuda_ipc::CudaIpcChannel) -> ferry_rpc::RefCopy {
    std::sync::Arc::new(move |t: &Tensor| {
        if !matches!(t.storage(), ferry_core::Storage::Device(_)) {
            return shared_copy(t);
        }
        let handle = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
            .ok_or_else(|| format!("keeping a {} tensor needs a multi-thread runtime", t.device()))?;
        tokio::task::block_in_place(|| handle.block_on(chan.copy_on_device(t))).map_err(|e| e.to_string())
    })
}

/// A zeroed, writable host tensor of `meta` in a shared segment of its own (Linux;
/// elsewhere aligned heap memory): once frozen, every send of it over an shm connection
/// lends the segment instead of copying it. The error says why the memory could not be had.
pub fn shared_tensor_mut(meta: TensorMeta) -> Result<TensorMut, String> {
    let len = meta.byte_span().map_err(|e| e.to_string())?;
    let len = usize::try_from(len).map_err(|_| format!("a tensor of {len} bytes does not fit in memory"))?;
    let bucket = BucketMut::create(len).map_err(|e| format!("cannot allocate {len} bytes of shared memory: {e}"))?;
    TensorMut::from_storage(meta, Box::new(Shared { bucket, len })).map_err(|e| e.to_string())
}

/// A bucket of its own holding one tensor's `len` bytes (a segment is never empty, so it
/// may be longer).
struct Shared {
    bucket: BucketMut,
    len: usize,
}

impl WritableStorage for Shared {
    fn bytes(&self) -> &[u8] {
        &self.bucket.as_slice()[..self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bucket.as_mut_slice()[..self.len]
    }
    fn freeze(self: Box<Self>) -> Bytes {
        let Shared { bucket, len } = *self;
        // The bucket holds at least `len` bytes (created so), so the range is there.
        bucket.freeze().bytes(0, len).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::{DType, TensorMeta};

    use super::*;

    #[test]
    fn a_tensor_filled_in_place_keeps_its_bytes_and_shape() {
        for n in [0u64, 1, 3, 4099] {
            let mut m = shared_tensor_mut(TensorMeta::new(DType::F32, vec![n])).unwrap();
            for (i, b) in m.as_bytes_mut().iter_mut().enumerate() {
                *b = i as u8;
            }
            let t = m.freeze();
            assert_eq!(t.shape(), &[n]);
            assert_eq!(t.nbytes() as u64, 4 * n);
            assert!(t.as_bytes().iter().enumerate().all(|(i, &b)| b == i as u8));
            #[cfg(target_os = "linux")]
            if n > 0 {
                assert!(
                    ferry_shm::SharedSegment::containing(t.as_bytes()).is_some(),
                    "the tensor lies in a shared segment"
                );
            }
        }
    }

    #[test]
    fn a_copy_equals_its_source() {
        let src = Tensor::from_slice(vec![2u64, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let c = shared_copy(&src).unwrap();
        assert_eq!(c.as_bytes(), src.as_bytes());
        assert_eq!(c.meta(), src.meta());
    }
}
