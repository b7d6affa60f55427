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
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple, PyType};

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

/// numpy's objects that the hot paths use, looked up once.
struct Numpy {
    ndarray: Py<PyType>,
    asarray: Py<PyAny>,
    /// The numpy dtype an array made from a tensor of each of [`DType::ALL`] has (numpy's
    /// own dtypes are singletons, compared by identity); `None` for the dtypes numpy lacks
    /// (bf16, the float8s), whose arrays the Python side views as another type.
    dtypes: Vec<Option<Py<PyAny>>>,
}

fn numpy(py: Python<'_>) -> PyResult<&Numpy> {
    static NUMPY: PyOnceLock<Numpy> = PyOnceLock::new();
    NUMPY.get_or_try_init(py, || {
        let np = py.import("numpy")?;
        let dtype = np.getattr("dtype")?;
        let dtypes = DType::ALL
            .iter()
            .map(|d| match d {
                DType::Bf16 | DType::F8E4M3Fn | DType::F8E5M2 => Ok(None),
                d => Ok(Some(dtype.call1((typestr(*d),))?.unbind())),
            })
            .collect::<PyResult<_>>()?;
        Ok(Numpy {
            ndarray: np.getattr("ndarray")?.cast_into()?.unbind(),
            asarray: np.getattr("asarray")?.unbind(),
            dtypes,
        })
    })
}

/// The numpy dtype of `d` when numpy has it as its own (see [`Numpy::dtypes`]).
fn numpy_dtype(np: &Numpy, d: DType) -> Option<&Py<PyAny>> {
    DType::ALL.iter().position(|x| *x == d).and_then(|i| np.dtypes[i].as_ref())
}

/// A read-only numpy array viewing `r` whole (no copy), made here when numpy has the
/// tensor's dtype; `None` for the others (the caller's Python hook views them).
///
/// Made through numpy's C API (`sys::array::readonly_view`, about 0.2 µs), or for
/// what that does not view (an empty tensor) by `np.asarray` through
/// `__array_interface__` (1.4 µs), with the same result: base `r`, read-only.
pub fn numpy_view<'py>(r: &Bound<'py, TensorRef>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = r.py();
    let np = numpy(py)?;
    let Some(dtype) = numpy_dtype(np, r.get().tensor.dtype()) else { return Ok(None) };
    if r.get().tensor.host_bytes().is_none() {
        return Ok(None);
    }
    if let Some(a) = crate::sys::array::readonly_view(np.ndarray.bind(py), dtype.bind(py), r) {
        return Ok(Some(a));
    }
    np.asarray.bind(py).call1((r,)).map(Some)
}

/// What a numpy array `x` views, when it is a plain `numpy.ndarray` viewing the whole of a
/// native tensor (its base), with that tensor's dtype and shape, C-contiguous, and (for a
/// received tensor) read-only: then the tensor itself goes out, with no copy. `None` for
/// anything else (the caller copies, or asks the Python side).
///
/// numpy sets a view's base to the object that owns the memory, so any view of a tensor's
/// array has the tensor as its base; a C-contiguous view of as many bytes as the tensor
/// has, inside its memory, starts at its first byte: it is the whole.
pub enum Whole<'py> {
    /// A received tensor, viewed whole and read-only.
    Received(Bound<'py, TensorRef>),
    /// A tensor allocated to send, viewed whole.
    Allocated(Bound<'py, OutTensor>),
}

/// See [`Whole`].
pub fn whole_view<'py>(x: &Bound<'py, PyAny>) -> PyResult<Option<Whole<'py>>> {
    use numpy::{PyUntypedArray, PyUntypedArrayMethods};
    let py = x.py();
    let np = numpy(py)?;
    if !x.get_type().is(np.ndarray.bind(py)) {
        return Ok(None);
    }
    let Ok(a) = x.cast::<PyUntypedArray>() else { return Ok(None) };
    let (Some(base), writeable) = crate::sys::array::base_and_writeable(a) else { return Ok(None) };
    let (meta, nbytes, found) = if let Ok(r) = base.cast::<TensorRef>() {
        if writeable {
            return Ok(None);
        }
        let t = &r.get().tensor;
        (t.meta().clone(), t.host_bytes().map(<[u8]>::len), Whole::Received(r.clone()))
    } else if let Ok(o) = base.cast::<OutTensor>() {
        let o2 = o.get();
        (o2.meta.clone(), Some(o2.nbytes), Whole::Allocated(o.clone()))
    } else {
        return Ok(None);
    };
    let Some(nbytes) = nbytes else { return Ok(None) };
    let Some(dtype) = numpy_dtype(np, meta.dtype) else { return Ok(None) };
    if nbytes == 0 || !meta.is_contiguous() || meta.byte_span().ok() != Some(nbytes as u64) {
        return Ok(None);
    }
    if !a.dtype().is(dtype.bind(py)) || !a.is_c_contiguous() {
        return Ok(None);
    }
    let shape = a.shape();
    if shape.len() != meta.shape.len() || shape.iter().zip(&meta.shape).any(|(&d, &want)| d as u64 != want) {
        return Ok(None);
    }
    Ok(Some(found))
}

/// Arrays smaller than this are sent as a copy of their bytes made here ([`small_copy`]):
/// the shm channel sends tensors under 16 KiB inline (`ShmOptions::inline_below`), where a
/// copy costs less than a lease of shared memory.
pub const SMALL_COPY_BELOW: usize = 16 << 10;

/// A copy of a small plain `numpy.ndarray` (a dtype numpy has as its own, in this
/// machine's byte order; fewer than [`SMALL_COPY_BELOW`] bytes, more than none) as a
/// tensor, in row-major order whatever its strides; `None` for anything else.
pub fn small_copy(x: &Bound<'_, PyAny>) -> PyResult<Option<Tensor>> {
    let py = x.py();
    let np = numpy(py)?;
    if !x.get_type().is(np.ndarray.bind(py)) {
        return Ok(None);
    }
    let dt = x.getattr(intern!(py, "dtype"))?;
    let Some(i) = np.dtypes.iter().position(|d| d.as_ref().is_some_and(|d| d.bind(py).is(&dt))) else {
        return Ok(None);
    };
    let nbytes: usize = x.getattr(intern!(py, "nbytes"))?.extract()?;
    if nbytes == 0 || nbytes >= SMALL_COPY_BELOW {
        return Ok(None);
    }
    let shape: Vec<u64> = x.getattr(intern!(py, "shape"))?.extract()?;
    let bytes = x.call_method0(intern!(py, "tobytes"))?;
    let bytes = bytes.cast::<PyBytes>()?;
    let meta = TensorMeta::new(DType::ALL[i], shape);
    Tensor::new(meta, bytes::Bytes::copy_from_slice(bytes.as_bytes()))
        .map(Some)
        .map_err(|e| PyValueError::new_err(format!("an array of {nbytes} bytes: {e}")))
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

    /// A read-only numpy array viewing this tensor (no copy, this object its base), as
    /// `np.asarray(self)` makes it (a dtype numpy lacks as the unsigned integer of its
    /// size), made through numpy's C API where it can ([`numpy_view`]: 0.2 µs against
    /// 1.4 µs).
    fn _numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(a) = numpy_view(slf)? {
            return Ok(a);
        }
        let py = slf.py();
        numpy(py)?.asarray.bind(py).call1((slf,))
    }

    /// numpy's array interface (host tensors only): read-only, no copy.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Some(bytes) = self.tensor.host_bytes() else {
            return Err(PyValueError::new_err(format!(
                "a {} tensor has no host bytes (device tensors are ferry.DeviceTensor objects)",
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
    /// The pipe whose memory it is ([`OutTensor::owned_by`]; 0: none said).
    owner: u64,
}

impl OutTensor {
    /// Wraps a freshly allocated tensor.
    pub fn new(mut t: TensorMut) -> OutTensor {
        let meta = t.meta().clone();
        let bytes = t.as_bytes_mut();
        let (ptr, nbytes) = (bytes.as_mut_ptr() as usize, bytes.len());
        OutTensor { state: Mutex::new(Out::Open(t)), meta, ptr, nbytes, owner: 0 }
    }

    /// Marks it as allocated by the pipe numbered `owner` (so that only that pipe sends an
    /// array over it without a copy).
    pub fn owned_by(mut self, owner: u64) -> OutTensor {
        self.owner = owner;
        self
    }

    /// The pipe it was allocated by ([`OutTensor::owned_by`]; 0: none said).
    pub fn owner(&self) -> u64 {
        self.owner
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
