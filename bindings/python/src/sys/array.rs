//! numpy arrays over memory that a Python object owns, through numpy's C API: an array of
//! a received tensor's bytes whose base is the tensor's `TensorRef` (so the lease lives as
//! long as any view of it), read-only.
//!
//! `np.asarray(obj)` does the same through `obj.__array_interface__`: numpy then asks the
//! object for several protocols, builds and parses a dict and a type string, 1.4 µs per
//! array on this 2-vCPU VM, twice per round trip of a pipe (each side's `recv`). Here it
//! is one `PyArray_NewFromDescr` with a dtype looked up once.

use std::ffi::{c_int, c_void};

use numpy::npyffi::{NPY_ARRAY_WRITEABLE, PY_ARRAY_API, PyArray_Descr, PyArrayObject, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::tensors::TensorRef;

/// A read-only `numpy.ndarray` viewing the whole of the received tensor `owner` (its base,
/// so its memory lives as long as the array), with dtype `dtype` (a `numpy.dtype` of the
/// tensor's item size); `ndarray` is the type `numpy.ndarray`. `None` when this cannot
/// view it: no host bytes, none at all, a dtype of another item size, a shape or strides
/// reaching past its bytes or beyond this machine's range (the caller then asks numpy's
/// own protocols).
pub(crate) fn readonly_view<'py>(
    ndarray: &Bound<'py, PyType>,
    dtype: &Bound<'py, PyAny>,
    owner: &Bound<'py, TensorRef>,
) -> Option<Bound<'py, PyAny>> {
    let py = owner.py();
    let tensor = &owner.get().tensor;
    let meta = tensor.meta();
    let bytes = tensor.host_bytes()?;
    let descr = dtype.cast::<PyArrayDescr>().ok()?;
    // Checked here, not assumed: the span numpy may read lies inside the tensor's bytes.
    let span = meta.byte_span().ok()?;
    if bytes.is_empty() || span == 0 || span > bytes.len() as u64 || descr.itemsize() != meta.dtype.itemsize() {
        return None;
    }
    let item = i64::try_from(meta.dtype.itemsize()).ok()?;
    let mut shape: Vec<npy_intp> = meta.shape.iter().map(|&d| npy_intp::try_from(d).ok()).collect::<Option<_>>()?;
    let mut strides: Option<Vec<npy_intp>> = match &meta.strides {
        Some(s) => Some(
            s.iter().map(|&e| e.checked_mul(item).and_then(|b| npy_intp::try_from(b).ok())).collect::<Option<_>>()?,
        ),
        None => None,
    };
    let nd = c_int::try_from(shape.len()).ok()?;
    let data = bytes.as_ptr();
    // `PyArray_NewFromDescr` steals a reference to the dtype, `PyArray_SetBaseObject` one
    // to the base: both are handed new references.
    let descr = descr.clone().into_ptr().cast::<PyArray_Descr>();
    let strides_ptr = strides.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
    // SAFETY: numpy's API table is imported by `PY_ARRAY_API` (numpy is importable: the
    // caller found `ndarray` and `dtype` in it). `ndarray` is a type object and `descr` a
    // `numpy.dtype` (checked above: a `PyArray_Descr`) whose new reference the call takes;
    // `shape` and `strides` hold `nd` entries each and live across the call; `data` is the
    // non-empty (so not null) host bytes of the tensor `owner` holds, frozen, for as long
    // as `owner` lives, and the array reads at most `span` bytes of them (checked above:
    // within them); numpy allocates nothing when `data` is given; flags 0 make the array
    // read-only (numpy works out its contiguity and alignment itself); no `obj` (the base
    // is set below, before anyone can see the array).
    let array = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            ndarray.as_type_ptr(),
            descr,
            nd,
            shape.as_mut_ptr(),
            strides_ptr,
            data.cast_mut().cast::<c_void>(),
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `array` is a new reference returned by numpy (null on error, with the Python
    // error set, which `from_owned_ptr_or_err` takes).
    let array = unsafe { Bound::from_owned_ptr_or_err(py, array) }.ok()?;
    // SAFETY: `array` is a `numpy.ndarray` just made, with no base yet; the call takes the
    // new reference to `owner` (on failure too, as numpy documents), and returns -1 with
    // the Python error set on failure.
    let set = unsafe {
        PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast::<PyArrayObject>(), owner.clone().into_ptr())
    };
    if set != 0 {
        // (The error numpy set is dropped with the array: the caller's fallback views it.)
        drop(PyErr::take(py));
        return None;
    }
    Some(array)
}

/// What [`crate::tensors::whole_view`] asks of an array besides its shape and dtype (which
/// numpy's safe accessors give): its base (the object owning its memory, if any) and
/// whether it is writable, read from the array's struct (no attribute lookups: `x.base`
/// and `x.flags.writeable` cost about 0.3 µs, on every `send` of an array).
pub(crate) fn base_and_writeable<'py>(x: &Bound<'py, PyUntypedArray>) -> (Option<Bound<'py, PyAny>>, bool) {
    let a = x.as_array_ptr();
    // SAFETY: `x` is a numpy array (its type was checked when it was cast), so `a` points
    // at its `PyArrayObject`, alive while `x` is; `base` is a borrowed reference or null,
    // taken as a new reference here before anything else runs.
    let (base, flags) = unsafe { ((*a).fields.base, (*a).fields.flags) };
    // SAFETY: as above: a borrowed reference (or null) to a live object, under the GIL
    // (`x`'s token).
    let base = unsafe { Bound::from_borrowed_ptr_or_opt(x.py(), base) };
    (base, flags & NPY_ARRAY_WRITEABLE != 0)
}
