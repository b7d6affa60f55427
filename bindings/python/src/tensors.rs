//! Tensors across the Python boundary, without copies.
//!
//! - [`TensorRef`]: a received tensor. It holds the Rust [`Tensor`] (for shm, the lease on
//!   the peer's memory) and exposes its bytes read-only through `__array_interface__`;
//!   numpy keeps the `TensorRef` as the array's base, so the lease is released when the
//!   last array (or torch tensor made from one) viewing it dies.
//! - [`OutTensor`]: a writable tensor allocated in the connection's own memory (the shm
//!   pool: the answer then travels without a copy). Python fills it through a writable
//!   `__array_interface__` and returns it; Rust then takes it ([`OutTensor::take`]) and keeps
//!   the frozen tensor alive as long as the Python object, so a view that outlives the call
//!   still points at valid memory.
//!
//! Pointers are handed to numpy as integers, which needs no `unsafe` here; numpy reads and
//! writes them while it holds the owning object.

use std::sync::Mutex;

use ferry_core::{DType, Device, Tensor, TensorMeta, TensorMut};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// numpy's type string for a dtype. Types numpy lacks (bf16, the float8s) are given as the
/// unsigned integer of their size; the Python side views them as their real type (ml_dtypes
/// or torch).
pub fn typestr(d: DType) -> &'static str {
    match d {
        DType::Bool => "|b1",
        DType::U8 | DType::F8E4M3Fn | DType::F8E5M2 => "|u1",
        DType::I8 => "|i1",
        DType::U16 | DType::Bf16 => "<u2",
        DType::I16 => "<i2",
        DType::U32 => "<u4",
        DType::I32 => "<i4",
        DType::U64 => "<u8",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
    }
}

/// `(name, numpy typestr, itemsize)` of every dtype ferry moves.
#[pyfunction]
pub fn dtypes() -> Vec<(&'static str, &'static str, usize)> {
    DType::ALL.iter().map(|d| (d.name(), typestr(*d), d.itemsize())).collect()
}

/// Parses a dtype name (`"f32"`), the error listing the names.
pub fn parse_dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(|_| {
        let all: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        PyValueError::new_err(format!("unknown dtype {name:?}: ferry moves {}", all.join(", ")))
    })
}

/// The `__array_interface__` dict of `meta`'s bytes at `ptr`.
pub(crate) fn array_interface<'py>(
    py: Python<'py>,
    meta: &TensorMeta,
    ptr: usize,
    readonly: bool,
) -> PyResult<Bound<'py, PyDict>> {
    // Keys interned once: numpy asks for this dict for every array made from a tensor.
    let d = PyDict::new(py);
    d.set_item(intern!(py, "version"), 3)?;
    d.set_item(intern!(py, "shape"), PyTuple::new(py, meta.shape.iter().copied())?)?;
    d.set_item(intern!(py, "typestr"), typestr(meta.dtype))?;
    d.set_item(intern!(py, "data"), (ptr, readonly))?;
    let strides = match &meta.strides {
        Some(s) => {
            let item = meta.dtype.itemsize() as i64;
            Some(PyTuple::new(py, s.iter().map(|e| e * item))?)
        }
        None => None,
    };
    d.set_item(intern!(py, "strides"), strides)?;
    Ok(d)
}

/// A received tensor: read-only, zero-copy, holding its memory until the last view dies.
#[pyclass(frozen, module = "ferry._native")]
pub struct TensorRef {
    pub(crate) tensor: Tensor,
    /// Handed to code that may write into it (torch): its pages are discarded on drop.
    writable: std::sync::atomic::AtomicBool,
}

impl TensorRef {
    /// Wraps a tensor.
    pub fn new(tensor: Tensor) -> TensorRef {
        TensorRef { tensor, writable: std::sync::atomic::AtomicBool::new(false) }
    }
}

impl Drop for TensorRef {
    fn drop(&mut self) {
        // Pages written through a torch view became private copies of the shared memory;
        // dropped here, before the lease goes back, so that the next tensor the peer puts
        // there is seen as it is.
        if *self.writable.get_mut()
            && let Some(b) = self.tensor.host_bytes()
        {
            ferry::ferry_shm::discard_private_pages(b.as_ptr() as usize, b.len());
        }
    }
}

#[pymethods]
impl TensorRef {
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

    /// Where the bytes live (`"cpu"`, `"cuda:0"`).
    #[getter]
    fn device(&self) -> String {
        self.tensor.device().to_string()
    }

    /// Bytes the tensor spans.
    #[getter]
    fn nbytes(&self) -> usize {
        self.tensor.nbytes()
    }

    /// The address of the first byte (host tensors; 0 for device ones): to recognise a
    /// result that is this tensor.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.tensor.host_bytes().map_or(0, |b| b.as_ptr() as usize)
    }

    /// Marks the tensor as handed to code that may write into it (torch has no read-only
    /// tensors): such writes stay in this process (the memory is mapped copy-on-write), and
    /// the written pages are dropped with the tensor, before its memory goes back to the peer.
    fn _mark_writable(&self) {
        self.writable.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// numpy's array interface (host tensors only): read-only, no copy.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Some(bytes) = self.tensor.host_bytes() else {
            return Err(PyValueError::new_err(format!(
                "a {} tensor has no host bytes: the Python server does not map device tensors yet",
                self.tensor.device()
            )));
        };
        array_interface(py, self.tensor.meta(), bytes.as_ptr() as usize, true)
    }

    fn __repr__(&self) -> String {
        format!("TensorRef({} {:?} on {})", self.tensor.dtype(), self.tensor.shape(), self.tensor.device())
    }
}

/// The state of an [`OutTensor`].
enum Out {
    /// Allocated, being filled.
    Open(TensorMut),
    /// Handed to Rust to send; kept so Python views stay valid.
    Sent(Tensor),
    /// Between the two, under the lock.
    Moving,
}

/// A result tensor being filled by Python: writable, in the connection's memory.
#[pyclass(frozen, module = "ferry._native")]
pub struct OutTensor {
    state: Mutex<Out>,
    meta: TensorMeta,
    ptr: usize,
    nbytes: usize,
}

impl OutTensor {
    /// Wraps a freshly allocated tensor.
    pub fn new(mut t: TensorMut) -> OutTensor {
        let meta = t.meta().clone();
        let bytes = t.as_bytes_mut();
        let (ptr, nbytes) = (bytes.as_mut_ptr() as usize, bytes.len());
        OutTensor { state: Mutex::new(Out::Open(t)), meta, ptr, nbytes }
    }

    /// The tensor to send. Its bytes stay valid while this object lives.
    pub fn take(&self) -> PyResult<Tensor> {
        let mut state = self.state.lock().map_err(|_| PyRuntimeError::new_err("an OutTensor's lock was poisoned"))?;
        let t = match std::mem::replace(&mut *state, Out::Moving) {
            Out::Open(t) => t.freeze(),
            Out::Sent(t) => t,
            Out::Moving => return Err(PyRuntimeError::new_err("an OutTensor was taken twice at once")),
        };
        *state = Out::Sent(t.clone());
        Ok(t)
    }
}

#[pymethods]
impl OutTensor {
    /// The dtype's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.meta.dtype.name()
    }

    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.meta.shape.clone()
    }

    /// Bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The address of the first byte (to recognise a result that is this tensor).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.ptr
    }

    /// numpy's array interface: writable, no copy.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, &self.meta, self.ptr, false)
    }

    fn __repr__(&self) -> String {
        format!("OutTensor({} {:?})", self.meta.dtype, self.meta.shape)
    }
}

/// A `TensorMeta` from Python's `(shape, dtype)`, CPU.
pub fn meta_of(shape: Vec<u64>, dtype: &str) -> PyResult<TensorMeta> {
    let meta = TensorMeta::new(parse_dtype(dtype)?, shape);
    meta.byte_span().map_err(|e| PyValueError::new_err(format!("shape {:?}: {e}", meta.shape)))?;
    debug_assert_eq!(meta.device, Device::Cpu);
    Ok(meta)
}
