//! Remote tensor references: a tensor that stays on the server, named by an unguessable id.
//!
//! A handler keeps a tensor with [`CallContext::keep`](crate::CallContext::keep) and returns
//! the [`TensorRef`] instead of the bytes; on the wire that is
//! `{"$tensor_ref": {"id", "dtype", "shape", "device", "bytes", "expires_ms", "published"}}`
//! (PROTOCOL.md §21). A client passes the reference back, as `{"$tensor_ref": {"id": ID}}`
//! (the other fields may be sent and are ignored), wherever a method takes a tensor: the
//! server puts the kept tensor there before the method's params are decoded, so no byte
//! moves and every method that takes an [`RpcTensor`](crate::RpcTensor) takes references.
//!
//! Built-in methods: `ferry.ref.keep {tensor, ttl_ms?}` (a client's own tensor kept as a
//! reference), `ferry.ref.fetch {ref}` (the tensor: zero-copy where the channel lends the
//! memory it lives in), `ferry.ref.free {ids}`, `ferry.ref.publish {id}` and
//! `ferry.ref.list {}`.
//!
//! - A reference belongs to the [`Identity`] that made it; to any other identity it does not
//!   exist (NOT_FOUND, as for an unknown, freed or expired id).
//! - It is freed when the connection that made it closes, unless it was published
//!   (`ferry.ref.publish`), when its TTL passes, or by `ferry.ref.free`. Made without a
//!   connection (over HTTP) and without a TTL, it lives [`RpcLimits::ref_ttl`].
//! - Only a durable identity (a local user, the server's token) may publish: a
//!   per-connection identity ([`Identity::Connection`], QUIC without a token) is refused
//!   (FORBIDDEN), since nobody could ever reach the reference after its connection, and
//!   everything it owns is freed when that connection closes.
//! - A TTL is at most [`MAX_REF_TTL`] (365 days): a longer one (`ttl_ms`, the `ttl` of
//!   [`CallContext::keep`](crate::CallContext::keep)) is refused with INVALID_PARAMS naming
//!   it, and never overflows the expiry's arithmetic.
//! - The table is bounded: [`RpcLimits::max_refs`], [`RpcLimits::max_refs_per_identity`],
//!   [`RpcLimits::max_ref_bytes`]; over one, LIMIT_EXCEEDED naming it.
//!
//! Time is passed in (`now`) so the table's tests need no clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_core::{DType, Device, Tensor};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::Error as _;
use serde::ser::SerializeMap as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::codes::{ErrorObject, FORBIDDEN, NOT_FOUND};
use crate::limits::RpcLimits;
use crate::method::Identity;

/// The longest time to live of a reference (365 days). A longer TTL is refused with
/// INVALID_PARAMS naming the option ([`check_ttl`]); [`RpcLimits::ref_ttl`] is capped to it.
pub const MAX_REF_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// `ttl` if it is at most [`MAX_REF_TTL`], else INVALID_PARAMS naming `option` (the
/// caller's name for it: `ttl_ms` on the wire, `ttl` in the Rust API).
pub fn check_ttl(option: &str, ttl: Duration) -> Result<Duration, ErrorObject> {
    if ttl <= MAX_REF_TTL {
        return Ok(ttl);
    }
    Err(ErrorObject::invalid_params(
        option,
        format!(
            "a reference lives at most 365 days ({} ms, MAX_REF_TTL); {} ms asked",
            MAX_REF_TTL.as_millis(),
            ttl.as_millis()
        ),
    ))
}

/// The reserved key of a remote tensor reference.
pub const REF_KEY: &str = "$tensor_ref";

/// What a reference says of its tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RefInfo {
    /// The reference's id: 128 random bits, `r` and 32 hex digits.
    pub id: String,
    /// The tensor's element type.
    pub dtype: DType,
    /// Its dimensions.
    pub shape: Vec<u64>,
    /// Where it lives on the server.
    pub device: Device,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it expires (milliseconds since the Unix epoch); null: when freed, or when the
    /// connection that made it closes unless published.
    pub expires_ms: Option<u64>,
    /// Whether it outlives the connection that made it.
    pub published: bool,
}

/// A remote tensor reference, as a result field (`{"$tensor_ref": RefInfo}`) or a param.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef(pub RefInfo);

impl Serialize for TensorRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(REF_KEY, &self.0)?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for TensorRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut obj = serde_json::Map::deserialize(d)?;
        let inner = obj.remove(REF_KEY).ok_or_else(|| D::Error::custom("expected {\"$tensor_ref\": {..}}"))?;
        if let Some(k) = obj.keys().next() {
            return Err(D::Error::custom(format!("unexpected key {k:?} beside \"$tensor_ref\"")));
        }
        serde_json::from_value(inner).map(TensorRef).map_err(D::Error::custom)
    }
}

impl JsonSchema for TensorRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TensorRef".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let info = g.subschema_for::<RefInfo>();
        json_schema!({
            "description": "A tensor kept on the server: pass it back where a tensor is taken (only `id` is \
                            read), fetch it with ferry.ref.fetch, free it with ferry.ref.free.",
            "type": "object",
            "required": [REF_KEY],
            "additionalProperties": false,
            "properties": { REF_KEY: info }
        })
    }
}

/// The id of `{"$tensor_ref": {"id": ID, ..}}` (and nothing else beside the key), if `v` is
/// one; `Err` for an object with the key whose inside is not that.
pub fn ref_id(v: &Value) -> Option<Result<&str, String>> {
    let Value::Object(o) = v else { return None };
    let inner = o.get(REF_KEY)?;
    if o.len() != 1 {
        return Some(Err("a tensor reference has no key beside \"$tensor_ref\"".into()));
    }
    Some(inner.get("id").and_then(Value::as_str).ok_or_else(|| "a tensor reference needs a string `id`".into()))
}

/// Where kept tensors live when something other than the table decides: ferry-store's
/// placement (a cpu tier above a disk tier, moved by a policy). Without one, the table holds
/// each tensor in memory as it was kept ([`crate::ServerBuilder::ref_backing`]).
///
/// The table still owns the references (ids, owners, TTLs, limits); the backing holds their
/// bytes. Its methods are called without the table's lock held.
pub trait RefBacking: Send + Sync + 'static {
    /// Takes over `tensor`, kept as reference `id` (it may move it to a slower tier, in the
    /// background). An error refuses the reference.
    fn keep(&self, id: &str, tensor: Tensor) -> Result<(), ErrorObject>;
    /// Reference `id`'s tensor for a use (a call's param, a fetch): its bytes stay valid and
    /// unchanged while the returned tensor (or any clone, or a reader's lease) lives.
    fn open(&self, id: &str) -> Result<Tensor, ErrorObject>;
    /// Reference `id` was freed (by `ferry.ref.free`, its TTL, or its connection closing).
    fn free(&self, id: &str);
}

struct Kept {
    /// The tensor, unless the backing holds it.
    tensor: Option<Tensor>,
    owner: Identity,
    /// The connection it dies with (`None`: published, or made without one).
    conn: Option<u64>,
    expires: Option<Instant>,
    info: RefInfo,
}

/// The server's references (one per [`crate::Server`]).
pub struct RefTable {
    limits: RpcLimits,
    kept: Mutex<HashMap<String, Kept>>,
    backing: Option<Arc<dyn RefBacking>>,
}

impl std::fmt::Debug for RefTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefTable").field("refs", &self.len()).finish()
    }
}

/// NOT_FOUND for a reference that is unknown, freed, expired or another identity's.
pub fn not_found(id: &str) -> ErrorObject {
    ErrorObject::new(
        NOT_FOUND,
        format!("Tensor reference not found: {id:.80?} (never made, freed, expired, or not yours)"),
    )
    .with_data(serde_json::json!({ "ref": id }))
}

/// `at` as milliseconds since the Unix epoch (0 before it; saturating past `u64`).
fn epoch_ms(at: Instant, now: Instant) -> u64 {
    match SystemTime::now().checked_add(at.saturating_duration_since(now)) {
        Some(wall) => wall.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => u64::MAX,
    }
}

impl RefTable {
    /// An empty table bounded by `limits`.
    pub fn new(limits: RpcLimits) -> Arc<RefTable> {
        Arc::new(RefTable { limits, kept: Mutex::new(HashMap::new()), backing: None })
    }

    /// An empty table bounded by `limits` whose tensors `backing` holds.
    pub fn with_backing(limits: RpcLimits, backing: Arc<dyn RefBacking>) -> Arc<RefTable> {
        Arc::new(RefTable { limits, kept: Mutex::new(HashMap::new()), backing: Some(backing) })
    }

    /// Tells the backing that `ids` were freed.
    fn freed(&self, ids: Vec<String>) {
        if let Some(b) = &self.backing {
            for id in ids {
                b.free(&id);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// References held now (expired ones included until the next operation drops them).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no reference is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `tensor` for `owner`; it dies with connection `conn` (if any) and after `ttl`
    /// (if any; without a connection, [`RpcLimits::ref_ttl`] by default). A `ttl` over
    /// [`MAX_REF_TTL`] is INVALID_PARAMS naming `ttl`.
    pub fn keep(
        &self,
        tensor: Tensor,
        owner: &Identity,
        conn: Option<u64>,
        ttl: Option<Duration>,
        now: Instant,
    ) -> Result<TensorRef, ErrorObject> {
        let bytes = tensor.nbytes() as u64;
        let ttl = match ttl {
            Some(t) => Some(check_ttl("ttl", t)?),
            None => conn.is_none().then_some(self.limits.ref_ttl.min(MAX_REF_TTL)),
        };
        let expires = match ttl {
            Some(t) => Some(now.checked_add(t).ok_or_else(|| {
                ErrorObject::invalid_params("ttl", "the expiry is past what this machine's clock can count")
            })?),
            None => None,
        };
        let id = crate::task::random_id('r', "a reference id")?;
        let mut kept = self.lock();
        let expired = purge(&mut kept, now);
        let l = &self.limits;
        if kept.len() >= l.max_refs {
            let n = kept.len() as u64 + 1;
            drop(kept);
            self.freed(expired);
            return Err(ErrorObject::limit("max_refs", "tensor references held", n, l.max_refs as u64));
        }
        let mine = kept.values().filter(|k| &k.owner == owner).count();
        if mine >= l.max_refs_per_identity {
            drop(kept);
            self.freed(expired);
            let (v, max) = (mine as u64 + 1, l.max_refs_per_identity as u64);
            return Err(ErrorObject::limit("max_refs_per_identity", "tensor references held by one identity", v, max));
        }
        let used: u64 = kept.values().map(|k| k.info.bytes).sum();
        if used + bytes > l.max_ref_bytes {
            drop(kept);
            self.freed(expired);
            return Err(ErrorObject::limit(
                "max_ref_bytes",
                "bytes held by tensor references",
                used + bytes,
                l.max_ref_bytes,
            ));
        }
        let info = RefInfo {
            id: id.clone(),
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            device: tensor.device(),
            bytes,
            expires_ms: expires.map(|e| epoch_ms(e, now)),
            published: false,
        };
        let held = if self.backing.is_some() { None } else { Some(tensor.clone()) };
        kept.insert(id.clone(), Kept { tensor: held, owner: owner.clone(), conn, expires, info: info.clone() });
        drop(kept);
        self.freed(expired);
        if let Some(b) = &self.backing
            && let Err(e) = b.keep(&id, tensor)
        {
            self.lock().remove(&id);
            return Err(e);
        }
        Ok(TensorRef(info))
    }

    /// The tensor `id` names, if `who` owns it.
    pub fn get(&self, id: &str, who: &Identity, now: Instant) -> Result<Tensor, ErrorObject> {
        let mut kept = self.lock();
        let expired = purge(&mut kept, now);
        let held = kept.get(id).filter(|k| &k.owner == who).map(|k| k.tensor.clone());
        drop(kept);
        self.freed(expired);
        match (held, &self.backing) {
            (Some(Some(t)), _) => Ok(t),
            (Some(None), Some(b)) => b.open(id),
            _ => Err(not_found(id)),
        }
    }

    /// What reference `id` says of its tensor, if `who` owns it (no use of the tensor).
    pub fn info(&self, id: &str, who: &Identity, now: Instant) -> Result<RefInfo, ErrorObject> {
        let mut kept = self.lock();
        let expired = purge(&mut kept, now);
        let info = kept.get(id).filter(|k| &k.owner == who).map(|k| k.info.clone());
        drop(kept);
        self.freed(expired);
        info.ok_or_else(|| not_found(id))
    }

    /// Frees the references `ids` that `who` owns; the count freed (unknown ids are skipped:
    /// freeing is idempotent).
    pub fn free(&self, ids: &[String], who: &Identity, now: Instant) -> usize {
        let mut kept = self.lock();
        let mut gone = purge(&mut kept, now);
        let mut n = 0;
        for id in ids {
            if kept.get(id).is_some_and(|k| &k.owner == who) {
                kept.remove(id);
                gone.push(id.clone());
                n += 1;
            }
        }
        drop(kept);
        self.freed(gone);
        n
    }

    /// Lets `id` outlive its connection (its TTL, if any, still holds). FORBIDDEN for a
    /// per-connection identity (see the module docs).
    pub fn publish(&self, id: &str, who: &Identity, now: Instant) -> Result<TensorRef, ErrorObject> {
        if matches!(who, Identity::Connection(_)) {
            return Err(ErrorObject::new(
                FORBIDDEN,
                "this connection has no durable identity (QUIC without a token): its tensor references die with \
                 it, and no other connection could use one. Give the server a token (`ferry serve --token`, \
                 FERRY_TOKEN) and present it to publish references",
            ));
        }
        let mut kept = self.lock();
        let expired = purge(&mut kept, now);
        let r = kept.get_mut(id).filter(|k| &k.owner == who).map(|k| {
            k.conn = None;
            k.info.published = true;
            TensorRef(k.info.clone())
        });
        drop(kept);
        self.freed(expired);
        r.ok_or_else(|| not_found(id))
    }

    /// `who`'s references.
    pub fn list(&self, who: &Identity, now: Instant) -> Vec<TensorRef> {
        let mut kept = self.lock();
        let expired = purge(&mut kept, now);
        let mut out: Vec<_> = kept.values().filter(|k| &k.owner == who).map(|k| TensorRef(k.info.clone())).collect();
        drop(kept);
        self.freed(expired);
        out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        out
    }

    /// Whether connection `conn` made references that die with it (unpublished).
    pub fn held_by_connection(&self, conn: u64) -> bool {
        self.lock().values().any(|k| k.conn == Some(conn))
    }

    /// Connection `conn` closed: its unpublished references are freed, and every reference
    /// of its own identity if it was one ([`Identity::Connection`]); the count.
    pub fn connection_closed(&self, conn: u64) -> usize {
        let mut kept = self.lock();
        let gone: Vec<String> = kept
            .iter()
            .filter(|(_, k)| k.conn == Some(conn) || k.owner == Identity::Connection(conn))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            kept.remove(id);
        }
        drop(kept);
        let n = gone.len();
        self.freed(gone);
        n
    }

    /// Replaces every `{"$tensor_ref": {"id"}}` in `params` by `{"$tensor": i}`, the kept
    /// tensors appended to a copy of `tensors` (cheap clones: no byte moves), returned when
    /// there was any reference. NOT_FOUND for an id `who` does not hold; INVALID_PARAMS for
    /// a malformed reference (the key is reserved).
    pub fn resolve(
        &self,
        params: &mut Value,
        tensors: &[Tensor],
        who: &Identity,
    ) -> Result<Option<Vec<Tensor>>, ErrorObject> {
        let now = Instant::now();
        let mut out: Option<Vec<Tensor>> = None;
        let mut walk = |v: &mut Value| -> Result<bool, ErrorObject> {
            let Some(id) = ref_id(v) else { return Ok(false) };
            let id = id.map_err(|m| ErrorObject::invalid_params("", m))?;
            let t = self.get(id, who, now)?;
            let all = out.get_or_insert_with(|| tensors.to_vec());
            all.push(t);
            *v = serde_json::json!({ crate::tensor::TENSOR_KEY: all.len() - 1 });
            Ok(true)
        };
        visit(params, &mut walk)?;
        Ok(out)
    }
}

/// Calls `f` on every value of `v`, depth first, not descending into one `f` replaced.
fn visit(v: &mut Value, f: &mut impl FnMut(&mut Value) -> Result<bool, ErrorObject>) -> Result<(), ErrorObject> {
    if f(v)? {
        return Ok(());
    }
    match v {
        Value::Array(a) => a.iter_mut().try_for_each(|x| visit(x, f)),
        Value::Object(o) => o.values_mut().try_for_each(|x| visit(x, f)),
        _ => Ok(()),
    }
}

/// Drops the expired references; their ids.
fn purge(kept: &mut HashMap<String, Kept>, now: Instant) -> Vec<String> {
    let gone: Vec<String> =
        kept.iter().filter(|(_, k)| k.expires.is_some_and(|e| e <= now)).map(|(id, _)| id.clone()).collect();
    for id in &gone {
        kept.remove(id);
    }
    gone
}

/// Params of `ferry.ref.keep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeepParams {
    /// The tensor to keep (copied out of the message into memory of the server's own).
    pub tensor: crate::RpcTensor,
    /// Free it after this many milliseconds.
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// Params of `ferry.ref.fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchParams {
    /// The reference (`{"$tensor_ref": {"id"}}`).
    #[serde(rename = "ref")]
    pub reference: crate::RpcTensor,
}

/// Params of `ferry.ref.free`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FreeParams {
    /// The ids of the references to free.
    pub ids: Vec<String>,
}

/// Params of `ferry.ref.publish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishParams {
    /// The reference's id.
    pub id: String,
}

/// Params of `ferry.ref.list` (none).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRefsParams {}

/// Result of `ferry.ref.free`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Freed {
    /// How many of the ids were the caller's and are now freed.
    pub freed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: usize) -> Tensor {
        Tensor::from_slice(vec![n as u64], &vec![1.0f32; n]).unwrap()
    }

    #[test]
    fn a_per_connection_identity_cannot_publish_and_its_references_die_with_it() {
        let table = RefTable::new(RpcLimits::default().max_refs(2));
        let now = Instant::now();
        let who = Identity::Connection(9);
        let a = table.keep(t(4), &who, Some(9), None, now).unwrap();
        let e = table.publish(&a.0.id, &who, now).unwrap_err();
        assert_eq!(e.code, FORBIDDEN);
        assert!(e.message.contains("token"), "{}", e.message);
        assert!(!table.info(&a.0.id, &who, now).unwrap().published);
        table.keep(t(4), &who, Some(9), None, now).unwrap();
        assert!(table.keep(t(4), &Identity::Token, None, None, now).is_err(), "max_refs is full");
        // Closing another connection frees nothing; its own frees everything it owned.
        assert_eq!(table.connection_closed(10), 0);
        assert_eq!(table.connection_closed(9), 2);
        assert!(table.is_empty());
        let b = table.keep(t(4), &Identity::Token, None, None, now).unwrap();
        assert!(table.publish(&b.0.id, &Identity::Token, now).unwrap().0.published, "a token may publish");
    }

    #[test]
    fn owners_connections_ttls_and_limits() {
        let table = RefTable::new(RpcLimits::default().max_refs(3).max_ref_bytes(1000));
        let (me, you) = (Identity::Uid(1), Identity::Uid(2));
        let now = Instant::now();
        let a = table.keep(t(10), &me, Some(7), None, now).unwrap();
        assert!(a.0.id.starts_with('r') && a.0.id.len() == 33 && a.0.expires_ms.is_none());
        assert_eq!(table.get(&a.0.id, &me, now).unwrap().shape(), &[10]);
        assert_eq!(table.get(&a.0.id, &you, now).unwrap_err().code, NOT_FOUND, "foreign = unknown");
        assert_eq!(table.free(std::slice::from_ref(&a.0.id), &you, now), 0);
        // A TTL: gone once it passes.
        let b = table.keep(t(10), &me, Some(7), Some(Duration::from_secs(5)), now).unwrap();
        assert!(b.0.expires_ms.is_some());
        assert!(table.get(&b.0.id, &me, now + Duration::from_secs(4)).is_ok());
        assert_eq!(table.get(&b.0.id, &me, now + Duration::from_secs(6)).unwrap_err().code, NOT_FOUND);
        // Without a connection: ref_ttl.
        let c = table.keep(t(10), &me, None, None, now).unwrap();
        assert!(c.0.expires_ms.is_some());
        // Limits name themselves.
        let d = table.keep(t(10), &me, Some(8), None, now).unwrap();
        let e = table.keep(t(10), &me, Some(8), None, now).unwrap_err();
        assert!(e.message.contains("max_refs"), "{}", e.message);
        assert!(table.keep(t(10), &you, Some(9), None, now).is_err());
        table.free(std::slice::from_ref(&d.0.id), &me, now);
        let e = table.keep(t(1000), &me, Some(8), None, now).unwrap_err();
        assert!(e.message.contains("max_ref_bytes"), "{}", e.message);
        // Closing connection 7 frees a, not the published one.
        table.publish(&a.0.id, &me, now).unwrap();
        let f = table.keep(t(10), &me, Some(7), None, now).unwrap();
        assert_eq!(table.connection_closed(7), 1);
        assert!(table.get(&a.0.id, &me, now).is_ok() && table.get(&f.0.id, &me, now).is_err());
        assert_eq!(table.list(&me, now).len(), 2);
        assert!(table.list(&you, now).is_empty());
    }

    #[test]
    fn a_ttl_over_max_ref_ttl_is_refused_naming_it_and_never_overflows() {
        let me = Identity::Uid(1);
        let now = Instant::now();
        let table = RefTable::new(RpcLimits::default());
        for ttl in [MAX_REF_TTL + Duration::from_millis(1), Duration::from_millis(u64::MAX), Duration::MAX] {
            let e = table.keep(t(1), &me, Some(1), Some(ttl), now).unwrap_err();
            assert_eq!(e.code, crate::codes::INVALID_PARAMS, "{ttl:?}");
            assert!(e.message.contains("ttl") && e.message.contains("MAX_REF_TTL"), "{}", e.message);
        }
        assert!(table.is_empty());
        let max = table.keep(t(1), &me, Some(1), Some(MAX_REF_TTL), now).unwrap();
        let in_a_year = SystemTime::now() + MAX_REF_TTL;
        let ms = in_a_year.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let got = max.0.expires_ms.unwrap();
        assert!(got.abs_diff(ms) < 60_000, "expires_ms {got}, about {ms}");
        // A ref_ttl set past the maximum (the field is public) is capped, not overflowed.
        let limits = RpcLimits { ref_ttl: Duration::MAX, ..RpcLimits::default() };
        let capped = RefTable::new(limits).keep(t(1), &me, None, None, now).unwrap();
        assert!(capped.0.expires_ms.unwrap().abs_diff(ms) < 60_000);
        assert_eq!(RpcLimits::default().ref_ttl(Duration::MAX).ref_ttl, MAX_REF_TTL);
    }

    #[test]
    fn params_get_the_kept_tensors_in_place_of_references() {
        let table = RefTable::new(RpcLimits::default());
        let me = Identity::Uid(1);
        let a = table.keep(t(4), &me, Some(1), None, Instant::now()).unwrap();
        let mut params = serde_json::json!({"x": {"$tensor": 0}, "y": [serde_json::to_value(&a).unwrap()]});
        let tensors = vec![t(2)];
        let all = table.resolve(&mut params, &tensors, &me).unwrap().unwrap();
        assert_eq!(params, serde_json::json!({"x": {"$tensor": 0}, "y": [{"$tensor": 1}]}));
        assert_eq!(all[1].shape(), &[4]);
        let mut plain = serde_json::json!({"x": [1, {"y": 2}]});
        assert!(table.resolve(&mut plain, &tensors, &me).unwrap().is_none(), "no copy without a reference");
        let mut bad = serde_json::json!([{"$tensor_ref": {"id": "r00"}}]);
        assert_eq!(table.resolve(&mut bad, &tensors, &me).unwrap_err().code, NOT_FOUND);
        let mut bad = serde_json::json!([{"$tensor_ref": {"id": 3}}]);
        assert_eq!(table.resolve(&mut bad, &tensors, &me).unwrap_err().code, crate::codes::INVALID_PARAMS);
        let mut other = serde_json::json!([{"$tensor_ref": {"id": a.0.id}}]);
        assert_eq!(table.resolve(&mut other, &tensors, &Identity::Uid(2)).unwrap_err().code, NOT_FOUND);
    }
}
