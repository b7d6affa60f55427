//! What the fast-path and give-back tests share: their endpoint, an echoing handler, and
//! the conformance fixture (unix sockets, shm and inline).
#![allow(dead_code)]

use std::future::Future;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ferry_conformance::Fixture;
use ferry_core::{Channel, Endpoint, Handled, InlineChannel, Message, Pipe, Transport};
use ferry_local::LocalTransport;
use ferry_shm::{ShmChannel, ShmOptions};

/// The conformance fixture of this crate's tests: unix sockets, shm and inline.
#[derive(Default)]
pub struct Fx;

impl Fixture for Fx {
    const NAME: &'static str = "shm";
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }
    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(ShmChannel::new()), Arc::new(InlineChannel)]
    }
    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-shm-test-{}", ferry_conformance::unique(tag))
    }
}

/// How long a test waits for anything.
pub const T: Duration = Duration::from_secs(20);

/// An endpoint of unix sockets, shm (with `opts`) and inline, busy-polling `busy_poll`.
pub fn endpoint(opts: ShmOptions, busy_poll: Duration) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::with_options(opts)))
        .channel(Arc::new(InlineChannel))
        .busy_poll(busy_poll)
        .build()
}

/// Sends `msg` back: at once when the send finishes on its first poll (then true, as a
/// server answering inline), else in a task (false).
pub fn echo_now(pipe: Weak<Pipe>, msg: Message) -> Handled {
    let Some(pipe) = pipe.upgrade() else { return Handled::Started };
    let mut send = Box::pin(async move {
        let _ = pipe.send(msg).await;
    });
    if let Poll::Ready(()) = send.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        return Handled::Done;
    }
    tokio::spawn(send);
    Handled::Started
}
