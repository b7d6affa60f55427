//! Handlers that compute: [`crate::Methods::register_blocking`] runs a plain synchronous
//! function on ferry's compute threads ([`ferry_core::compute::spawn`], a blocking pool of
//! their own), never on a runtime worker, so one client's CPU-bound
//! call cannot delay another client's `add`.
//!
//! - The call is answered `cancelled` the moment it is cancelled (`ferry.cancel`, a client
//!   timeout, `ferry.task.cancel`, the connection closing), whatever the function does; its
//!   slot is free at once. The function itself runs on until it returns (a thread cannot be
//!   stopped from outside): it should check [`crate::CallContext::is_cancelled`] in its
//!   loops, and its result is then dropped.
//! - [`crate::method::MethodDoc::concurrency`] caps how many calls of a method run at
//!   once; for a blocking method the cap counts the threads really computing, including
//!   those still finishing a cancelled call.
//! - On Linux the function runs under `SCHED_IDLE` ([`ComputePriority`]): where the CPUs
//!   are all busy, the runtime's workers (reading requests, answering cheap calls) and other
//!   processes take the CPU first, at once. The parse of a big plain-JSON request (1 MiB
//!   and more, on the compute threads too) runs under the same policy, and so do the count
//!   and parse of a big ferry message header (ferry-core's
//!   [`ferry_core::compute::set_compute_thread_setup`], set when a server is built).
//! - Only the compute threads get it. Tokio's blocking pool (file reads, a weight store's
//!   deltas) keeps the normal policy: a thread cannot leave `SCHED_IDLE` without privilege,
//!   and one on the shared pool once made every later job on it wait for idle CPU (a store's
//!   `update` beside two CPU burners went unanswered for 30 s). A thread a handler starts
//!   inherits its policy, and a lock a handler holds while it waits for CPU holds up
//!   whoever else needs it: take the server's shared locks outside such handlers.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_core::Tensor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::codes::ErrorObject;
use crate::method::{CallContext, ErasedHandler, HandlerFuture, decode_params, encode_result};

/// How the threads that run blocking handlers are scheduled ([`set_compute_priority`];
/// Linux, elsewhere nothing changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputePriority {
    /// `SCHED_IDLE` (the default): compute gets the CPU time no normally scheduled thread
    /// wants, and a runtime worker (or any other process) waking up takes the CPU from it
    /// at once. A lower nice value was not enough: the kernel lets a running task finish its
    /// time slice (a few ms) before a waking one runs, and `add`'s p99 beside a `matmul`
    /// loop stayed 3 to 20 times its quiet p99 (`ferry bench`, `call-add-matmul`). The
    /// price: while every CPU is busy with other work at normal priority, compute waits.
    Idle,
    /// The default policy of the process (compute competes with the workers as equals).
    Normal,
}

static IDLE: AtomicBool = AtomicBool::new(true);

/// Sets how blocking handlers' threads are scheduled from their next call on, for every
/// server of this process (default [`ComputePriority::Idle`]). Back to `Normal` after
/// `Idle` needs privilege (CAP_SYS_NICE, or RLIMIT_NICE) for a thread that already ran one;
/// set it before serving.
pub fn set_compute_priority(p: ComputePriority) {
    IDLE.store(p == ComputePriority::Idle, Ordering::Relaxed);
}

/// Gives this thread the policy [`set_compute_priority`] asks for, if it does not have it
/// yet (Linux; a failure leaves it as it was, and is logged at debug level). Blocking
/// handlers call it, and so does the parse of a big request.
pub(crate) fn apply_priority() {
    #[cfg(target_os = "linux")]
    {
        thread_local! {
            static APPLIED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
        }
        let idle = IDLE.load(Ordering::Relaxed);
        if APPLIED.get() != Some(idle) {
            APPLIED.set(Some(idle));
            if let Err(e) = crate::sys::set_idle_policy(idle) {
                tracing::debug!(idle, "could not set a compute thread's scheduling policy: {e}");
            }
        }
    }
}

/// A synchronous handler run on the compute threads.
pub(crate) struct Blocking<P, R, F> {
    pub(crate) f: Arc<F>,
    pub(crate) _types: PhantomData<fn(P) -> R>,
}

impl<P, R, F> ErasedHandler for Blocking<P, R, F>
where
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    F: Fn(P, CallContext) -> Result<R, ErrorObject> + Send + Sync + 'static,
{
    fn call(&self, params: Option<Value>, tensors: &[Tensor], ctx: CallContext) -> Result<HandlerFuture, ErrorObject> {
        let p: P = decode_params(params, tensors)?;
        let f = self.f.clone();
        let job = ferry_core::compute::spawn(move || {
            apply_priority();
            let r = f(p, ctx);
            r.and_then(|r| encode_result(&r))
        });
        Ok(Box::pin(async move {
            match job.await {
                Ok(r) => r,
                Err(e) if e.is_panic() => {
                    let what = crate::dispatch::panic_message(e.into_panic().as_ref());
                    Err(ErrorObject::internal(format!("the handler panicked: {what}")))
                }
                Err(e) => Err(ErrorObject::internal(format!("the handler's thread failed: {e}"))),
            }
        }))
    }
}

/// A method's handler behind a cap on calls running at once: a call waits for a permit
/// (then its params are checked and it starts), and the permit lives in its [`CallContext`],
/// so it is held until every holder of the context is done (for a blocking handler, until
/// its thread returns).
pub(crate) struct Capped {
    pub(crate) inner: Arc<dyn ErasedHandler>,
    pub(crate) permits: Arc<Semaphore>,
}

impl ErasedHandler for Capped {
    fn call(&self, params: Option<Value>, tensors: &[Tensor], ctx: CallContext) -> Result<HandlerFuture, ErrorObject> {
        let (inner, permits, tensors) = (self.inner.clone(), self.permits.clone(), tensors.to_vec());
        Ok(Box::pin(async move {
            let permit = permits
                .acquire_owned()
                .await
                .map_err(|_| ErrorObject::internal("the method's concurrency limit was closed"))?;
            let ctx = ctx.with_permit(permit);
            inner.call(params, &tensors, ctx)?.await
        }))
    }
}
