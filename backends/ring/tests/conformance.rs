//! The conformance suite over the same-host ring: the local transport (unix sockets) with
//! the shm and inline channels, on endpoints that offer and grant the ring
//! (`ferry_ring::RingExt::ring`). Every frame after the handshake goes through the rings,
//! except those carrying descriptors (new shm segments), which go over the socket with a
//! divert record in their place: the suite checks that nothing is lost or reordered. The
//! ring crate's own tests (hostile indices, SIGKILL) are `tests/processes/`.

use std::sync::Arc;

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};
#[cfg(target_os = "linux")]
use ferry_ring::RingExt;

#[derive(Default)]
struct Ring;

impl Fixture for Ring {
    const NAME: &'static str = "ring";

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(ferry_local::LocalTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(ferry_shm::ShmChannel::new()), Arc::new(InlineChannel)]
    }

    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-conf-ring-{}", ferry_conformance::unique(tag))
    }

    #[cfg(target_os = "linux")]
    fn endpoint(&self) -> ferry_core::EndpointBuilder {
        let mut b = ferry_core::Endpoint::builder().transport(self.transport());
        for c in self.channels() {
            b = b.channel(c);
        }
        b.ring(Some(ferry_ring::RingOptions::default()))
    }

    #[cfg(not(target_os = "linux"))]
    fn viability(&self) -> Result<(), String> {
        Err("the ring works on Linux only".into())
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<Ring>()
}
