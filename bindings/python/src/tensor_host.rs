//! `ferry.ray`'s native half (Linux): a process's [`TensorHost`], which keeps tensors by id
//! in ferry shared segments and serves them to any number of peers, and the
//! [`SharedBlock`]s they are written into.
//!
//! A tensor put on the host lies in a sealed-size memfd that belongs to no pipe (a
//! [`ferry::ferry_shm::SharedSegment`], as a tensor store's buckets): every shm pipe sends
//! it without a copy, as a lease the peer maps read-only (copy-on-write for torch); a QUIC
//! pipe sends its bytes. A peer asks with a header `{"get": ID}` and gets `{"ok": ID}` and
//! the tensors, or `{"missing": ID}` once the id was freed (or never put). Freeing an id
//! drops the host's hold: the memory goes when the last peer holding a lease lets go too.
//! When the host process dies, its peers' pipes close and the kernel frees what nobody
//! maps: nothing is named in `/dev/shm`.
//!
//! CUDA tensors (`TensorHost::put_device`) stay where their owner made them, held until
//! freed: a peer whose pipe negotiated cuda-ipc (same host, a shared GPU) gets them over
//! that channel (copied once, on the device, into the channel's exportable pool, then
//! mapped by the peer without a copy); a peer without it (QUIC, another host) gets their
//! bytes copied to the host, under `{"ok": ID, "host_copy": true}`, for it to move to its
//! own device; one such copy at a time per host, so that requests cost the host at most one
//! object's bytes, whatever peers ask.
//!
//! Blocks a host hands out (`TensorHost::block`) come from its [`SharedPool`]: a segment
//! whose id was freed and whose every peer lease was released is filled again (its pages are
//! there already: a new segment costs the first touch of each page, most of a copy-in's
//! time), never while a peer may still read it (see [`ferry::ferry_shm::SharedPool`]). Kept
//! segments are given back once idle for `pool_idle` seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry::ferry_cuda_ipc::CudaIpcChannel;
use ferry::ferry_shm::{SharedPool, SharedPoolOptions, SharedSegment, SharedSegmentMut};
use ferry_core::{Device, DeviceKind, Message, Pipe, PipeError, Tensor};
use pyo3::exceptions::{PyConnectionError, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::device::DeviceTensor;
use crate::runtime;
use crate::tensors::meta_of;

/// The default of [`TensorHost`]'s `max_bytes`: 16 GiB of tensors held at once.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;

/// The default of [`TensorHost`]'s `pool_bytes`: 1 GiB of idle segments kept for reuse.
pub const DEFAULT_POOL_BYTES: u64 = ferry::ferry_shm::DEFAULT_KEEP_BYTES;

/// The default of [`TensorHost`]'s `pool_idle`: a kept segment idle 5 s is given back.
pub const DEFAULT_POOL_IDLE: f64 = 5.0;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The state of a [`SharedBlock`].
enum Block {
    /// Being written by this process.
    Open(SharedSegmentMut),
    /// Put on a host: lendable, never written again through ferry.
    Frozen(Arc<SharedSegment>),
    /// Between the two, under the lock.
    Moving,
}

/// Bytes in a shared segment (a new one, or from a host's pool), writable until a host takes them.
#[pyclass(frozen, weakref, module = "ferry._native")]
pub struct SharedBlock {
    state: Mutex<Block>,
    ptr: usize,
    nbytes: usize,
}

fn segment_error(nbytes: usize, e: &std::io::Error) -> PyErr {
    PyMemoryError::new_err(format!("a {nbytes}-byte shared segment (memfd): {e}"))
}

impl SharedBlock {
    /// The first `nbytes` bytes of `seg` (at most its length). The bytes past them, which
    /// peers map too, are zeroed (a pooled segment holds what was written there last).
    fn of(mut seg: SharedSegmentMut, nbytes: usize) -> SharedBlock {
        let nbytes = nbytes.min(seg.len());
        let bytes = seg.as_mut_slice();
        bytes[nbytes..].fill(0);
        let ptr = bytes.as_mut_ptr() as usize;
        SharedBlock { state: Mutex::new(Block::Open(seg)), ptr, nbytes }
    }

    /// The frozen segment (freezing it now if it is still open).
    fn freeze(&self) -> PyResult<Arc<SharedSegment>> {
        let mut s = lock(&self.state);
        let seg = match std::mem::replace(&mut *s, Block::Moving) {
            Block::Open(m) => m.freeze(),
            Block::Frozen(seg) => seg,
            Block::Moving => return Err(PyRuntimeError::new_err("a SharedBlock was frozen twice at once")),
        };
        *s = Block::Frozen(seg.clone());
        Ok(seg)
    }
}

#[pymethods]
impl SharedBlock {
    /// A block of `nbytes` bytes (at least one), zeroed.
    #[new]
    fn new(nbytes: usize) -> PyResult<SharedBlock> {
        let seg = SharedSegmentMut::create(nbytes.max(1)).map_err(|e| segment_error(nbytes, &e))?;
        Ok(SharedBlock::of(seg, nbytes))
    }

    /// Its size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The address of its first byte.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.ptr
    }

    /// True once a host holds it (its bytes are then lent to peers: do not write them).
    #[getter]
    fn frozen(&self) -> bool {
        matches!(*lock(&self.state), Block::Frozen(_))
    }

    /// numpy's array interface: `nbytes` bytes (`|u1`), writable while open.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr, self.frozen()))?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("SharedBlock({} bytes{})", self.nbytes, if self.frozen() { ", frozen" } else { "" })
    }
}

/// What a host holds.
#[derive(Default)]
struct Objects {
    by_id: HashMap<String, (Vec<Tensor>, u64)>,
    bytes: u64,
    /// Objects and bytes of device tensors copied to the host for peers without cuda-ipc.
    host_copies: u64,
    host_copy_bytes: u64,
}

/// Keeps tensors by id in shared memory and serves them on its addresses.
#[pyclass(frozen, module = "ferry._native")]
pub struct TensorHost {
    objects: Arc<Mutex<Objects>>,
    addrs: Vec<String>,
    stop: CancellationToken,
    max_bytes: u64,
    pool: SharedPool,
}

/// What [`serve`] shares with the host.
#[derive(Clone)]
struct Shared {
    objects: Arc<Mutex<Objects>>,
    /// Copies device tensors to the host for peers without cuda-ipc (made with the host,
    /// so that it uses the driver the host's own channels use).
    cuda: Arc<CudaIpcChannel>,
    /// One host copy at a time, held from the copy until its answer is sent: a peer's
    /// 20-byte request must not make the host hold one object's bytes per connection (a
    /// peer that never reads keeps its answer until the send's deadline).
    host_copying: Arc<tokio::sync::Semaphore>,
}

#[pymethods]
impl TensorHost {
    /// Listens on `addrs` (`unix:NAME`, `quic://HOST:0`, ...); peers must present `token`
    /// when one is given. `max_bytes`: the most tensor bytes held at once (default 16 GiB).
    /// `pool_bytes`: the most bytes of idle segments kept for [`TensorHost::block`] (default
    /// 1 GiB; 0 keeps none); `pool_idle`: seconds a kept segment waits before it is given
    /// back (default 5).
    #[new]
    #[pyo3(signature = (
        addrs, *, token=None, max_bytes=DEFAULT_MAX_BYTES, pool_bytes=DEFAULT_POOL_BYTES,
        pool_idle=DEFAULT_POOL_IDLE
    ))]
    fn new(
        py: Python<'_>,
        addrs: Vec<String>,
        token: Option<String>,
        max_bytes: u64,
        pool_bytes: u64,
        pool_idle: f64,
    ) -> PyResult<TensorHost> {
        let idle_release = Duration::try_from_secs_f64(pool_idle).map_err(|_| {
            PyValueError::new_err(format!("pool_idle={pool_idle}: expected a number of seconds, 0 or more"))
        })?;
        let pool = SharedPool::new(SharedPoolOptions { keep_bytes: pool_bytes, idle_release });
        let ep = crate::pipe::endpoint(token, None)?;
        let objects = Arc::new(Mutex::new(Objects::default()));
        let stop = CancellationToken::new();
        let shared = Shared {
            objects: objects.clone(),
            cuda: Arc::new(CudaIpcChannel::new()),
            host_copying: Arc::new(tokio::sync::Semaphore::new(1)),
        };
        let mut bound = Vec::with_capacity(addrs.len());
        for a in &addrs {
            let l = py
                .detach(|| runtime().block_on(ep.listen(a)))
                .map_err(|e| PyConnectionError::new_err(format!("listening on {a}: {e}")))?;
            bound.push(l.local_addr().to_string());
            runtime().spawn(accept_loop(l, shared.clone(), stop.clone()));
        }
        runtime().spawn(give_back_idle(pool.clone(), stop.clone()));
        Ok(TensorHost { objects, addrs: bound, stop, max_bytes, pool })
    }

    /// A block of `nbytes` bytes (at least one) for [`TensorHost::put`]: a segment of this
    /// host's pool when one of that size (in whole pages) came back, its bytes then what was
    /// written there last (not zeros), else a new, zeroed one.
    fn block(&self, nbytes: usize) -> PyResult<SharedBlock> {
        let seg = self.pool.alloc(nbytes.max(1)).map_err(|e| segment_error(nbytes, &e))?;
        Ok(SharedBlock::of(seg, nbytes.max(1)))
    }

    /// The pool's figures: `kept_segments` and `kept_bytes` idle now; `created`, `reused`,
    /// `withheld` (came back while a peer might still read them: never refilled) and
    /// `given_back` segments so far.
    #[getter]
    fn pool_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.stats();
        let d = PyDict::new(py);
        d.set_item("kept_segments", s.kept_segments)?;
        d.set_item("kept_bytes", s.kept_bytes)?;
        d.set_item("created", s.created)?;
        d.set_item("reused", s.reused)?;
        d.set_item("withheld", s.withheld)?;
        d.set_item("given_back", s.given_back)?;
        Ok(d)
    }

    /// The addresses peers connect to (QUIC ones carry the pinned `#sha256=`).
    #[getter]
    fn addresses(&self) -> Vec<String> {
        self.addrs.clone()
    }

    /// Holds, under `id`, the tensors `layout` describes in `block`: `(offset, shape,
    /// dtype)` each, contiguous. The block is frozen (no copy): do not write it any more.
    /// Putting an id again replaces what it held.
    fn put(&self, id: String, block: &SharedBlock, layout: Vec<(usize, Vec<u64>, String)>) -> PyResult<()> {
        if self.stop.is_cancelled() {
            return Err(PyRuntimeError::new_err("this TensorHost is closed"));
        }
        let mut metas = Vec::with_capacity(layout.len());
        let mut total = 0u64;
        for (off, shape, dtype) in layout {
            let meta = meta_of(shape, &dtype)?;
            let n = meta.byte_span().map_err(|e| PyValueError::new_err(e.to_string()))?;
            if (off as u64).checked_add(n).is_none_or(|e| e > block.nbytes as u64) {
                return Err(PyValueError::new_err(format!(
                    "a tensor of {n} bytes at offset {off} is outside the {}-byte block",
                    block.nbytes
                )));
            }
            total += n;
            metas.push((off, meta, n as usize));
        }
        self.check_room(&id, total)?;
        let seg = block.freeze()?;
        let mut tensors = Vec::with_capacity(metas.len());
        for (off, meta, n) in metas {
            let bytes =
                seg.bytes(off, n).ok_or_else(|| PyValueError::new_err("a tensor lies outside its shared segment"))?;
            tensors.push(Tensor::new(meta, bytes).map_err(|e| PyValueError::new_err(e.to_string()))?);
        }
        self.hold(id, tensors, total);
        Ok(())
    }

    /// Holds, under `id`, CUDA tensors (`DeviceTensor`s: wrapped ones keep their owner,
    /// a torch tensor say, until `id` is freed). Do not write them any more: a peer's copy
    /// is taken when it asks. Putting an id again replaces what it held.
    fn put_device(&self, id: String, tensors: Vec<PyRef<'_, DeviceTensor>>) -> PyResult<()> {
        if self.stop.is_cancelled() {
            return Err(PyRuntimeError::new_err("this TensorHost is closed"));
        }
        let tensors: Vec<Tensor> = tensors.iter().map(|t| t.tensor.clone()).collect();
        let total = tensors.iter().map(|t| t.device_buffer().map_or(0, |b| b.len() as u64)).sum();
        self.check_room(&id, total)?;
        self.hold(id, tensors, total);
        Ok(())
    }

    /// Drops the host's hold on `id`; true when it held it.
    fn free(&self, id: &str) -> bool {
        let mut o = lock(&self.objects);
        match o.by_id.remove(id) {
            Some((_, b)) => {
                o.bytes -= b;
                true
            }
            None => false,
        }
    }

    /// Whether it holds `id`.
    fn has(&self, id: &str) -> bool {
        lock(&self.objects).by_id.contains_key(id)
    }

    /// How many ids it holds.
    #[getter]
    fn count(&self) -> usize {
        lock(&self.objects).by_id.len()
    }

    /// How many tensor bytes it holds.
    #[getter]
    fn nbytes(&self) -> u64 {
        lock(&self.objects).bytes
    }

    /// Copies of device tensors made for peers without cuda-ipc so far (objects, bytes).
    #[getter]
    fn host_copies(&self) -> (u64, u64) {
        let o = lock(&self.objects);
        (o.host_copies, o.host_copy_bytes)
    }

    /// Stops serving, closes its peers' pipes and drops everything it holds and keeps.
    fn close(&self) {
        self.stop.cancel();
        *lock(&self.objects) = Objects::default();
        self.pool.close();
    }
}

impl TensorHost {
    /// Refuses `total` more bytes under `id` past `max_bytes`, in the words of `ferry.ray`.
    fn check_room(&self, id: &str, total: u64) -> PyResult<()> {
        let o = lock(&self.objects);
        let replaced = o.by_id.get(id).map_or(0, |(_, b)| *b);
        if o.bytes - replaced + total > self.max_bytes {
            return Err(PyMemoryError::new_err(format!(
                "holding {total} more bytes would pass max_bytes={} (this host holds {} bytes in {} objects): \
                 free objects (drop their ObjectRefs) or raise ferry.ray.register(max_host_mib=...)",
                self.max_bytes,
                o.bytes,
                o.by_id.len()
            )));
        }
        Ok(())
    }

    fn hold(&self, id: String, tensors: Vec<Tensor>, total: u64) {
        let mut o = lock(&self.objects);
        if let Some((_, b)) = o.by_id.insert(id, (tensors, total)) {
            o.bytes -= b;
        }
        o.bytes += total;
    }
}

impl Drop for TensorHost {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Gives back the pool's idle segments as they become due, until the host closes.
async fn give_back_idle(pool: SharedPool, stop: CancellationToken) {
    // A look at least every second, so that a segment coming back is seen in time.
    let most = pool.options().idle_release.clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        let wait =
            pool.give_back_idle(Instant::now()).map_or(most, |due| due.saturating_duration_since(Instant::now()));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait.clamp(Duration::from_millis(10), most)) => {}
        }
    }
}

async fn accept_loop(mut l: ferry_core::PipeListener, shared: Shared, stop: CancellationToken) {
    loop {
        let p = tokio::select! {
            () = stop.cancelled() => return,
            p = l.accept() => p,
        };
        match p {
            Ok(p) => {
                tokio::spawn(serve(p, shared.clone(), stop.clone()));
            }
            Err(PipeError::Closed) => return,
            Err(e) => tracing::debug!(error = %e, "ferry.ray host: a connection's handshake failed"),
        }
    }
}

/// Answers one peer's `{"get": ID}` requests until it hangs up or the host closes.
async fn serve(p: Pipe, shared: Shared, stop: CancellationToken) {
    let device_channel = p.info().channels.contains_key(&DeviceKind::Cuda);
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => break,
            m = p.recv() => m,
        };
        let Ok(msg) = msg else { break };
        let mut _copying = None;
        let reply = match msg.header.get("get").and_then(|v| v.as_str()) {
            Some(id) => {
                let held = lock(&shared.objects).by_id.get(id).map(|(ts, _)| ts.clone());
                match held {
                    Some(ts) if !device_channel && ts.iter().any(|t| t.device() != Device::Cpu) => {
                        let permit = tokio::select! {
                            () = stop.cancelled() => break,
                            p = shared.host_copying.clone().acquire_owned() => p,
                        };
                        _copying = permit.ok();
                        host_copy(&shared, id, ts).await
                    }
                    Some(ts) => Message::with_tensors(json!({ "ok": id }), ts),
                    None => Message::new(json!({ "missing": id })),
                }
            }
            None => Message::new(json!({ "error": "expected a header {\"get\": ID}" })),
        };
        if p.send(reply).await.is_err() {
            break;
        }
    }
    p.close().await;
}

/// The answer to a peer without cuda-ipc: `ts` with every device tensor copied to the host
/// (on a blocking thread), or an error header saying why it could not be.
async fn host_copy(shared: &Shared, id: &str, ts: Vec<Tensor>) -> Message {
    let cuda = shared.cuda.clone();
    let copied = tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(ts.len());
        let mut bytes = 0u64;
        for t in ts {
            if t.device() == Device::Cpu {
                out.push(t);
                continue;
            }
            let v = cuda.copy_to_host(&t).map_err(|e| format!("copying a {} tensor to the host: {e}", t.device()))?;
            bytes += v.len() as u64;
            let meta = t.meta().clone().with_device(Device::Cpu);
            out.push(Tensor::new(meta, Bytes::from(v)).map_err(|e| e.to_string())?);
        }
        Ok::<_, String>((out, bytes))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    match copied {
        Ok((out, bytes)) => {
            let mut o = lock(&shared.objects);
            o.host_copies += 1;
            o.host_copy_bytes += bytes;
            drop(o);
            Message::with_tensors(json!({ "ok": id, "host_copy": true }), out)
        }
        Err(e) => Message::new(json!({ "error": format!("object {id}: {e}") })),
    }
}
