//! The conformance suite with cuda-ipc negotiated next to inline, over the in-memory
//! driver: every endpoint is a new simulated process of one simulated machine, so pipes
//! between threads of this test negotiate cuda-ipc (their sessions, CONTROL handling and
//! close paths run under the shared cases). Peers in other processes have their own
//! simulated machine and fall back to inline for `cuda`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};
use ferry_cuda_ipc::fake::FakeGpu;
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions};
use ferry_local::LocalTransport;

#[derive(Default)]
struct FakeCudaIpc;

impl Fixture for FakeCudaIpc {
    const NAME: &'static str = "cuda-ipc-fake";

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        static GPU: OnceLock<Arc<FakeGpu>> = OnceLock::new();
        static PID: AtomicU32 = AtomicU32::new(2_000_000);
        let drv = GPU.get_or_init(|| FakeGpu::new(1)).process(PID.fetch_add(1, Ordering::Relaxed));
        vec![Arc::new(CudaIpcChannel::with_driver(drv, CudaIpcOptions::default())), Arc::new(InlineChannel)]
    }

    fn expected_channel(&self) -> &'static str {
        "inline"
    }

    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-conf-cudafake-{}", ferry_conformance::unique(tag))
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<FakeCudaIpc>()
}
