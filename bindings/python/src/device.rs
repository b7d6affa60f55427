//! Device (CUDA) tensors across the Python boundary, over the cuda-ipc channel, without a
//! host copy.
//!
//! - [`DeviceTensor`]: a device tensor Python holds. Received ones are leases on the
//!   peer's memory, mapped into this process by CUDA IPC (the mapping stays open while the
//!   object, or anything made from it, lives); ones from `alloc_device` are in the pipe's
//!   exportable pool (sent without a copy). Both expose `__cuda_array_interface__` (v3) and
//!   `__dlpack__` / `__dlpack_device__`, so torch, CuPy and numba view them without a copy.
//! - `DeviceTensor.wrap`: another library's device memory (a CUDA torch tensor, a CuPy
//!   array), held by its Python object until sent; the channel copies it once into its pool,
//!   on the device.
//! - `check_channels`: a device tensor only travels on a pipe that negotiated a channel
//!   for its device; the error says why there is none, in the caller's words.
//!
//! Streams: ferry orders its work on the legacy default stream of each device's primary
//! context (see `ferry_cuda_ipc`): a received tensor is ready for work on that stream and
//! on every blocking stream; `__cuda_array_interface__` says so with `"stream": 1`.

use std::sync::Arc;

use ferry_core::{DType, Device, DeviceBuffer, DeviceKind, PipeInfo, Tensor, TensorMeta};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::tensors::{TensorRef, parse_dtype, typestr};

/// `DLDeviceType` of CUDA memory.
const KDL_CUDA: i32 = 2;

/// `ferry.errors.DeviceTensorError(message)`.
pub(crate) fn device_error(py: Python<'_>, message: String) -> PyErr {
    crate::client::errors::make_error(py, "DeviceTensorError", (message,))
}

/// Device memory owned by a Python object (a torch tensor, a CuPy array), which is held
/// while the buffer lives.
struct ForeignBuffer {
    _owner: Py<PyAny>,
    ptr: u64,
    len: usize,
    dev: u32,
}

impl DeviceBuffer for ForeignBuffer {
    fn device(&self) -> Device {
        Device::Cuda(self.dev)
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Where a [`DeviceTensor`] came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Received from the peer: a lease on its memory (read-only by contract).
    Received,
    /// From `alloc_device`: this side's pool, to fill and send.
    Allocated,
    /// Another library's memory (`DeviceTensor.wrap`).
    Wrapped,
}

/// A CUDA tensor: received (a mapping of the peer's memory), allocated in a pipe's pool,
/// or wrapping another library's memory to send.
#[pyclass(frozen, weakref, module = "ferry._native")]
pub struct DeviceTensor {
    pub(crate) tensor: Tensor,
    origin: Origin,
}

impl DeviceTensor {
    /// A received tensor.
    pub fn from_peer(tensor: Tensor) -> DeviceTensor {
        DeviceTensor { tensor, origin: Origin::Received }
    }

    /// A tensor from `alloc_device`.
    pub fn allocated(tensor: Tensor) -> DeviceTensor {
        DeviceTensor { tensor, origin: Origin::Allocated }
    }

    fn index(&self) -> u32 {
        match self.tensor.device() {
            Device::Cuda(n) => n,
            _ => 0,
        }
    }

    fn ptr(&self) -> u64 {
        self.tensor.device_buffer().map_or(0, |b| b.device_ptr())
    }

    /// Refuses to hand out the memory of a tensor whose pipe has closed.
    fn usable(&self) -> PyResult<()> {
        if ferry::ferry_cuda_ipc::is_orphaned(&self.tensor) {
            return Err(PyBufferError::new_err(
                "this device tensor came over a pipe that has closed (the peer may be gone): its memory is still \
                 mapped, but its contents are no longer guaranteed, so ferry no longer hands it out; copy what you \
                 need before the pipe closes",
            ));
        }
        Ok(())
    }
}

/// `(DLDataTypeCode, bits)` of a dtype. The float8 types go as `uint8` (their bits): the
/// legacy DLPack capsule has no code for them (`ferry.DeviceTensor.dtype` names them).
fn dl_dtype(d: DType) -> (u8, u8) {
    let bits = (d.itemsize() * 8) as u8;
    let code = match d {
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::F8E4M3Fn | DType::F8E5M2 => 1,
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::Bf16 => 4,
        DType::C64 | DType::C128 => 5,
        DType::Bool => 6,
    };
    (code, bits)
}

#[pymethods]
impl DeviceTensor {
    /// A device tensor over memory `owner` holds (`ptr` on `cuda:device`, `shape`,
    /// ferry `dtype`, `strides` in elements or `None` for row-major), to send: `owner`
    /// is kept until it is sent. `DeviceTensorError` for a null pointer or strides that
    /// are negative.
    #[staticmethod]
    #[pyo3(signature = (owner, ptr, shape, dtype, device, strides=None))]
    fn wrap(
        py: Python<'_>,
        owner: Py<PyAny>,
        ptr: u64,
        shape: Vec<u64>,
        dtype: &str,
        device: u32,
        strides: Option<Vec<i64>>,
    ) -> PyResult<DeviceTensor> {
        let mut meta = TensorMeta::new(parse_dtype(dtype)?, shape).with_device(Device::Cuda(device));
        if let Some(s) = strides {
            if s.iter().any(|&x| x < 0) {
                return Err(device_error(
                    py,
                    format!("strides {s:?}: ferry sends no negative strides; make the tensor contiguous first"),
                ));
            }
            meta = meta.with_strides(s);
        }
        let len = meta.byte_span().map_err(|e| device_error(py, format!("shape {:?}: {e}", meta.shape)))?;
        let len = usize::try_from(len).map_err(|_| device_error(py, format!("{len} bytes do not fit here")))?;
        if ptr == 0 && len > 0 {
            return Err(device_error(py, "a device tensor at address 0".into()));
        }
        let buf = ForeignBuffer { _owner: owner, ptr, len, dev: device };
        let tensor = Tensor::from_device(meta, Arc::new(buf)).map_err(|e| device_error(py, e.to_string()))?;
        Ok(DeviceTensor { tensor, origin: Origin::Wrapped })
    }

    /// The dtype's name (`"f32"`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.tensor.dtype().name()
    }

    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.tensor.shape().to_vec()
    }

    /// Strides in elements, or `None` (row-major).
    #[getter]
    fn strides(&self) -> Option<Vec<i64>> {
        self.tensor.meta().strides.clone()
    }

    /// Where the bytes are (`"cuda:0"`).
    #[getter]
    fn device(&self) -> String {
        self.tensor.device().to_string()
    }

    /// The CUDA device's ordinal in this process.
    #[getter]
    fn device_index(&self) -> u32 {
        self.index()
    }

    /// Bytes the tensor spans.
    #[getter]
    fn nbytes(&self) -> usize {
        self.tensor.nbytes()
    }

    /// The device address of the first byte (in this process's address space).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.ptr()
    }

    /// True for a tensor received from the peer (a mapping of its memory: read it, do not
    /// write it).
    #[getter]
    fn received(&self) -> bool {
        self.origin == Origin::Received
    }

    /// True once the pipe a received tensor came from has closed: its memory stays mapped
    /// while this object lives, but its contents are no longer guaranteed.
    #[getter]
    fn orphaned(&self) -> bool {
        ferry::ferry_cuda_ipc::is_orphaned(&self.tensor)
    }

    /// The CUDA Array Interface (version 3), for `torch.as_tensor(x, device="cuda")`,
    /// `cupy.asarray(x)`, numba: no copy. `stream` is 1 (the legacy default stream: the
    /// bytes are ready for work on it and on every blocking stream). The read-only flag is
    /// always false (torch refuses read-only memory), but a received tensor is the peer's
    /// memory: do not write to it.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.usable()?;
        let meta = self.tensor.meta();
        let d = PyDict::new(py);
        d.set_item(intern!(py, "version"), 3)?;
        d.set_item(intern!(py, "shape"), PyTuple::new(py, meta.shape.iter().copied())?)?;
        d.set_item(intern!(py, "typestr"), typestr(meta.dtype))?;
        d.set_item(intern!(py, "data"), (self.ptr(), false))?;
        let strides = match &meta.strides {
            Some(s) => {
                let item = meta.dtype.itemsize() as i64;
                Some(PyTuple::new(py, s.iter().map(|e| e * item))?)
            }
            None => None,
        };
        d.set_item(intern!(py, "strides"), strides)?;
        d.set_item(intern!(py, "stream"), 1)?;
        Ok(d)
    }

    /// `(2, device_index)`: CUDA.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.index() as i32)
    }

    /// A DLPack capsule (legacy, unversioned) over the memory, for `torch.from_dlpack(x)`:
    /// no copy; the memory stays mapped until the consumer lets go. `stream` is accepted
    /// and not acted on (the bytes are ready on the legacy default stream, hence on
    /// blocking streams; synchronise a non-blocking one yourself). `copy=True` and a
    /// `dl_device` other than this tensor's are refused (`BufferError`).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        self.usable()?;
        let here = self.__dlpack_device__();
        if let Some(d) = dl_device
            && d != here
        {
            return Err(PyBufferError::new_err(format!(
                "dl_device={d:?}: this tensor is on {here:?} ({}); ferry does not move it",
                self.tensor.device()
            )));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "copy=True: ferry lends its device memory as it is; import it without a copy, then copy it",
            ));
        }
        let meta = self.tensor.meta();
        let shape = meta.shape.iter().map(|&n| i64::try_from(n).unwrap_or(i64::MAX)).collect();
        crate::sys::capsule(
            py,
            crate::sys::Export {
                data: self.ptr(),
                device: here,
                dtype: dl_dtype(meta.dtype),
                shape,
                strides: meta.strides.clone(),
                keep: self.tensor.clone(),
            },
        )
    }

    fn __repr__(&self) -> String {
        let what = match self.origin {
            Origin::Received => "received",
            Origin::Allocated => "allocated",
            Origin::Wrapped => "wrapped",
        };
        format!("DeviceTensor({} {:?} on {}, {what})", self.tensor.dtype(), self.tensor.shape(), self.tensor.device())
    }
}

/// A received tensor as Python sees it: a [`TensorRef`] (host) or a [`DeviceTensor`].
pub(crate) fn received(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
    if t.device() == Device::Cpu {
        Ok(Py::new(py, TensorRef::new(t))?.into_any())
    } else {
        Ok(Py::new(py, DeviceTensor::from_peer(t))?.into_any())
    }
}

/// Why a pipe negotiated no cuda-ipc channel, as far as this side can tell: this process's
/// channel is not viable (the reason), or the peer did not offer or accept it.
pub(crate) fn why_no_channel() -> String {
    use ferry_core::Channel;
    match ferry::ferry_cuda_ipc::CudaIpcChannel::new().viability() {
        Err(e) => format!("cuda-ipc is not usable in this process: {e}"),
        Ok(()) => "cuda-ipc needs both ends on one Linux host, in different processes, sharing a GPU, both with \
                   the CUDA driver (the peer did not offer or accept it)"
            .to_owned(),
    }
}

/// Checks that every device tensor of `tensors` can travel on a pipe with `info`: the error
/// (`what`: `"params"`, `"the message"`, ...) names the tensor's device, the channel the pipe
/// lacks and why, and what to do.
pub(crate) fn check_channels(py: Python<'_>, info: &PipeInfo, tensors: &[Tensor], what: &str) -> PyResult<()> {
    for t in tensors {
        let kind = t.device().kind();
        if kind == DeviceKind::Cpu || info.channels.contains_key(&kind) {
            continue;
        }
        let why = why_no_channel();
        return Err(device_error(
            py,
            format!(
                "{what} hold a {} tensor, but this connection negotiated no channel for CUDA tensors ({why}); \
                 ferry never copies device tensors to the host on its own: copy it yourself (`.cpu()`) to send \
                 it over this connection",
                t.device()
            ),
        ));
    }
    Ok(())
}

/// A device dtype check for `alloc_device`: the meta of `shape`, `dtype` on `cuda:device`.
pub(crate) fn device_meta(shape: Vec<u64>, dtype: &str, device: u32) -> PyResult<TensorMeta> {
    let meta = TensorMeta::new(parse_dtype(dtype)?, shape).with_device(Device::Cuda(device));
    meta.byte_span().map_err(|e| PyValueError::new_err(format!("shape {:?}: {e}", meta.shape)))?;
    Ok(meta)
}

/// An in-memory CUDA driver for the tests (feature `__testing`, never in a user's wheel):
/// simulated processes of one simulated GPU, in this one real process.
#[cfg(feature = "__testing")]
pub mod fake {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use ferry::ferry_cuda_ipc::Driver;
    use ferry_cuda_ipc::fake::{self, FakeDriver};
    use pyo3::exceptions::PyRuntimeError;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;

    /// Simulated pids: far above any real pid (Linux's `pid_max` is at most 2^22).
    static NEXT_PID: AtomicU32 = AtomicU32::new(3_000_000_000);

    fn driver_err(e: ferry_cuda_ipc::DriverError) -> PyErr {
        PyRuntimeError::new_err(e.to_string())
    }

    /// A simulated machine with GPUs.
    #[pyclass(frozen, module = "ferry._native", name = "_FakeGpu")]
    pub struct FakeGpu {
        gpu: Arc<fake::FakeGpu>,
    }

    #[pymethods]
    impl FakeGpu {
        #[new]
        #[pyo3(signature = (devices=1))]
        fn new(devices: usize) -> FakeGpu {
            FakeGpu { gpu: fake::FakeGpu::new(devices) }
        }

        /// A simulated process seeing every device.
        fn process(&self) -> FakeProcess {
            FakeProcess { d: self.gpu.process(NEXT_PID.fetch_add(1, Ordering::Relaxed)) }
        }

        /// A simulated process whose driver does not work (`reason`).
        fn broken_process(&self, reason: &str) -> FakeProcess {
            FakeProcess { d: self.gpu.broken_process(NEXT_PID.fetch_add(1, Ordering::Relaxed), reason) }
        }

        /// Physical allocations alive (owned or mapped by a process).
        #[getter]
        fn live_memory(&self) -> usize {
            self.gpu.live_memory()
        }
    }

    /// One simulated process: its driver, its address space.
    #[pyclass(frozen, module = "ferry._native", name = "_FakeProcess")]
    pub struct FakeProcess {
        d: Arc<FakeDriver>,
    }

    #[pymethods]
    impl FakeProcess {
        /// Its simulated pid.
        #[getter]
        fn pid(&self) -> u32 {
            self.d.process_id()
        }

        /// Makes the channels built from now on (pipes, clients, servers) use this
        /// process's driver.
        fn activate(&self) {
            fake::set_active(Some(self.d.clone()));
        }

        /// Device memory of `nbytes` on `cuda:device` (an address of this process).
        #[pyo3(signature = (nbytes, device=0))]
        fn alloc(&self, nbytes: u64, device: u32) -> PyResult<u64> {
            self.d.alloc(device, nbytes).map_err(driver_err)
        }

        /// Frees what `alloc` gave.
        #[pyo3(signature = (ptr, device=0))]
        fn free(&self, ptr: u64, device: u32) -> PyResult<()> {
            self.d.free(device, ptr).map_err(driver_err)
        }

        /// Writes `data` at `ptr`.
        #[pyo3(signature = (ptr, data, device=0))]
        fn write(&self, ptr: u64, data: &[u8], device: u32) -> PyResult<()> {
            self.d.copy_htod(device, ptr, data).map_err(driver_err)
        }

        /// Reads `n` bytes at `ptr`.
        #[pyo3(signature = (ptr, n, device=0))]
        fn read<'py>(&self, py: Python<'py>, ptr: u64, n: usize, device: u32) -> PyResult<Bound<'py, PyBytes>> {
            let mut out = vec![0u8; n];
            self.d.copy_dtoh(device, &mut out, ptr).map_err(driver_err)?;
            Ok(PyBytes::new(py, &out))
        }

        /// Other processes' allocations this one has mapped (IPC), each counted once.
        #[getter]
        fn open_imports(&self) -> usize {
            self.d.open_imports()
        }

        /// Its own allocations not freed.
        #[getter]
        fn live_allocs(&self) -> usize {
            self.d.live_allocs()
        }

        /// Events created or opened, not destroyed.
        #[getter]
        fn live_events(&self) -> usize {
            self.d.live_events()
        }

        /// How many times driver operation `op` was called (`"cuMemcpyDtoDAsync"`).
        fn calls(&self, op: &str) -> u64 {
            const OPS: [&str; 6] = [
                "cuMemcpyDtoDAsync",
                "cuMemcpyHtoD",
                "cuMemcpyDtoH",
                "cuIpcOpenMemHandle",
                "cuIpcCloseMemHandle",
                "cuMemAlloc",
            ];
            OPS.iter().find(|o| **o == op).map_or(0, |o| self.d.calls(o))
        }
    }

    /// Channels built from now on use the real driver again.
    #[pyfunction]
    pub fn _fake_cuda_deactivate() {
        fake::set_active(None);
    }
}
