//! The conformance suite for the local-socket transport with the inline channel.

use std::sync::Arc;

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};
use ferry_local::LocalTransport;

#[derive(Default)]
struct Pipe;

impl Fixture for Pipe {
    const NAME: &'static str = "local";

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(InlineChannel)]
    }

    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-conf-pipe-{}", ferry_conformance::unique(tag))
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<Pipe>()
}
