//! The only unsafe code of the Python binding: DLPack capsules, for `__dlpack__` of
//! [`crate::device::DeviceTensor`] (here), and numpy arrays over received tensors through
//! numpy's C API ([`mod@array`]).
//!
//! A DLPack capsule is a `PyCapsule` named `"dltensor"` holding a `DLManagedTensor` (the
//! C structs of `dlpack.h`, v0.8 / legacy, unversioned). The consumer (torch, CuPy, JAX)
//! renames the capsule `"used_dltensor"` when it takes the tensor and calls its `deleter`
//! once it is done with the memory; a capsule dropped unconsumed still has its name, and
//! its destructor calls the deleter itself. Here the managed tensor is one heap block
//! (`Managed`) that owns a clone of the ferry [`Tensor`] (for a received tensor, the
//! lease on the peer's memory and its IPC mapping), so the memory stays mapped until the
//! consumer lets go, on whatever thread that happens (no Python object is held).
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod array;

use std::ffi::{CStr, c_void};

use ferry_core::Tensor;
use pyo3::ffi;
use pyo3::prelude::*;

/// The name of an unconsumed legacy DLPack capsule.
const NAME: &CStr = c"dltensor";

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// One exported tensor: the C struct first (so a pointer to it is a pointer to this), then
/// what its pointers point into and the tensor that keeps the memory alive.
#[repr(C)]
struct Managed {
    m: DlManagedTensor,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    _keep: Tensor,
}

/// What a capsule describes.
pub struct Export {
    /// Address of the first byte.
    pub data: u64,
    /// `DLDeviceType` (`2`: CUDA) and the device's ordinal.
    pub device: (i32, i32),
    /// `DLDataTypeCode` and bits per element (one lane).
    pub dtype: (u8, u8),
    /// Size of each dimension.
    pub shape: Vec<i64>,
    /// Strides in elements (`None`: contiguous row-major).
    pub strides: Option<Vec<i64>>,
    /// Kept alive until the consumer's deleter runs (or the capsule dies unconsumed).
    pub keep: Tensor,
}

/// The deleter the consumer calls: frees the block and drops the tensor it kept.
///
/// # Safety
/// `m` is null or a pointer [`capsule`] made, not yet deleted.
unsafe extern "C" fn deleter(m: *mut DlManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` came from `Box::into_raw` of a `Managed` whose first field (repr(C)) is
    // the `DlManagedTensor`, and DLPack calls the deleter once.
    drop(unsafe { Box::from_raw(m.cast::<Managed>()) });
}

/// The capsule's destructor: deletes the tensor unless a consumer took it (and renamed
/// the capsule).
///
/// # Safety
/// Called by Python with the GIL held, on a capsule [`capsule`] made.
unsafe extern "C" fn destructor(cap: *mut ffi::PyObject) {
    // SAFETY: `cap` is a live capsule (Python is destroying it); `IsValid` sets no error.
    if unsafe { ffi::PyCapsule_IsValid(cap, NAME.as_ptr()) } != 1 {
        return; // consumed: its deleter is the consumer's to call
    }
    // SAFETY: valid, and named `NAME` (checked above), so this returns its pointer.
    let p = unsafe { ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()) };
    // SAFETY: the pointer `capsule` stored, never deleted (the capsule was not consumed).
    unsafe { deleter(p.cast()) };
}

/// A `"dltensor"` capsule for `e`.
pub fn capsule(py: Python<'_>, e: Export) -> PyResult<Bound<'_, PyAny>> {
    let ndim = i32::try_from(e.shape.len()).map_err(|_| pyo3::exceptions::PyValueError::new_err("too many dims"))?;
    let mut b = Box::new(Managed {
        m: DlManagedTensor {
            dl_tensor: DlTensor {
                data: e.data as usize as *mut c_void,
                device: DlDevice { device_type: e.device.0, device_id: e.device.1 },
                ndim,
                dtype: DlDataType { code: e.dtype.0, bits: e.dtype.1, lanes: 1 },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        },
        shape: e.shape,
        strides: e.strides,
        _keep: e.keep,
    });
    // The vectors' heap buffers do not move with the box, nor change: they are never
    // touched again until the block is freed.
    b.m.dl_tensor.shape = b.shape.as_mut_ptr();
    b.m.dl_tensor.strides = b.strides.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
    let raw = Box::into_raw(b);
    // SAFETY: `raw` is a valid, owned block; `manager_ctx` is ours to set (DLPack leaves it
    // to the producer).
    unsafe { (*raw).m.manager_ctx = raw.cast() };
    // SAFETY: the GIL is held (`py`); `raw` is non-null; `NAME` is a static C string that
    // outlives the capsule, as `PyCapsule_New` requires; `destructor` matches the type.
    let cap = unsafe { ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(destructor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `raw` is still only ours.
        unsafe { deleter(raw.cast()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference (checked non-null).
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}
