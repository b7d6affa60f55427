//! The store over JSON-RPC: `store.publish`, `store.open`, `store.list`, `store.unpublish`
//! (PROTOCOL.md §20), and the placement of its tensor references ([`placement`]:
//! `store.placement.get/set`, `store.ref.placement/place/schedule`).
//!
//! `store.open` answers with the version's manifest and its buckets as `u8` tensors: over
//! the shm channel each bucket is lent, not copied (a lease the reader holds until it drops
//! the last array made from it), so opening costs O(buckets) whatever the number of
//! tensors, and a reader holds its version exactly as long as it holds its arrays.

use std::sync::Arc;

use ferry_rpc::codes::{FORBIDDEN, NOT_FOUND};
use ferry_rpc::{CallContext, ErrorObject, Identity, Methods, RegisterError, RpcTensor, TensorMap};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::delta::Delta;
use crate::{Entry, Manifest, Store, StoreError};

/// The longest `store.delta` waits for a new version (`wait_ms` above it is cut to it):
/// one minute. The caller's long poll then asks again.
pub const MAX_DELTA_WAIT_MS: u64 = 60_000;

pub mod placement;

/// Params of `store.publish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishParams {
    /// The bundle's name.
    pub name: String,
    /// The tensors (a state_dict), by name.
    pub tensors: TensorMap,
    /// Any JSON the readers get with the version (a step number, a config).
    #[serde(default)]
    pub metadata: Value,
    /// The version these tensors change (`Store::publish_delta`): `tensors` are only the
    /// changed (or new) ones, every other tensor of `base` is kept without being sent;
    /// `base` must still be the latest (else INVALID_PARAMS naming `base`). Absent: `tensors`
    /// are the whole version (the unchanged ones are found by comparing).
    #[serde(default)]
    pub base: Option<u64>,
    /// With `base`: the tensors of `base` left out of the new version.
    #[serde(default)]
    pub removed: Vec<String>,
}

/// What `store.publish` made.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Published {
    /// The bundle's name.
    pub name: String,
    /// The new version's number.
    pub version: u64,
    /// Bytes of its buckets.
    pub bytes: u64,
    /// How many tensors it holds.
    pub tensors: u64,
}

/// Params of `store.open`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenParams {
    /// The bundle's name.
    pub name: String,
    /// A version number; absent or null: the latest.
    #[serde(default)]
    pub version: Option<u64>,
    /// Refuse the version unless its digest is this (`blake3:HEX`); waits for the digest
    /// while it is computed.
    #[serde(default)]
    pub expect_digest: Option<String>,
}

/// An opened version: its manifest and its buckets.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Opened {
    /// The bundle's name.
    pub name: String,
    /// The version's number.
    pub version: u64,
    /// Its digest (`blake3:HEX`); null while it is still computed, or when the store
    /// computes none.
    pub digest: Option<String>,
    /// The producer's metadata.
    pub metadata: Value,
    /// Bytes of its buckets.
    pub bytes: u64,
    /// When it was published (milliseconds since the Unix epoch).
    pub published_ms: u64,
    /// Its buckets, each a `u8` vector; a tensor's bytes are a range of one.
    pub buckets: Vec<RpcTensor>,
    /// Where every tensor lies, in columns ([`crate::Columns`]; [`Opened::entries`]).
    pub manifest: crate::Columns,
}

/// Params of `store.list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {}

/// One bundle in `store.list`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct BundleInfo {
    /// The bundle's name.
    pub name: String,
    /// The latest version (null once unpublished while readers hold older ones).
    pub version: Option<u64>,
    /// Bytes of the latest version's buckets.
    pub bytes: u64,
    /// Tensors in the latest version.
    pub tensors: u64,
    /// The latest version's digest, once computed.
    pub digest: Option<String>,
    /// The latest version's metadata.
    pub metadata: Value,
    /// Superseded versions that readers still hold.
    pub held_versions: Vec<u64>,
}

/// Params of `store.unpublish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnpublishParams {
    /// The bundle's name.
    pub name: String,
}

/// A store error as a JSON-RPC error.
pub fn error(e: StoreError) -> ErrorObject {
    match e {
        StoreError::NotFound(m) => ErrorObject::new(NOT_FOUND, m),
        StoreError::Forbidden(m) => ErrorObject::new(FORBIDDEN, m),
        StoreError::Budget { needed, used, budget } => {
            let mut err = ErrorObject::limit("budget_bytes", "bytes of the tensor store", used + needed, budget);
            err.message = StoreError::Budget { needed, used, budget }.to_string();
            err
        }
        e @ StoreError::DigestMismatch { .. } => ErrorObject::invalid_params("expect_digest", e.to_string()),
        e @ StoreError::Stale { .. } => ErrorObject::invalid_params("base", e.to_string()),
        StoreError::Invalid(m) => ErrorObject::invalid_params("", m),
        e @ StoreError::Io(_) => ErrorObject::internal(e),
    }
}

impl Opened {
    /// The manifest's entries, in the order published.
    pub fn entries(&self) -> Result<Vec<Entry>, String> {
        self.manifest.entries()
    }

    /// Every tensor, in the order published, as a view of the buckets (no copy), after
    /// checking that each lies inside its bucket.
    pub fn tensors(&self) -> Result<Vec<(String, ferry_core::Tensor)>, String> {
        self.entries()?
            .into_iter()
            .map(|e| {
                let bucket = self.buckets.get(e.3 as usize).ok_or_else(|| format!("{:?}: no bucket {}", e.0, e.3))?;
                if bucket.0.host_bytes().is_none() {
                    let t = crate::device_slice(&bucket.0, e.4, e.meta())
                        .ok_or_else(|| format!("{:?}: outside device bucket {}", e.0, e.3))?;
                    return Ok((e.0, t));
                }
                let bytes = bucket.0.host_bytes().ok_or_else(|| format!("bucket {} is not in host memory", e.3))?;
                let len = e.byte_len().ok_or_else(|| format!("{:?}: size overflows", e.0))?;
                let end = e.4.checked_add(len).filter(|&end| end <= bytes.len() as u64);
                let end = end.ok_or_else(|| format!("{:?}: {}+{len} is outside bucket {}", e.0, e.4, e.3))?;
                let whole = bucket.0.bytes();
                let t = ferry_core::Tensor::new(e.meta(), whole.slice(e.4 as usize..end as usize))
                    .map_err(|err| format!("{:?}: {err}", e.0))?;
                Ok((e.0, t))
            })
            .collect()
    }
}

/// Calls `store.open` on `client`.
pub async fn open(
    client: &ferry_rpc::Client,
    name: &str,
    version: Option<u64>,
    expect_digest: Option<&str>,
) -> Result<Opened, ferry_rpc::CallError> {
    let params = serde_json::json!({ "name": name, "version": version, "expect_digest": expect_digest });
    client.call("store.open", &params).await
}

fn opened(m: &Manifest, buckets: Vec<RpcTensor>, digest: Option<String>) -> Opened {
    Opened {
        name: m.name.clone(),
        version: m.version,
        digest,
        metadata: m.metadata.clone(),
        bytes: m.bytes,
        published_ms: m.published_ms,
        buckets,
        manifest: m.columns(),
    }
}

/// The store's methods, to merge into a server's table.
pub fn methods(store: Arc<Store>) -> Result<Methods, RegisterError> {
    let mut m = Methods::new();
    let s = store.clone();
    // The store's own work runs at the normal policy (Tokio's blocking pool), not as a
    // handler's compute (SCHED_IDLE by default): it takes the store's lock, and a publish
    // waiting for idle CPU under it would hold up every reader on a busy machine.
    m.register_ctx("store.publish", move |p: PublishParams, ctx: CallContext| {
        let s = s.clone();
        let job = tokio::task::spawn_blocking(move || publish(&s, p, &ctx));
        async move { job.await.map_err(|e| ErrorObject::internal(format!("the publish failed: {e}")))? }
    })?
    .summary("Publish tensors as the next version of a bundle")
    .description(
        "Copies the tensors once into the store's buckets and makes them the bundle's latest version. A name \
         belongs to the identity that first published it (FORBIDDEN for others); past the store's budget: \
         LIMIT_EXCEEDED naming budget_bytes. What a per-connection identity (QUIC without a token) published is \
         unpublished when its connection closes.",
    );
    // What a per-connection identity (QUIC without a token) published dies with its
    // connection: nobody else could ever unpublish it or reuse its names.
    let s = store.clone();
    m.on_connection_closed(move |peer| {
        if matches!(peer.identity, Identity::Connection(_)) {
            let n = s.owner_gone(&peer.identity);
            if n > 0 {
                tracing::debug!(addr = %peer.addr, n, "connection closed: the bundles it published are unpublished");
            }
        }
    });
    let s = store.clone();
    m.register("store.open", move |p: OpenParams| {
        let s = s.clone();
        async move {
            let v = s.open(&p.name, p.version).map_err(error)?;
            let digest = match &p.expect_digest {
                None => v.manifest().digest(),
                Some(want) => {
                    let man = v.manifest().clone();
                    let got = tokio::task::spawn_blocking(move || man.wait_digest())
                        .await
                        .map_err(ErrorObject::internal)?
                        .ok_or_else(|| {
                            ErrorObject::invalid_params("expect_digest", "this store computes no digests")
                        })?;
                    if &got != want {
                        return Err(error(StoreError::DigestMismatch {
                            name: p.name.clone(),
                            version: v.manifest().version,
                            expected: want.clone(),
                            actual: got,
                        }));
                    }
                    Some(got)
                }
            };
            let buckets = v.bucket_tensors().into_iter().map(RpcTensor).collect();
            Ok(opened(v.manifest(), buckets, digest))
        }
    })?
    .summary("Open a version of a bundle: its manifest and its buckets (zero-copy over shm)")
    .description(
        "The latest version unless `version` is given (a superseded version can be opened while a reader holds \
         it). Over shm each bucket is lent, not copied: the reader holds the version while it holds arrays made \
         from the buckets. NOT_FOUND for an unknown bundle or a version no longer held.",
    );
    let deltas = Arc::new(crate::delta_serve::DeltaServer::new(store.clone(), crate::delta_serve::DEFAULT_DELTA_CACHE));
    let ds = deltas.clone();
    m.register_ctx("store.delta", move |p: crate::delta::DeltaParams, ctx: CallContext| {
        let ds = ds.clone();
        async move {
            if let (Some(ms), None) = (p.wait_ms.filter(|&ms| ms > 0), p.to) {
                // A caller's long poll holds a call slot, not memory; it is still capped, so a
                // peer cannot park calls past `MAX_DELTA_WAIT_MS` (it asks again).
                let ms = ms.min(MAX_DELTA_WAIT_MS);
                ds.store().wait_latest(&p.name, p.from, std::time::Duration::from_millis(ms)).await;
            }
            let d2 = ds.clone();
            let d = tokio::task::spawn_blocking(move || d2.delta(&p))
                .await
                .map_err(ErrorObject::internal)?
                .map_err(error)?;
            if let Some(conn) = ctx.peer().conn {
                ds.count(conn, &ctx.peer().addr, &d);
            }
            Ok::<_, ErrorObject>(Delta::clone(&d))
        }
    })?
    .summary("What a reader holding version N needs to make version M: per tensor nothing, its changed elements, or the whole tensor")
    .description(
        "Per tensor of M (the latest unless `to` is given): `same` when its BLAKE3 digest is the one in N, `sparse` \
         (indices and values of the elements whose bits changed) when that is smaller than the tensor and the store \
         still has N's bytes, else `dense`. Without `from`, or when the store's N is not the reader's (`from_tree`), \
         every tensor is `dense` and `base` is null. With `wait_ms` (and no `to`), the answer waits up to that long \
         for a version other than `from` to be published (a long poll). The reader checks every digest before it \
         writes (PROTOCOL.md §23). NOT_FOUND for an unknown bundle or a version M no longer held.",
    );
    let dt = deltas.clone();
    m.register("store.delta.timings", move |_: ListParams| {
        let d = dt.clone();
        async move { Ok::<_, ErrorObject>(d.timings()) }
    })?
    .summary("The last deltas the store computed and what their parts took (digests, element comparison)")
    .inline();
    m.register("store.delta.stats", move |_: ListParams| {
        let d = deltas.clone();
        async move { Ok::<_, ErrorObject>(d.stats()) }
    })?
    .summary("Delta bytes sent to each connection by `store.delta` (what crossed the store's link per reader)")
    .inline();
    let s = store.clone();
    m.register("store.list", move |_: ListParams| {
        let s = s.clone();
        async move {
            let out: Vec<BundleInfo> = s
                .list()
                .into_iter()
                .map(|(name, st)| {
                    let l = st.latest.as_deref();
                    BundleInfo {
                        name,
                        version: l.map(|m| m.version),
                        bytes: l.map_or(0, |m| m.bytes),
                        tensors: l.map_or(0, |m| m.entries.len() as u64),
                        digest: l.and_then(Manifest::digest),
                        metadata: l.map_or(Value::Null, |m| m.metadata.clone()),
                        held_versions: st.held.iter().map(|m| m.version).collect(),
                    }
                })
                .collect();
            Ok::<_, ErrorObject>(out)
        }
    })?
    .summary("The bundles in the store")
    .inline();
    placement::register(&mut m, &store)?;
    let s = store;
    m.register_ctx("store.unpublish", move |p: UnpublishParams, ctx: CallContext| {
        let s = s.clone();
        async move {
            s.unpublish(&p.name, &Some(ctx.peer().identity.clone())).map_err(error)?;
            Ok::<_, ErrorObject>(true)
        }
    })?
    .summary("Drop a bundle's latest version (readers keep what they hold)");
    Ok(m)
}

/// `store.publish`, on a blocking-pool thread.
fn publish(s: &Arc<Store>, p: PublishParams, ctx: &CallContext) -> Result<Published, ErrorObject> {
    let tensors = p.tensors.into_iter().map(|(n, t)| (n, t.into_inner())).collect();
    let who = ctx.peer().identity.clone();
    let v = match p.base {
        Some(base) => s.publish_delta(&p.name, base, tensors, &p.removed, p.metadata, Some(who.clone())),
        None if !p.removed.is_empty() => {
            return Err(ErrorObject::invalid_params("removed", "`removed` needs `base`"));
        }
        None => s.publish(&p.name, tensors, p.metadata, Some(who.clone())),
    }
    .map_err(error)?;
    if matches!(who, Identity::Connection(_)) && ctx.connection_closed() {
        // Its connection ended while this ran, after the store let go of its bundles.
        s.owner_gone(&who);
    }
    let m = v.manifest();
    Ok(Published { name: m.name.clone(), version: m.version, bytes: m.bytes, tensors: m.entries.len() as u64 })
}
