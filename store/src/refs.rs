//! Remote tensor references kept in shared memory: [`shared_copy`] is the
//! [`ferry_rpc::RefCopy`] that makes `ferry.ref.fetch` zero-copy over shm.

use ferry_core::Tensor;

/// Copies a host tensor into a sealed shared segment of its own (Linux; elsewhere into
/// aligned heap memory), so that every later send of it over an shm connection lends the
/// segment instead of copying it. For [`ferry_rpc::ServerBuilder::ref_copy`].
pub fn shared_copy(t: &Tensor) -> Result<Tensor, String> {
    let src =
        t.host_bytes().ok_or_else(|| format!("a {} tensor cannot be kept here: send a cpu tensor", t.device()))?;
    let mut b =
        crate::bucket::BucketMut::create(src.len()).map_err(|e| format!("cannot allocate shared memory: {e}"))?;
    b.as_mut_slice()[..src.len()].copy_from_slice(src);
    let bucket = b.freeze();
    let bytes = bucket.bytes(0, src.len()).ok_or("the copy is shorter than the tensor")?;
    Tensor::new(t.meta().clone(), bytes).map_err(|e| e.to_string())
}
