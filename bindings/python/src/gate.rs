//! What a server lets Python handlers hold at once ([`Gate`]), so that calls a client
//! cancelled or abandoned cannot take the handler threads and the GIL from everyone else.
//!
//! A call to a sync handler goes through these steps, in this order:
//!
//! 1. [`Gate::admit`], synchronously when the call arrives: refused at once (LIMIT_EXCEEDED
//!    naming the Python option) when its connection already has `max_in_flight` handler
//!    runs (running, waiting, or still running after their call was cancelled), or when
//!    `max_queued_handlers` calls already wait for a thread. It returns an [`Admission`]
//!    that holds the connection's count until it is dropped.
//! 2. [`Admission::params`]: a call whose params are bigger than [`SMALL_PARAMS`] waits for
//!    room under `max_param_bytes_in_flight` (one bigger than the whole budget waits until
//!    none is in flight and then runs alone).
//! 3. [`Admission::run_slot`]: waits (in a FIFO queue) for one of the server's
//!    `max_running_handlers`.
//! 4. The job goes to [`crate::pool`]; it checks, before calling Python, that its call is
//!    still wanted (not cancelled, its answer still awaited), and never starts otherwise.
//! 5. The [`Admission`], the params' room and the run slot travel with the job and are
//!    dropped when the handler returns: a cancelled call's handler keeps counting against
//!    its connection and the server until then.
//!
//! A call dropped during steps 2 or 3 (cancelled, its connection closed) leaves the queue
//! at once: the futures that wait are cancel-safe (tokio's semaphore).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferry_rpc::codes::LIMIT_EXCEEDED;
use ferry_rpc::{CallContext, ErrorObject};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Params up to this many bytes (as JSON) do not count against
/// `max_param_bytes_in_flight`: a small call never waits behind big ones.
pub const SMALL_PARAMS: usize = 64 << 10;

/// Default `max_running_handlers`: half the pool's threads ([`crate::pool::MAX_THREADS`]),
/// the rest left to async handlers' starts and other servers of the process.
pub const DEFAULT_RUNNING: usize = crate::pool::MAX_THREADS / 2;
/// Default `max_queued_handlers`.
pub const DEFAULT_QUEUED: usize = 1024;
/// Default `max_param_bytes_in_flight`.
pub const DEFAULT_PARAM_BYTES: u64 = 16 << 20;

/// The semaphore counts params in KiB (its permits are `u32` per acquire).
const UNIT: u64 = 1024;

/// The Python-side limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct GateLimits {
    /// Handler runs per connection (the server's `max_in_flight`).
    pub max_in_flight: usize,
    /// Sync handlers running at once on the server.
    pub max_running: usize,
    /// Calls waiting for one of those.
    pub max_queued: usize,
    /// Bytes of JSON params being converted or held by handlers at once.
    pub max_param_bytes: u64,
}

/// A LIMIT_EXCEEDED error naming a Python option (`app.serve(NAME=...)`).
pub fn limit_error(option: &str, what: &str, value: u64, max: u64) -> ErrorObject {
    ErrorObject::new(
        LIMIT_EXCEEDED,
        format!(
            "Limit exceeded: {what} is {value}, over the limit {option} = {max}; \
             the server can raise it with app.serve({option}=...)"
        ),
    )
    .with_data(serde_json::json!({ "limit": option, "value": value, "max": max }))
}

/// One server's admission of Python handler runs (see the module docs).
pub struct Gate {
    limits: GateLimits,
    running: Arc<Semaphore>,
    waiting: AtomicUsize,
    param_units: Arc<Semaphore>,
    per_conn: Mutex<HashMap<u64, usize>>,
}

impl Gate {
    /// A gate with these limits (each at least 1).
    pub fn new(limits: GateLimits) -> Arc<Gate> {
        let units = usize::try_from(limits.max_param_bytes.div_ceil(UNIT).max(1))
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(Gate {
            limits,
            running: Arc::new(Semaphore::new(limits.max_running.max(1))),
            waiting: AtomicUsize::new(0),
            param_units: Arc::new(Semaphore::new(units)),
            per_conn: Mutex::new(HashMap::new()),
        })
    }

    /// Step 1: admits a call of `ctx`, or refuses it naming the limit. Calls with an id on
    /// a lasting connection count against it (notifications and tasks have no id; a
    /// closed connection's runs count against the server only).
    pub fn admit(self: &Arc<Self>, ctx: &CallContext) -> Result<Admission, ErrorObject> {
        let conn = ctx.id().and(ctx.peer().conn);
        if let Some(c) = conn {
            let mut m = self.per_conn.lock().unwrap_or_else(|e| e.into_inner());
            let n = m.entry(c).or_insert(0);
            if *n >= self.limits.max_in_flight {
                let n = *n;
                return Err(limit_error(
                    "max_in_flight",
                    "Python handler runs on this connection (running, waiting, or cancelled and still running)",
                    n as u64 + 1,
                    self.limits.max_in_flight as u64,
                ));
            }
            *n += 1;
        }
        // From here, dropping it gives the connection's place back.
        let mut admission = Admission { gate: self.clone(), conn, slot: None, queued: false };
        match self.running.clone().try_acquire_owned() {
            Ok(p) => admission.slot = Some(p),
            Err(_) => {
                // Counted as waiting from now (not from its first poll): the next call
                // read sees it.
                let waiting = self.waiting.fetch_add(1, Ordering::AcqRel);
                admission.queued = true;
                if waiting >= self.limits.max_queued {
                    drop(admission);
                    return Err(limit_error(
                        "max_queued_handlers",
                        "calls waiting for a handler thread on this server",
                        waiting as u64 + 1,
                        self.limits.max_queued as u64,
                    ));
                }
            }
        }
        Ok(admission)
    }

    /// Step 2: waits for room for `bytes` of params.
    pub async fn param_room(&self, bytes: usize) -> ParamRoom {
        if bytes <= SMALL_PARAMS {
            return ParamRoom(None);
        }
        let total = (self.limits.max_param_bytes.div_ceil(UNIT).max(1)).min(u64::from(u32::MAX));
        let units = (bytes as u64).div_ceil(UNIT).min(total) as u32;
        // The semaphore is never closed.
        ParamRoom(self.param_units.clone().acquire_many_owned(units).await.ok())
    }

    /// Handler runs counted against connection `conn` now (for tests and the soak).
    pub fn runs_of(&self, conn: u64) -> usize {
        self.per_conn.lock().unwrap_or_else(|e| e.into_inner()).get(&conn).copied().unwrap_or(0)
    }
}

/// A call's place under its connection's count, from [`Gate::admit`] until dropped (when its
/// handler returns, or when the call is dropped before it started).
pub struct Admission {
    gate: Arc<Gate>,
    conn: Option<u64>,
    /// Its run slot, when one was free at once.
    slot: Option<OwnedSemaphorePermit>,
    /// Counted in the gate's `waiting`.
    queued: bool,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.queued {
            self.gate.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(c) = self.conn {
            let mut m = self.gate.per_conn.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = m.get_mut(&c) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&c);
                }
            }
        }
    }
}

/// Room held under `max_param_bytes_in_flight` (none for small params).
pub struct ParamRoom(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

/// A run slot under `max_running_handlers`.
pub struct RunSlot(#[allow(dead_code)] OwnedSemaphorePermit);

impl Admission {
    /// Step 2: waits for room for `bytes` of params.
    pub async fn params(&self, bytes: usize) -> ParamRoom {
        self.gate.param_room(bytes).await
    }

    /// Step 3: its run slot (waited for in the gate's FIFO queue if none was free when
    /// it was admitted).
    pub async fn run_slot(&mut self) -> Option<RunSlot> {
        if let Some(p) = self.slot.take() {
            return Some(RunSlot(p));
        }
        let p = self.gate.running.clone().acquire_owned().await.ok()?;
        if std::mem::take(&mut self.queued) {
            self.gate.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        Some(RunSlot(p))
    }
}
