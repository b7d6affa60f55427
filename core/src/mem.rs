//! An in-memory transport, scheme `mem:NAME`: the two ends of a [`tokio::io::duplex`] in one
//! process, found by name in a process-wide table. It exists for tests (as quinn's test
//! `Pair`): the Pipe, the endpoint, the handshake and the channels run over it with no
//! socket and no other process, and it is a column of the conformance suite
//! (`core/tests/conformance.rs`, peers in threads only).
//!
//! It is a real transport in every other respect: the bytes go through the frame reader and
//! writer, a dropped end is the peer's end of stream, and a full buffer holds the writer
//! until the reader takes bytes (64 KiB per direction).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use async_trait::async_trait;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

use crate::error::TransportError;
use crate::transport::{Address, ConnInfo, Connection, Listener, Split, Transport};

/// Bytes buffered in each direction before a writer waits for the reader.
pub const BUFFER_BYTES: usize = 64 << 10;

/// Connections waiting to be accepted, per listener.
const BACKLOG: usize = 64;

type Table = Mutex<HashMap<String, mpsc::Sender<DuplexStream>>>;

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Table::default)
}

fn lock(t: &Table) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<DuplexStream>>> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// The in-memory transport (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemTransport;

impl MemTransport {
    /// The transport.
    pub fn new() -> Self {
        MemTransport
    }
}

fn name_of(addr: &Address) -> Result<String, TransportError> {
    let name = addr.rest();
    if name.is_empty() {
        return Err(TransportError::BadAddress {
            addr: addr.to_string(),
            reason: "mem: needs a name (mem:NAME)".into(),
        });
    }
    Ok(name.to_owned())
}

#[async_trait]
impl Transport for MemTransport {
    fn scheme(&self) -> &'static str {
        "mem"
    }

    async fn listen(&self, addr: &Address) -> Result<Box<dyn Listener>, TransportError> {
        let name = name_of(addr)?;
        let (tx, rx) = mpsc::channel(BACKLOG);
        {
            let mut t = lock(table());
            if t.get(&name).is_some_and(|s| !s.is_closed()) {
                return Err(TransportError::AddrInUse {
                    addr: addr.to_string(),
                    detail: ": another listener of this process has the name".into(),
                });
            }
            t.insert(name.clone(), tx.clone());
        }
        Ok(Box::new(MemListener { name, tx, rx, addr: addr.clone() }))
    }

    async fn connect(&self, addr: &Address) -> Result<Box<dyn Connection>, TransportError> {
        let name = name_of(addr)?;
        let tx = lock(table()).get(&name).cloned();
        let not_listening = || TransportError::NotListening {
            addr: addr.to_string(),
            detail: "no listener of this process has the name".into(),
        };
        let tx = tx.ok_or_else(not_listening)?;
        let (ours, theirs) = tokio::io::duplex(BUFFER_BYTES);
        tx.send(theirs).await.map_err(|_| not_listening())?;
        Ok(Box::new(MemConnection { info: info(addr), stream: ours }))
    }
}

fn info(addr: &Address) -> ConnInfo {
    ConnInfo {
        transport: "mem",
        addr: addr.to_string(),
        peer_pid: Some(std::process::id()),
        same_host: true,
        ..ConnInfo::default()
    }
}

struct MemListener {
    name: String,
    tx: mpsc::Sender<DuplexStream>,
    rx: mpsc::Receiver<DuplexStream>,
    addr: Address,
}

impl Drop for MemListener {
    fn drop(&mut self) {
        let mut t = lock(table());
        // Only its own entry: a later listener may have taken the name.
        if t.get(&self.name).is_some_and(|s| s.same_channel(&self.tx)) {
            t.remove(&self.name);
        }
    }
}

#[async_trait]
impl Listener for MemListener {
    async fn accept(&mut self) -> Result<Box<dyn Connection>, TransportError> {
        let stream = self.rx.recv().await.ok_or(TransportError::Closed)?;
        Ok(Box::new(MemConnection { info: info(&self.addr), stream }))
    }

    fn local_addr(&self) -> Address {
        self.addr.clone()
    }
}

struct MemConnection {
    info: ConnInfo,
    stream: DuplexStream,
}

impl Connection for MemConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn split(self: Box<Self>) -> Split {
        let (read, write) = tokio::io::split(self.stream);
        Split { read: Box::new(read), write: Box::new(write), fds: None, busy_poll: None, liveness: None }
    }
}
