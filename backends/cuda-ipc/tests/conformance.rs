//! The conformance suite for the cuda-ipc channel, next to the inline channel, over the
//! local-socket transport.
//!
//! cuda-ipc carries CUDA tensors only, so the shared cases (CPU tensors) travel inline and
//! check that a pipe with cuda-ipc registered behaves like any other; the device round
//! trips are in `tests/gpu.rs`. Without a usable CUDA driver every case shows as *ignored*
//! with the reason; `cargo xtask conformance --require cuda-ipc` turns that into a failure.

use std::sync::Arc;

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};
use ferry_cuda_ipc::CudaIpcChannel;
use ferry_local::LocalTransport;

#[derive(Default)]
struct CudaIpc;

impl Fixture for CudaIpc {
    const NAME: &'static str = "cuda-ipc";

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(CudaIpcChannel::new()), Arc::new(InlineChannel)]
    }

    fn expected_channel(&self) -> &'static str {
        // The channel for CPU tensors; cuda-ipc is negotiated for `cuda` alongside it.
        "inline"
    }

    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-conf-cuda-{}", ferry_conformance::unique(tag))
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<CudaIpc>()
}
