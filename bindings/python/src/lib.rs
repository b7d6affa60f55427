//! `ferry._native`: the native half of the `ferry` Python package (see
//! `bindings/python/README.md`).
//!
//! The Rust side owns everything that touches a socket: the endpoint (unix, QUIC), the
//! handshake, the channels (shm, cuda-ipc, inline), the JSON-RPC server with its limits
//! and access rules, HTTP. Python owns the handlers and their schemas. This module is the
//! seam:
//!
//! - [`server::Server`]: a method table whose handlers are Python callables
//!   ([`handler`]), served on addresses with `ferry serve`'s options
//!   ([`ferry_commands::cli_rpc::bind`] and `run`).
//! - [`tensors`]: received tensors as read-only zero-copy views (`__array_interface__`,
//!   holding the Rust lease), result tensors allocated in the connection's memory.
//! - [`device`]: CUDA tensors over the cuda-ipc channel (`ferry.DeviceTensor`:
//!   `__cuda_array_interface__`, DLPack through [`sys`]), never copied to the host.
//! - [`pipe`]: `ferry.listen` / `ferry.connect`, messages of a header and tensors without
//!   JSON-RPC.
//! - [`client`]: `ferry.Client` / `ferry.AsyncClient`, the Rust JSON-RPC client
//!   ([`ferry_rpc::Client`]) on every address, asyncio futures resolved from the runtime.
//! - [`command`]: the `ferry` command (every subcommand of the Rust binary, from
//!   `ferry_commands`); [`store_server`]: `ferry.StoreServer`, a tensor store hosted by a
//!   Python program.
//! - [`tensor_host`] (Linux): `ferry.ray`'s per-process host of tensors by id in shared
//!   memory, served to peers (Ray's tensor transport).
//!
//! Python code never runs on a tokio worker: sync handlers run on [`pool`]'s threads,
//! admitted by their server's [`gate`]
//! (which keep their Python thread state; the GIL released whenever Rust waits), async
//! handlers on the app's asyncio loop (its own thread), which reports back through
//! [`handler::Done`]. A sync handler's thread writes its response itself ([`answer`]).

use std::sync::OnceLock;

use pyo3::prelude::*;

pub mod accept;
pub mod answer;
pub mod client;
pub mod command;
pub mod device;
pub mod gate;
pub mod handler;
pub mod json;
pub mod pipe;
pub mod pool;
pub mod server;
pub mod store_local;
pub mod store_server;
pub mod sys;
#[cfg(target_os = "linux")]
pub mod tensor_host;
pub mod tensors;
pub mod weights;

/// The runtime's worker threads: as `ferry serve`'s, half the CPUs when busy polling (the
/// default), the rest are for the Python threads and the peers; at most 4 (Python, not the
/// runtime, is the work).
pub(crate) fn runtime_workers() -> usize {
    ferry_commands::cli_rpc::default_workers(busy_poll()).clamp(1, 4)
}

/// `ferry serve`'s default busy-poll window, counted once (counting CPUs reads cgroup files).
pub(crate) fn busy_poll() -> std::time::Duration {
    static D: OnceLock<std::time::Duration> = OnceLock::new();
    *D.get_or_init(ferry_commands::cli_rpc::default_busy_poll)
}

/// The runtime every server and pipe of this process runs on.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(runtime_workers())
            .thread_name("ferry-rt")
            .enable_all()
            .build()
            .expect("the ferry runtime could not start (no threads?)")
    })
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<server::Server>()?;
    m.add_class::<handler::Context>()?;
    m.add_class::<handler::Done>()?;
    m.add_class::<tensors::TensorRef>()?;
    m.add_class::<tensors::OutTensor>()?;
    m.add_class::<device::DeviceTensor>()?;
    // Test-only (the simulated GPU): set as attributes, out of `__all__` (the stubs, checked
    // by stubtest against the wheel's module, do not have them).
    #[cfg(feature = "__testing")]
    {
        m.setattr("_FakeGpu", m.py().get_type::<device::fake::FakeGpu>())?;
        m.setattr("_FakeProcess", m.py().get_type::<device::fake::FakeProcess>())?;
        m.setattr("_fake_cuda_deactivate", wrap_pyfunction!(device::fake::_fake_cuda_deactivate, m)?)?;
    }
    m.add_class::<pipe::Pipe>()?;
    m.add_class::<pipe::Listener>()?;
    m.add_class::<pipe::Message>()?;
    m.add_function(wrap_pyfunction!(pipe::listen, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::connect, m)?)?;
    m.add_function(wrap_pyfunction!(tensors::dtypes, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::settle::Pending>()?;
    m.add_function(wrap_pyfunction!(command::main, m)?)?;
    m.add_class::<store_server::StoreServer>()?;
    m.add_class::<store_local::VersionBuilder>()?;
    m.add_class::<store_local::BuilderSlot>()?;
    m.add_class::<weights::WeightsSubscriber>()?;
    #[cfg(target_os = "linux")]
    {
        m.add_class::<tensor_host::TensorHost>()?;
        m.add_class::<tensor_host::SharedBlock>()?;
    }
    m.add("FerryError", m.py().get_type::<pyo3::exceptions::PyOSError>())?;
    Ok(())
}
