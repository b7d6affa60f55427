//! The conformance suite over the in-memory transport (`mem`, [`ferry_core::mem`]) with the
//! inline channel: every case whose peer can run in a thread of this process (the
//! `::processes` variants and the faults cases need a peer process, which `mem` cannot
//! reach).

use std::sync::Arc;

use ferry_conformance::Fixture;
use ferry_core::mem::MemTransport;
use ferry_core::{Channel, InlineChannel, Transport};

#[derive(Default)]
struct Mem;

impl Fixture for Mem {
    const NAME: &'static str = "mem";
    const PROCESS_PEERS: bool = false;

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(MemTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(InlineChannel)]
    }

    fn addr(&self, tag: &str) -> String {
        format!("mem:conf-{}", ferry_conformance::unique(tag))
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<Mem>()
}
