//! The conformance suite for the shm channel over the local-socket transport.

use std::sync::Arc;

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};
use ferry_local::LocalTransport;
use ferry_shm::ShmChannel;

#[derive(Default)]
struct Shm;

impl Fixture for Shm {
    const NAME: &'static str = "shm";

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(ShmChannel::new()), Arc::new(InlineChannel)]
    }

    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-conf-shm-{}", ferry_conformance::unique(tag))
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<Shm>()
}
