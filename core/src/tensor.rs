//! [`Tensor`] (metadata + storage), [`TensorMut`] (a writable tensor being filled) and
//! [`AlignedBuf`] (64-byte aligned host memory).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use crate::dtype::{DType, Device, Element};
use crate::error::{MetaError, ViewError};
use crate::meta::TensorMeta;

/// Alignment of every buffer ferry allocates, and of every tensor inside an inline frame.
pub const ALIGN: usize = 64;

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Chunk([u8; ALIGN]);

/// Zero-initialised host memory aligned to [`ALIGN`] bytes. Large buffers come from the
/// allocator's zeroed path, so untouched pages cost nothing.
pub struct AlignedBuf {
    chunks: Vec<Chunk>,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let n = len.div_ceil(ALIGN);
        AlignedBuf { chunks: bytemuck::allocation::zeroed_vec(n), len }
    }

    /// A buffer holding a copy of `src`.
    pub fn copy_from(src: &[u8]) -> Self {
        let mut b = Self::zeroed(src.len());
        b.as_mut().copy_from_slice(src);
        b
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Turns the buffer into immutable, cheaply clonable [`Bytes`] (no copy).
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice::<Chunk, u8>(&self.chunks)[..self.len]
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Chunk, u8>(&mut self.chunks)[..self.len]
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

/// Device memory a tensor can live in (a CUDA allocation, or a range of one). Implemented
/// by device backends (ferry-cuda-ipc); the buffer keeps the memory alive while it lives.
pub trait DeviceBuffer: Send + Sync + 'static {
    /// The device the memory is on.
    fn device(&self) -> Device;
    /// Device address of the first byte.
    fn device_ptr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For a backend to recognise its own buffers.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Where a tensor's bytes are.
///
/// Host bytes are a [`Bytes`]: owned memory, a slice of a received frame, or (with the
/// shm channel) a lease on another process's shared memory whose owner is told when the
/// last clone is dropped. Device bytes are a [`DeviceBuffer`].
#[derive(Clone)]
#[non_exhaustive]
pub enum Storage {
    /// Bytes in host memory.
    Host(Bytes),
    /// Bytes in device memory.
    Device(Arc<dyn DeviceBuffer>),
}

/// A tensor: metadata plus storage, validated against each other on construction.
///
/// # Received bytes can change under you
///
/// A tensor received over a shared-memory channel (shm, cuda-ipc) is a view of the
/// sender's memory, and the `&[u8]` that [`Tensor::as_bytes`] returns points into it. The
/// sender promised not to write those bytes while the lease is held (PROTOCOL.md §11.5),
/// but nothing can stop a peer that breaks the promise: its writes show through, also while
/// this process reads, so two reads of one byte may differ. That is outside what a Rust
/// `&[u8]` normally guarantees, and it is why received bytes must be treated as untrusted
/// values, never as facts that memory safety rests on. ferry itself never reads peer memory
/// to decide anything: every check (ranges, sizes, leases, seals) is made on the
/// descriptor's numbers and the segment's sealed size, so a peer's writes can change the
/// values an application reads but can never make this process fault or read out of
/// bounds. Copy a tensor ([`Tensor::to_aligned`]) to get bytes no other process can write.
#[derive(Clone)]
pub struct Tensor {
    meta: TensorMeta,
    storage: Storage,
}

impl Tensor {
    /// A host tensor over `bytes`, after checking that `meta` (device `cpu`) describes
    /// exactly these bytes.
    pub fn new(meta: TensorMeta, bytes: Bytes) -> Result<Self, MetaError> {
        if meta.device != Device::Cpu {
            return Err(MetaError::DeviceMismatch { meta: meta.device, storage: Device::Cpu });
        }
        meta.validate(bytes.len() as u64)?;
        Ok(Tensor { meta, storage: Storage::Host(bytes) })
    }

    /// A device tensor over `buf`, after checking that `meta` names the buffer's device and
    /// describes exactly its bytes.
    pub fn from_device(meta: TensorMeta, buf: Arc<dyn DeviceBuffer>) -> Result<Self, MetaError> {
        if meta.device != buf.device() {
            return Err(MetaError::DeviceMismatch { meta: meta.device, storage: buf.device() });
        }
        meta.validate(buf.len() as u64)?;
        Ok(Tensor { meta, storage: Storage::Device(buf) })
    }

    /// A contiguous CPU tensor holding a copy of `data` (in aligned memory).
    pub fn from_slice<T: Element>(shape: impl Into<Vec<u64>>, data: &[T]) -> Result<Self, MetaError> {
        let meta = TensorMeta::new(T::DTYPE, shape);
        Tensor::new(meta, AlignedBuf::copy_from(bytemuck::cast_slice(data)).into_bytes())
    }

    /// A zero-filled contiguous tensor of `meta`.
    pub fn zeros(meta: TensorMeta) -> Result<Self, MetaError> {
        Ok(TensorMut::zeros(meta)?.freeze())
    }

    /// The metadata.
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        &self.meta.shape
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.meta.device
    }

    /// The storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The raw bytes of a host tensor (for strided tensors, the whole span); empty for a
    /// device tensor (see [`Tensor::host_bytes`]). For a tensor received over shared memory,
    /// a misbehaving peer can still write these bytes while the slice is held (see
    /// [`Tensor`]): read them as untrusted values.
    pub fn as_bytes(&self) -> &[u8] {
        self.host_bytes().unwrap_or(&[])
    }

    /// The bytes of a host tensor; `None` for a device tensor.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Host(b) => Some(b),
            Storage::Device(_) => None,
        }
    }

    /// The device buffer of a device tensor.
    pub fn device_buffer(&self) -> Option<&Arc<dyn DeviceBuffer>> {
        match &self.storage {
            Storage::Device(d) => Some(d),
            Storage::Host(_) => None,
        }
    }

    /// The host bytes as a cheap clone of the underlying [`Bytes`] (empty for a device
    /// tensor).
    pub fn bytes(&self) -> Bytes {
        match &self.storage {
            Storage::Host(b) => b.clone(),
            Storage::Device(_) => Bytes::new(),
        }
    }

    /// Length of the storage in bytes.
    pub fn nbytes(&self) -> usize {
        match &self.storage {
            Storage::Host(b) => b.len(),
            Storage::Device(d) => d.len(),
        }
    }

    /// A typed view of a contiguous host tensor. Checks dtype and alignment.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], ViewError> {
        if self.meta.dtype != T::DTYPE {
            return Err(ViewError::DType { requested: T::DTYPE, actual: self.meta.dtype });
        }
        if !self.meta.is_contiguous() {
            return Err(ViewError::NotContiguous);
        }
        if self.meta.device != Device::Cpu {
            return Err(ViewError::NotHost(self.meta.device));
        }
        bytemuck::try_cast_slice(self.as_bytes())
            .map_err(|_| ViewError::Misaligned { align: std::mem::align_of::<T>() })
    }

    /// A copy of this host tensor in fresh [`ALIGN`]-aligned memory (a device tensor is
    /// returned as is).
    pub fn to_aligned(&self) -> Tensor {
        match &self.storage {
            Storage::Host(b) => {
                Tensor { meta: self.meta.clone(), storage: Storage::Host(AlignedBuf::copy_from(b).into_bytes()) }
            }
            Storage::Device(_) => self.clone(),
        }
    }

    /// Splits into metadata and storage.
    pub fn into_parts(self) -> (TensorMeta, Storage) {
        (self.meta, self.storage)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.meta.dtype)
            .field("shape", &self.meta.shape)
            .field("strides", &self.meta.strides)
            .field("device", &self.meta.device)
            .field("nbytes", &self.nbytes())
            .finish()
    }
}

impl PartialEq for Tensor {
    /// Same metadata and same bytes (device tensors: the same device memory).
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta
            && match (&self.storage, &other.storage) {
                (Storage::Host(a), Storage::Host(b)) => a == b,
                (Storage::Device(a), Storage::Device(b)) => a.device_ptr() == b.device_ptr() && a.len() == b.len(),
                _ => false,
            }
    }
}

/// Writable memory a [`TensorMut`] can live in: heap ([`AlignedBuf`]) or a channel's own
/// memory (a slot of the shm pool).
pub trait WritableStorage: Send + Sync + 'static {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Ends writing: immutable bytes over the same memory, without a copy.
    fn freeze(self: Box<Self>) -> Bytes;
}

impl WritableStorage for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self.as_ref()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
    fn freeze(self: Box<Self>) -> Bytes {
        (*self).into_bytes()
    }
}

/// A writable, contiguous host tensor being filled; [`TensorMut::freeze`] makes it a
/// [`Tensor`] without copying.
pub struct TensorMut {
    meta: TensorMeta,
    buf: Box<dyn WritableStorage>,
}

impl fmt::Debug for TensorMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorMut").field("meta", &self.meta).field("nbytes", &self.as_bytes().len()).finish()
    }
}

impl TensorMut {
    /// A zero-filled tensor of `meta` (which must be contiguous and on the CPU).
    pub fn zeros(meta: TensorMeta) -> Result<Self, MetaError> {
        let len = meta.byte_span()?;
        let len = usize::try_from(len).map_err(|_| MetaError::Overflow)?;
        let meta = TensorMeta { strides: None, device: Device::Cpu, ..meta };
        Ok(TensorMut { meta, buf: Box::new(AlignedBuf::zeroed(len)) })
    }

    /// A tensor of `meta` (contiguous, CPU) over `buf`, which must hold exactly its bytes.
    pub fn from_storage(meta: TensorMeta, buf: Box<dyn WritableStorage>) -> Result<Self, MetaError> {
        let meta = TensorMeta { strides: None, device: Device::Cpu, ..meta };
        meta.validate(buf.bytes().len() as u64)?;
        Ok(TensorMut { meta, buf })
    }

    /// The metadata.
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.buf.bytes_mut()
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.bytes()
    }

    /// A typed writable view.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], ViewError> {
        if self.meta.dtype != T::DTYPE {
            return Err(ViewError::DType { requested: T::DTYPE, actual: self.meta.dtype });
        }
        bytemuck::try_cast_slice_mut(self.buf.bytes_mut())
            .map_err(|_| ViewError::Misaligned { align: std::mem::align_of::<T>() })
    }

    /// Freezes into an immutable [`Tensor`] (no copy).
    pub fn freeze(self) -> Tensor {
        Tensor { meta: self.meta, storage: Storage::Host(self.buf.freeze()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_views() {
        let t = Tensor::from_slice(vec![2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert!(matches!(t.as_slice::<i32>(), Err(ViewError::DType { .. })));
        assert_eq!(t.as_bytes().as_ptr() as usize % ALIGN, 0);
        // A misaligned slice of the same bytes.
        let b = t.bytes().slice(1..5);
        let odd = Tensor::new(TensorMeta::new(DType::F32, vec![1]), b).unwrap();
        assert_eq!(odd.as_slice::<f32>(), Err(ViewError::Misaligned { align: 4 }));
        assert!(odd.to_aligned().as_slice::<f32>().is_ok());
    }

    #[test]
    fn mutable_fill() {
        let mut m = TensorMut::zeros(TensorMeta::new(DType::I64, vec![3])).unwrap();
        m.as_mut_slice::<i64>().unwrap().copy_from_slice(&[-1, 0, i64::MAX]);
        let t = m.freeze();
        assert_eq!(t.as_slice::<i64>().unwrap(), &[-1, 0, i64::MAX]);
        assert!(Tensor::new(TensorMeta::new(DType::U8, vec![3]), Bytes::from_static(b"ab")).is_err());
    }
}
