//! The method table ([`Methods`]): plain async Rust functions with typed params and
//! results, and the [`CallContext`] each call gets.

use std::collections::BTreeMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use ferry_core::{Pipe, Tensor, TensorMeta, TensorMut};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::codes::ErrorObject;
use crate::tensor::{self, TensorMode};

/// How a peer is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// A ferry pipe: tensors as `{"$tensor": i}` over the negotiated channel.
    Pipe,
    /// Newline-delimited plain JSON on the socket: tensors inline (base64).
    Json,
    /// HTTP POST: tensors inline (base64).
    Http,
}

/// Who a caller is, for what it creates on the server (tasks): only the same identity may
/// see, fetch or cancel them. See SECURITY.md.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Identity {
    /// A local user, by the unix socket's peer credentials.
    Uid(u32),
    /// A holder of the server's bearer token (QUIC, HTTP): all holders are one identity,
    /// as all processes of one user are.
    Token,
    /// One connection of a transport with neither peer credentials nor a required token
    /// (QUIC without a token): what it creates is its own.
    Connection(u64),
    /// An HTTP caller on a server without a token: all of them are one identity.
    AnonymousHttp,
}

impl Identity {
    /// The identity of a connection: its user where the OS says, else the token when the
    /// peer presented it, else the connection itself.
    pub fn of_connection(uid: Option<u32>, token_verified: bool, conn: u64) -> Identity {
        match (uid, token_verified) {
            (Some(uid), _) => Identity::Uid(uid),
            (None, true) => Identity::Token,
            (None, false) => Identity::Connection(conn),
        }
    }
}

/// A process-unique connection number (for [`Identity::Connection`] and the tasks that
/// die with their connection).
pub fn next_connection_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What is known about the caller.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// How it is connected.
    pub kind: ConnKind,
    /// The address it connected to (or, for HTTP, came from).
    pub addr: String,
    /// Its process id, where the OS says.
    pub pid: Option<u32>,
    /// Its user id, where the OS says.
    pub uid: Option<u32>,
    /// Its agent string (ferry pipes) or empty.
    pub agent: String,
    /// The channel carrying CPU tensors (`"inline"`, `"shm"`), or `"json"` for plain
    /// JSON and HTTP peers.
    pub channel: String,
    /// Who it is (owner of the tasks it submits).
    pub identity: Identity,
    /// Its connection's number ([`next_connection_id`]); `None` for HTTP, whose requests
    /// belong to no lasting connection.
    pub conn: Option<u64>,
}

/// What a handler gets besides its params: who calls, a cancellation token, and a way to
/// allocate result tensors in the connection's channel memory.
#[derive(Clone)]
pub struct CallContext {
    pub(crate) peer: Arc<PeerInfo>,
    pub(crate) id: Option<Value>,
    pub(crate) cancel: CancellationToken,
    pub(crate) pipe: Option<Arc<Pipe>>,
    /// The method's concurrency permit ([`MethodDoc::concurrency`]), held while any clone of
    /// this context lives.
    pub(crate) permit: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
    /// The server's tensor references (`None` for a detached context).
    pub(crate) refs: Option<Arc<crate::remote::RefTable>>,
    /// Cancelled once the caller's connection ended (`None`: not known, a detached context).
    pub(crate) conn_closed: Option<CancellationToken>,
}

impl CallContext {
    /// A context for calling a handler directly (tests, in-process use): no pipe, never
    /// cancelled unless `cancel` is.
    pub fn detached(peer: PeerInfo, cancel: CancellationToken) -> CallContext {
        CallContext { peer: Arc::new(peer), id: None, cancel, pipe: None, permit: None, refs: None, conn_closed: None }
    }

    pub(crate) fn with_permit(mut self, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        self.permit = Some(Arc::new(permit));
        self
    }

    /// [`CallContext::alloc`] for handlers registered with
    /// [`Methods::register_blocking`], which run on the compute threads (on a runtime
    /// worker this panics: use `alloc().await` there).
    pub fn alloc_blocking(&self, meta: TensorMeta) -> Result<TensorMut, ErrorObject> {
        tokio::runtime::Handle::current().block_on(self.alloc(meta))
    }

    /// Keeps `tensor` on the server as a remote reference owned by the caller, to return
    /// instead of its bytes ([`crate::remote`]). It is freed when the caller's connection
    /// closes (unless the caller publishes it), after `ttl`, or by `ferry.ref.free`.
    /// LIMIT_EXCEEDED past the reference limits of [`crate::RpcLimits`].
    pub fn keep(
        &self,
        tensor: ferry_core::Tensor,
        ttl: Option<std::time::Duration>,
    ) -> Result<crate::remote::TensorRef, ErrorObject> {
        let refs =
            self.refs.as_ref().ok_or_else(|| ErrorObject::internal("this call has no server to keep a tensor on"))?;
        refs.keep(tensor, &self.peer.identity, self.peer.conn, ttl, std::time::Instant::now())
    }

    /// What the caller's reference `id` says of its tensor, without using the tensor
    /// (NOT_FOUND for an id the caller does not hold, as everywhere).
    pub fn ref_info(&self, id: &str) -> Result<crate::remote::RefInfo, ErrorObject> {
        let refs =
            self.refs.as_ref().ok_or_else(|| ErrorObject::internal("this call has no server holding references"))?;
        refs.info(id, &self.peer.identity, std::time::Instant::now())
    }

    /// The caller.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The request id (`None` for notifications and tasks).
    pub fn id(&self) -> Option<&Value> {
        self.id.as_ref()
    }

    /// The call's cancellation token. The server also drops the handler's future when it
    /// is cancelled; watch the token to stop work running elsewhere (a thread, a child).
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// True once the caller's connection has ended (never for a detached context). Unlike
    /// [`CallContext::is_cancelled`], a call cancelled by `ferry.cancel` does not make it
    /// true. A handler that makes something a per-connection identity owns checks it after,
    /// and frees it itself when true ([`Methods::on_connection_closed`] ran before it).
    pub fn connection_closed(&self) -> bool {
        self.conn_closed.as_ref().is_some_and(CancellationToken::is_cancelled)
    }

    /// True once the call is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the call is cancelled.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// A writable tensor for a result, in the channel's own memory where it has some (the
    /// shm pool: the result then goes back without a copy), else on the heap. Fill it,
    /// `freeze()` it and return it as an [`crate::RpcTensor`]. Its bytes are unspecified
    /// (a recycled pool slot holds an earlier result's): write every byte.
    pub async fn alloc(&self, meta: TensorMeta) -> Result<TensorMut, ErrorObject> {
        match &self.pipe {
            Some(p) => p.alloc(meta).await.map_err(ErrorObject::tensor),
            None => TensorMut::zeros(meta).map_err(ErrorObject::tensor),
        }
    }

    /// The channel the caller's pipe negotiated for tensors of `kind` (`"cuda-ipc"` for
    /// [`ferry_core::DeviceKind::Cuda`]), or `None`: such tensors cannot be answered to this
    /// caller (a plain JSON connection has none).
    pub fn device_channel(&self, kind: ferry_core::DeviceKind) -> Option<&str> {
        self.pipe.as_ref()?.info().channels.get(&kind).map(String::as_str)
    }

    /// A device tensor for `meta` (e.g. `cuda:0`) in the memory of the caller's pipe's
    /// device channel (cuda-ipc: answering with it costs no copy); its bytes are
    /// unspecified until written. Fails with a tensor error when the caller has no
    /// channel for that device (a plain JSON connection never has one).
    pub async fn alloc_device(&self, meta: TensorMeta) -> Result<Tensor, ErrorObject> {
        match &self.pipe {
            Some(p) => p.alloc_device(meta).await.map_err(ErrorObject::tensor),
            None => Err(ErrorObject::tensor(format!(
                "{} tensors need a ferry pipe with a channel for them; this caller is a plain JSON connection",
                meta.device
            ))),
        }
    }
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallContext").field("peer", &self.peer).field("id", &self.id).finish_non_exhaustive()
    }
}

/// A handler's encoded result: JSON with `{"$tensor": i}` references into `tensors`.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// The result value.
    pub value: Value,
    /// The tensors it references.
    pub tensors: Vec<Tensor>,
}

/// The future a handler returns, erased.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Reply, ErrorObject>> + Send>>;

/// A handler with its types erased: decodes params (synchronously, so invalid params are
/// reported before anything runs) and returns the future of the call.
pub trait ErasedHandler: Send + Sync + 'static {
    /// Decodes `params` (`{"$tensor": i}` resolved against `tensors`) and starts the call.
    fn call(&self, params: Option<Value>, tensors: &[Tensor], ctx: CallContext) -> Result<HandlerFuture, ErrorObject>;
}

/// Decodes params of type `P`: by name (object), by position (array, in field order), or
/// absent or empty (as `{}`, then `null`, then `[]`). The error says where and why.
pub fn decode_params<P: DeserializeOwned>(params: Option<Value>, tensors: &[Tensor]) -> Result<P, ErrorObject> {
    let to_err = |e: serde_path_to_error::Error<serde_json::Error>| {
        let path = e.path().to_string();
        ErrorObject::invalid_params(if path == "." { String::new() } else { path }, e.into_inner().to_string())
    };
    // Empty params (`{}` or `[]`) are the same as none: a method without params accepts all
    // three spellings, as its `paramStructure: "either"` promises.
    let empty = matches!(&params, Some(Value::Object(m)) if m.is_empty())
        || matches!(&params, Some(Value::Array(a)) if a.is_empty());
    match params {
        Some(v) if !empty => tensor::from_value(v, tensors).map_err(to_err),
        _ => {
            let first = tensor::from_value(Value::Object(Default::default()), tensors);
            first
                .or_else(|e| tensor::from_value(Value::Null, tensors).map_err(|_| e))
                .or_else(|e| tensor::from_value(Value::Array(Vec::new()), tensors).map_err(|_| e))
                .map_err(to_err)
        }
    }
}

/// Encodes a result, tensors as references.
pub fn encode_result<R: Serialize + ?Sized>(r: &R) -> Result<Reply, ErrorObject> {
    let (value, tensors) =
        tensor::to_value(r, TensorMode::Refs).map_err(|e| ErrorObject::internal(format!("result: {e}")))?;
    Ok(Reply { value, tensors })
}

struct Typed<P, R, F> {
    f: F,
    _types: PhantomData<fn(P) -> R>,
}

impl<P, R, F, Fut> ErasedHandler for Typed<P, R, F>
where
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    F: Fn(P, CallContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, ErrorObject>> + Send + 'static,
{
    fn call(&self, params: Option<Value>, tensors: &[Tensor], ctx: CallContext) -> Result<HandlerFuture, ErrorObject> {
        let p: P = decode_params(params, tensors)?;
        let fut = (self.f)(p, ctx);
        Ok(Box::pin(async move {
            let r = fut.await?;
            encode_result(&r)
        }))
    }
}

/// Schemas of a method's params and result, made on demand for `rpc.discover`.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// What `rpc.discover` says about a method.
#[derive(Clone)]
pub struct MethodInfo {
    /// Its name.
    pub name: String,
    /// One line.
    pub summary: Option<String>,
    /// More text.
    pub description: Option<String>,
    /// Deprecated.
    pub deprecated: bool,
    /// Params schema (an object schema whose properties are the params, in order).
    pub params: SchemaFn,
    /// Result schema.
    pub result: SchemaFn,
    /// The params' names in positional order, when the params type is a struct.
    pub param_names: fn() -> Option<&'static [&'static str]>,
    /// By-name params may carry names the method does not take (see
    /// [`MethodDoc::allow_unknown_params`]); otherwise an unknown name is an invalid-params
    /// error naming it.
    pub additional_params: bool,
    /// Schemas known only at run time (a method registered from another language): when
    /// set, they stand for `params`, `result` and `param_names`.
    pub given: Option<Arc<GivenSchemas>>,
    /// A long-running method, meant to be started as a task (`ferry.task.submit`) rather
    /// than called and waited on (see [`MethodDoc::task`]): `rpc.discover` says so
    /// (`x-ferry-task: true`), and generated clients add submit, status and result helpers.
    pub task: bool,
}

/// A method's schemas as JSON values, for methods whose types are known only at run time
/// (the Python server derives them from type hints). References are written
/// `#/components/schemas/NAME`, the OpenRPC document's definitions; ferry's own `Tensor`
/// and `InlineTensor` may be referenced without being defined in `defs`.
#[derive(Debug, Clone, Default)]
pub struct GivenSchemas {
    /// Params: an object schema whose properties are the params.
    pub params: Value,
    /// The result.
    pub result: Value,
    /// Schemas the two refer to, by name.
    pub defs: serde_json::Map<String, Value>,
    /// The params' names in positional order.
    pub param_names: Vec<String>,
}

impl std::fmt::Debug for MethodInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodInfo").field("name", &self.name).field("summary", &self.summary).finish_non_exhaustive()
    }
}

pub(crate) struct Method {
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) info: MethodInfo,
    /// The params' names (`info.param_names()` or the given ones), computed once.
    pub(crate) names: Option<Vec<String>>,
    /// Started in the connection's read loop (see [`MethodDoc::inline`]).
    pub(crate) inline: bool,
}

impl Method {
    /// Refuses by-name params with a name the method does not take (unless it allows
    /// them, or its params type is not a plain struct, whose names are then unknown).
    pub(crate) fn check_param_names(&self, params: Option<&Value>) -> Result<(), ErrorObject> {
        let (Some(Value::Object(given)), Some(names), false) = (params, &self.names, self.info.additional_params)
        else {
            return Ok(());
        };
        match given.keys().find(|k| !names.contains(k)) {
            None => Ok(()),
            Some(k) => Err(ErrorObject::invalid_params(
                k.clone(),
                format!("unknown param {k:?}: {} takes {}", self.info.name, names.join(", ")),
            )),
        }
    }
}

/// The docs of a typed method `name`.
fn typed_info<P: DeserializeOwned + JsonSchema, R: JsonSchema>(name: &str) -> Result<MethodInfo, RegisterError> {
    Ok(MethodInfo {
        name: name.to_owned(),
        summary: None,
        description: None,
        deprecated: false,
        params: schema_of::<P>,
        result: schema_of::<R>,
        param_names: crate::openrpc::field_names::<P>,
        additional_params: false,
        given: None,
        task: false,
    })
}

/// A registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The name is already taken.
    #[error("method {0:?} is already registered")]
    Duplicate(String),
    /// The name starts with `rpc.` (reserved by JSON-RPC 2.0) or `ferry.` (ferry's
    /// built-in methods), or is empty.
    #[error("method name {0:?} is reserved (names starting with \"rpc.\" or \"ferry.\") or empty")]
    Reserved(String),
}

/// The method table. Register handlers, then give it to [`crate::Server::new`].
///
/// ```
/// # use ferry_rpc::{Methods, ErrorObject};
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct AddParams { a: f64, b: f64 }
/// let mut m = Methods::new();
/// m.register("add", |p: AddParams| async move { Ok::<_, ErrorObject>(p.a + p.b) })?
///     .summary("Adds two numbers");
/// # Ok::<(), ferry_rpc::RegisterError>(())
/// ```
#[derive(Default)]
pub struct Methods {
    pub(crate) map: BTreeMap<String, Method>,
    /// Called as each connection ends ([`Methods::on_connection_closed`]).
    pub(crate) closers: Vec<ConnectionClosed>,
}

/// A function called with the peer of each connection that ends
/// ([`Methods::on_connection_closed`]).
pub type ConnectionClosed = Arc<dyn Fn(&PeerInfo) + Send + Sync>;

/// Documentation and scheduling setters for a method just registered.
pub struct MethodDoc<'a>(&'a mut Method);

impl MethodDoc<'_> {
    /// Sets the one-line summary.
    pub fn summary(self, s: impl Into<String>) -> Self {
        self.0.info.summary = Some(s.into());
        self
    }

    /// Sets the description.
    pub fn description(self, s: impl Into<String>) -> Self {
        self.0.info.description = Some(s.into());
        self
    }

    /// Marks the method deprecated.
    pub fn deprecated(self) -> Self {
        self.0.info.deprecated = true;
        self
    }

    /// Caps the calls of this method that run at once (tasks included); more wait for a
    /// free slot, in order. For a handler registered with [`Methods::register_blocking`]
    /// the cap counts the threads computing, a cancelled call's included until it returns.
    pub fn concurrency(self, n: usize) -> Self {
        let inner = self.0.handler.clone();
        let permits = Arc::new(tokio::sync::Semaphore::new(n.max(1)));
        self.0.handler = Arc::new(crate::blocking::Capped { inner, permits });
        self
    }

    /// Lets by-name params carry names the params type does not have: they are ignored
    /// (serde's default), and `rpc.discover` says so (`x-ferry-additional-params: true`).
    /// Without it, an unknown name (a typo such as `"fil"` for `"fill"`) is an
    /// invalid-params error naming it, before the handler runs.
    pub fn allow_unknown_params(self) -> Self {
        self.0.info.additional_params = true;
        self
    }

    /// Marks the method long-running: callers should start it as a task
    /// (`ferry.task.submit`, then `ferry.task.status` / `ferry.task.result`) rather than
    /// call it and wait. Any method can be submitted as a task; this only documents it:
    /// `rpc.discover` says `x-ferry-task: true`, and clients generated from the document
    /// (`ferry sdk`) add `NAME_submit`, `NAME_status` and `NAME_result` helpers for it.
    pub fn task(self) -> Self {
        self.0.info.task = true;
        self
    }

    /// Marks the handler as cheap: it returns quickly, without long synchronous work
    /// before its first `.await` (jsonrpsee's "sync method"). A call to it is polled once
    /// in the connection's read loop, and if it finishes there it is answered from there,
    /// which saves a task spawn per call; if it waits, it goes on in its own task like any
    /// other call. Peers see no difference. Do not use it for handlers that compute (a
    /// `matmul`, a checksum over a tensor): while one runs inline, the connection's next
    /// calls wait.
    pub fn inline(self) -> Self {
        self.0.inline = true;
        self
    }
}

impl Methods {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `f(params)`: an async function of typed params returning a typed result
    /// or an [`ErrorObject`]. Params arrive by name (an object) or by position (an array,
    /// in field order).
    pub fn register<P, R, F, Fut>(&mut self, name: &str, f: F) -> Result<MethodDoc<'_>, RegisterError>
    where
        P: DeserializeOwned + JsonSchema + Send + 'static,
        R: Serialize + JsonSchema + Send + 'static,
        F: Fn(P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ErrorObject>> + Send + 'static,
    {
        self.register_ctx(name, move |p: P, _ctx: CallContext| f(p))
    }

    /// Registers `f(params, ctx)`, a handler that also gets the [`CallContext`].
    pub fn register_ctx<P, R, F, Fut>(&mut self, name: &str, f: F) -> Result<MethodDoc<'_>, RegisterError>
    where
        P: DeserializeOwned + JsonSchema + Send + 'static,
        R: Serialize + JsonSchema + Send + 'static,
        F: Fn(P, CallContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ErrorObject>> + Send + 'static,
    {
        self.insert(Arc::new(Typed { f, _types: PhantomData::<fn(P) -> R> }), typed_info::<P, R>(name)?)
    }

    /// Registers `f(params, ctx)`, a plain synchronous function that computes (a `matmul`,
    /// a checksum over a tensor, a model's forward pass on the CPU). It runs on ferry's
    /// compute threads, never on a runtime worker, so other calls and connections go on while
    /// it computes. A cancelled call is answered `cancelled` at once; the function should
    /// check `ctx.is_cancelled()` in its loops to stop early (see [`crate::blocking`]).
    /// Result tensors: `ctx.alloc_blocking(meta)`.
    ///
    /// ```
    /// # use ferry_rpc::{CallContext, ErrorObject, Methods};
    /// let mut m = Methods::new();
    /// m.register_blocking("sum_to", |(n,): (u64,), ctx: CallContext| {
    ///     let mut total = 0u64;
    ///     for i in 0..=n {
    ///         if i % 1_000_000 == 0 && ctx.is_cancelled() {
    ///             return Err(ErrorObject::cancelled("sum_to"));
    ///         }
    ///         total = total.wrapping_add(i);
    ///     }
    ///     Ok(total)
    /// })?
    /// .concurrency(2);
    /// # Ok::<(), ferry_rpc::RegisterError>(())
    /// ```
    pub fn register_blocking<P, R, F>(&mut self, name: &str, f: F) -> Result<MethodDoc<'_>, RegisterError>
    where
        P: DeserializeOwned + JsonSchema + Send + 'static,
        R: Serialize + JsonSchema + Send + 'static,
        F: Fn(P, CallContext) -> Result<R, ErrorObject> + Send + Sync + 'static,
    {
        let handler = crate::blocking::Blocking { f: Arc::new(f), _types: PhantomData::<fn(P) -> R> };
        self.insert(Arc::new(handler), typed_info::<P, R>(name)?)
    }

    /// Registers an erased handler with hand-made docs (adapters, handlers in another
    /// language). Reserved and taken names are refused as by the typed registrations.
    pub fn register_erased(
        &mut self,
        handler: Arc<dyn ErasedHandler>,
        info: MethodInfo,
    ) -> Result<MethodDoc<'_>, RegisterError> {
        self.insert(handler, info)
    }

    /// Every registration ends here: the name is refused when reserved or empty, or taken.
    fn insert(&mut self, handler: Arc<dyn ErasedHandler>, info: MethodInfo) -> Result<MethodDoc<'_>, RegisterError> {
        use std::collections::btree_map::Entry;
        if info.name.is_empty() || info.name.starts_with("rpc.") || info.name.starts_with("ferry.") {
            return Err(RegisterError::Reserved(info.name));
        }
        match self.map.entry(info.name.clone()) {
            Entry::Occupied(_) => Err(RegisterError::Duplicate(info.name)),
            Entry::Vacant(v) => {
                let names = match &info.given {
                    Some(g) => Some(g.param_names.clone()),
                    None => (info.param_names)().map(|n| n.iter().map(|s| (*s).to_owned()).collect()),
                };
                Ok(MethodDoc(v.insert(Method { handler, info, names, inline: false })))
            }
        }
    }

    /// Moves every method of `other` into this table (and its
    /// [`Methods::on_connection_closed`] functions).
    pub fn merge(&mut self, other: Methods) -> Result<(), RegisterError> {
        if let Some(dup) = other.map.keys().find(|k| self.map.contains_key(*k)) {
            return Err(RegisterError::Duplicate(dup.clone()));
        }
        self.map.extend(other.map);
        self.closers.extend(other.closers);
        Ok(())
    }

    /// Calls `f` with the peer of each connection that ends (closed by either side, idle,
    /// or its process gone), after its calls are cancelled and its tasks and references
    /// freed: where methods keep what a per-connection identity ([`Identity::Connection`])
    /// made, which nobody could reach after it, they free it here. Calls of the connection
    /// still running may finish after it (a blocking handler cannot be stopped): such a
    /// handler checks [`CallContext::connection_closed`] after making something.
    pub fn on_connection_closed(&mut self, f: impl Fn(&PeerInfo) + Send + Sync + 'static) {
        self.closers.push(Arc::new(f));
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    /// The handler of `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn ErasedHandler>> {
        self.map.get(name).map(|m| &m.handler)
    }

    /// True if `name` is registered and marked [`MethodDoc::inline`].
    pub fn is_inline(&self, name: &str) -> bool {
        self.map.get(name).is_some_and(|m| m.inline)
    }

    /// The docs of every method, sorted by name.
    pub fn infos(&self) -> impl Iterator<Item = &MethodInfo> {
        self.map.values().map(|m| &m.info)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;
    use crate::codes::INVALID_PARAMS;

    #[derive(Deserialize, JsonSchema)]
    struct Add {
        a: i64,
        b: i64,
    }

    fn ctx() -> CallContext {
        CallContext::detached(
            PeerInfo {
                kind: ConnKind::Pipe,
                addr: String::new(),
                pid: None,
                uid: None,
                agent: String::new(),
                channel: "inline".into(),
                identity: Identity::Uid(0),
                conn: None,
            },
            CancellationToken::new(),
        )
    }

    fn add_table() -> Methods {
        let mut m = Methods::new();
        m.register("add", |p: Add| async move { Ok(p.a + p.b) }).unwrap();
        m
    }

    async fn call(m: &Methods, params: Option<Value>) -> Result<Value, ErrorObject> {
        Ok(m.get("add").unwrap().call(params, &[], ctx())?.await?.value)
    }

    #[tokio::test]
    async fn by_name_and_by_position() {
        let m = add_table();
        assert_eq!(call(&m, Some(json!({"a": 1, "b": 2}))).await.unwrap(), json!(3));
        assert_eq!(call(&m, Some(json!([40, 2]))).await.unwrap(), json!(42));
        let e = call(&m, Some(json!({"a": 1, "b": "x"}))).await.unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert_eq!(e.data.as_ref().unwrap()["path"], "b");
        assert!(e.message.contains("expected i64"), "{}", e.message);
        let e = call(&m, Some(json!({"a": 1}))).await.unwrap_err();
        assert!(e.message.contains("missing field `b`"), "{}", e.message);
        let e = call(&m, Some(json!([1]))).await.unwrap_err();
        assert!(e.message.contains("invalid length 1"), "{}", e.message);
        let e = call(&m, None).await.unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
    }

    #[tokio::test]
    async fn unit_params_accept_absent_params() {
        let mut m = Methods::new();
        m.register("ping", |(): ()| async { Ok("pong") }).unwrap();
        let r = m.get("ping").unwrap().call(None, &[], ctx()).unwrap().await.unwrap();
        assert_eq!(r.value, json!("pong"));
    }

    #[test]
    fn reserved_and_duplicate_names() {
        let mut m = add_table();
        assert!(matches!(
            m.register("add", |p: Add| async move { Ok(p.a) }),
            Err(RegisterError::Duplicate(n)) if n == "add"
        ));
        for name in ["rpc.discover", "ferry.x", ""] {
            assert!(matches!(m.register(name, |p: Add| async move { Ok(p.a) }), Err(RegisterError::Reserved(_))));
        }
        assert_eq!(m.names().collect::<Vec<_>>(), ["add"]);
    }
}
