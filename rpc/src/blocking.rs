//! Handlers that compute: [`crate::Methods::register_blocking`] runs a plain synchronous
//! function on tokio's blocking pool, never on a runtime worker, so one client's CPU-bound
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
//! - On Linux the function runs at a lower CPU priority ([`COMPUTE_NICE`]): where the CPUs
//!   are all busy, the runtime's workers (reading requests, answering cheap calls) and other
//!   processes at the default priority are served first. The blocking pool's threads keep
//!   that priority for whatever else they run later (big parses, file reads).

use std::marker::PhantomData;
use std::sync::Arc;

use ferry_core::Tensor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::codes::ErrorObject;
use crate::method::{CallContext, ErasedHandler, HandlerFuture, decode_params, encode_result};

/// The nice value (0 default, 19 lowest) of the threads that run blocking handlers: at
/// 10 the kernel gives a thread at 0 about nine times their share of a contended CPU.
pub const COMPUTE_NICE: i32 = 10;

/// Lowers this thread's CPU priority to [`COMPUTE_NICE`] if it is higher, once per thread
/// (Linux; a failure leaves it as it was).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        thread_local! {
            static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        if !DONE.replace(true) {
            // A tid names one thread for PRIO_PROCESS on Linux. Only ever lowered (a process
            // started at a lower priority still keeps it).
            let tid = rustix::thread::gettid();
            let now = rustix::process::getpriority_process(Some(tid)).unwrap_or(COMPUTE_NICE);
            if now < COMPUTE_NICE
                && let Err(e) = rustix::process::setpriority_process(Some(tid), COMPUTE_NICE)
            {
                tracing::debug!("could not lower a compute thread's priority: {e}");
            }
        }
    }
}

/// A synchronous handler run on the blocking pool.
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
        let job = tokio::task::spawn_blocking(move || {
            lower_priority();
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
