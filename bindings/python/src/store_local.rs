//! Publishing into a store this process hosts (`ferry.StoreServer`) without a connection:
//! `ferry.weights.Publisher(store, name)` compares each tensor with the latest version's
//! (read-only views of the store's memory, `StoreServer._latest`), keeps the equal ones
//! where they lie, and copies the others once, straight into the new version's buckets
//! (`StoreServer._build`: a [`VersionBuilder`] whose slots numpy fills), then commits.
//!
//! A slot is writable memory of a version not yet published: `VersionBuilder::commit`
//! refuses while any array over a slot is still alive, so no Python object can write into
//! a published version (its buckets never change once published; the digests the store
//! keeps, and those it takes over from version to version, rely on it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferry_core::{DType, TensorMeta};
use ferry_store::{FromBuilder, Store};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::tensors::TensorRef;

/// The latest version of `name` in `store`: its number and every tensor as a read-only
/// view of the store's memory, in the order published; `None` when there is none.
pub(crate) fn latest(store: &Store, name: &str) -> Option<(u64, Vec<(String, TensorRef)>)> {
    let v = store.open(name, None).ok()?;
    let tensors = v.tensors().into_iter().map(|(n, t)| (n, TensorRef::new(t))).collect();
    Some((v.manifest().version, tensors))
}

/// A version being made in a store this process hosts (`StoreServer._build`).
#[pyclass(frozen, module = "ferry._native")]
pub struct VersionBuilder {
    builder: Mutex<Option<FromBuilder>>,
    /// Each tensor's name and bytes (for the slots' arrays).
    sizes: Vec<(String, usize)>,
    /// Slots whose arrays are alive.
    live: Arc<AtomicUsize>,
}

impl VersionBuilder {
    /// Starts a version of `name` from `base`: `tensors` as `(name, dtype, shape, keep)`.
    pub(crate) fn start(
        store: &Arc<Store>,
        name: &str,
        base: Option<u64>,
        tensors: Vec<(String, String, Vec<u64>, bool)>,
    ) -> PyResult<VersionBuilder> {
        let mut specs = Vec::with_capacity(tensors.len());
        let mut sizes = Vec::with_capacity(tensors.len());
        for (n, d, shape, keep) in tensors {
            let dtype: DType = d.parse().map_err(|e| PyValueError::new_err(format!("tensor {n:?}: {e}")))?;
            let meta = TensorMeta::new(dtype, shape);
            let len = meta
                .byte_span()
                .ok()
                .and_then(|l| usize::try_from(l).ok())
                .ok_or_else(|| PyValueError::new_err(format!("tensor {n:?}: its size overflows")))?;
            sizes.push((n.clone(), len));
            specs.push((n, meta, keep));
        }
        let b = store.builder_from(name, base, specs, None).map_err(store_error)?;
        Ok(VersionBuilder { builder: Mutex::new(Some(b)), sizes, live: Arc::default() })
    }
}

fn store_error(e: ferry_store::StoreError) -> PyErr {
    match e {
        e @ ferry_store::StoreError::Stale { .. } => PyRuntimeError::new_err(e.to_string()),
        e => PyValueError::new_err(e.to_string()),
    }
}

#[pymethods]
impl VersionBuilder {
    /// A writable `u8` slot over tensor `i`'s bytes in the version being made (numpy:
    /// `np.asarray(slot)`), or `None` for a tensor kept from the base. Drop every array
    /// made from it before `commit`.
    fn slot(slf: &Bound<'_, Self>, i: usize) -> PyResult<Option<BuilderSlot>> {
        let me = slf.get();
        let mut guard =
            me.builder.lock().map_err(|_| PyRuntimeError::new_err("a version builder's lock was poisoned"))?;
        let b = guard.as_mut().ok_or_else(|| PyRuntimeError::new_err("this version was committed"))?;
        let Some(bytes) = b.tensor_mut(i) else { return Ok(None) };
        let (ptr, len) = (bytes.as_mut_ptr() as usize, bytes.len());
        me.live.fetch_add(1, Ordering::SeqCst);
        Ok(Some(BuilderSlot { _builder: slf.clone().unbind(), ptr, len, live: me.live.clone() }))
    }

    /// The number of tensors.
    fn __len__(&self) -> usize {
        self.sizes.len()
    }

    /// Publishes the version with `metadata` (JSON text); returns its number. Refused while
    /// an array over a slot is alive (it could write into the published version), and when
    /// the base is no longer the latest version.
    fn commit(&self, py: Python<'_>, metadata: &str) -> PyResult<u64> {
        let live = self.live.load(Ordering::SeqCst);
        if live > 0 {
            return Err(PyRuntimeError::new_err(format!(
                "{live} array(s) over the version being built are still alive: drop them before commit"
            )));
        }
        let meta: serde_json::Value =
            serde_json::from_str(metadata).map_err(|e| PyValueError::new_err(format!("metadata: {e}")))?;
        let b = self
            .builder
            .lock()
            .map_err(|_| PyRuntimeError::new_err("a version builder's lock was poisoned"))?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this version was committed"))?;
        let v = py.detach(|| b.commit(meta)).map_err(store_error)?;
        Ok(v.manifest().version)
    }
}

/// Writable bytes of one tensor of a version being built; numpy views it through
/// `__array_interface__` (the array keeps the slot, the slot keeps the builder).
#[pyclass(frozen, module = "ferry._native")]
pub struct BuilderSlot {
    _builder: Py<VersionBuilder>,
    ptr: usize,
    len: usize,
    live: Arc<AtomicUsize>,
}

impl Drop for BuilderSlot {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

#[pymethods]
impl BuilderSlot {
    /// numpy's array interface: a writable `u8` vector, no copy.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::tensors::array_interface(py, &TensorMeta::new(DType::U8, vec![self.len as u64]), self.ptr, false)
    }
}
