//! The conformance suite for the ring. The ring is not a Channel yet (the handshake
//! integration of issue 22 is still to come), so the suite is instantiated with the local
//! transport and the inline channel and reported as not viable: every case is ignored, with
//! the reason, in `cargo xtask conformance`'s table. The ring's own tests are in
//! `tests/processes.rs`.

use std::sync::Arc;

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};

#[derive(Default)]
struct Ring;

impl Fixture for Ring {
    const NAME: &'static str = "ring";
    const PROCESS_PEERS: bool = false;

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(ferry_core::mem::MemTransport::new())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(InlineChannel)]
    }

    fn addr(&self, tag: &str) -> String {
        format!("mem:ferry-conf-ring-{}", ferry_conformance::unique(tag))
    }

    fn viability(&self) -> Result<(), String> {
        Err("ferry-ring is not integrated into the handshake yet (issue 22): its tests are tests/processes.rs".into())
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<Ring>()
}
