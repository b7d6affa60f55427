//! [`CudaMemory`]: a device tier's memory on `cuda:N`, in the cuda-ipc channel's
//! exportable pool (so a tensor on the tier is lent to a cuda-ipc peer without a copy).

use std::sync::Arc;

use ferry_core::{DType, Device, DeviceBuffer, Storage, Tensor, TensorMeta};
use ferry_cuda_ipc::CudaIpcChannel;

use super::DeviceMemory;

/// `cuda:N`'s memory through a cuda-ipc channel: allocations in its pool
/// ([`CudaIpcChannel::alloc_device`]), copies by its driver.
pub struct CudaMemory {
    chan: CudaIpcChannel,
    device: Device,
}

thread_local! {
    /// The pool's allocation waits (for room, bounded by its `full_wait`) are async: the
    /// mover thread runs them on a runtime of its own, made on its first upload and dropped
    /// when the thread ends (never in an async context).
    static RT: Result<tokio::runtime::Runtime, String> = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("the device tier's runtime: {e}"));
}

impl std::fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMemory").field("device", &self.device).finish_non_exhaustive()
    }
}

impl CudaMemory {
    /// `cuda:{ordinal}` through `chan`; an error says why that device cannot be used (no
    /// driver, no such device).
    pub fn new(chan: CudaIpcChannel, ordinal: u32) -> Result<CudaMemory, String> {
        let devices = chan.devices().map_err(|e| e.to_string())?;
        if !devices.iter().any(|d| d.ordinal == ordinal) {
            let have: Vec<String> = devices.iter().map(|d| format!("cuda:{}", d.ordinal)).collect();
            return Err(format!("no device cuda:{ordinal} here (devices: {})", have.join(", ")));
        }
        Ok(CudaMemory { chan, device: Device::Cuda(ordinal) })
    }
}

/// (Called on the device tier's mover thread, outside any async runtime, as
/// [`DeviceMemory`] says: `upload` blocks on the pool there.)
impl DeviceMemory for CudaMemory {
    fn device(&self) -> Device {
        self.device
    }

    fn upload(&self, src: &[u8]) -> Result<Arc<dyn DeviceBuffer>, String> {
        let meta = TensorMeta::new(DType::U8, [src.len() as u64]).with_device(self.device);
        let alloc = self.chan.alloc_device(meta);
        let t = RT.with(|rt| match rt {
            Ok(rt) => rt.block_on(alloc).map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        })?;
        self.chan.copy_from_host(&t, src).map_err(|e| e.to_string())?;
        match t.storage() {
            Storage::Device(buf) => Ok(buf.clone()),
            _ => Err("the cuda-ipc pool gave host memory".into()),
        }
    }

    fn download(&self, buf: &Arc<dyn DeviceBuffer>) -> Result<Vec<u8>, String> {
        let meta = TensorMeta::new(DType::U8, [buf.len() as u64]).with_device(buf.device());
        let t = Tensor::from_device(meta, buf.clone()).map_err(|e| e.to_string())?;
        self.chan.copy_to_host(&t).map_err(|e| e.to_string())
    }
}
