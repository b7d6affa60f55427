//! Serving `store.delta` to many readers: a small cache of the latest deltas, so that a
//! publisher's new version is diffed once for all the subscribers at the same version,
//! and a count of the delta bytes sent to each connection (`store.delta.stats`), so that
//! "each changed byte crosses the link once per subscriber" can be checked.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::delta::{Delta, DeltaParams, DeltaTimes};
use crate::{Store, StoreError};

/// Deltas a store keeps by default ([`DeltaServer::new`]).
pub const DEFAULT_DELTA_CACHE: usize = 4;

/// What identifies a delta: the bundle, the reader's version (number and tree digest), the
/// version wanted (number and publication time, so a republished number is another key),
/// and whether sparse tensors are allowed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    name: String,
    from: Option<u64>,
    from_tree: Option<String>,
    to: u64,
    published_ms: u64,
    sparse: bool,
}

/// A delta, computed once (the first reader that asks computes it; the others wait).
type Slot = Arc<Mutex<Option<Arc<Delta>>>>;

/// Delta bytes sent to one connection.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct DeltaStat {
    /// The connection's number.
    pub conn: u64,
    /// The address it connected to (or came from).
    pub addr: String,
    /// Deltas answered.
    pub deltas: u64,
    /// Bytes of tensor data in them (dense data, sparse indices and values).
    pub sent_bytes: u64,
    /// Bytes of the versions they made (what whole transfers would have sent).
    pub full_bytes: u64,
}

/// One delta the store computed (`store.delta.timings`): where the time between a
/// publish and the readers' answers went on the store's side.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DeltaTiming {
    /// The bundle.
    pub name: String,
    /// The version it is from (`None`: from nothing).
    pub from: Option<u64>,
    /// The version it makes.
    pub to: u64,
    /// When that version was published (milliseconds since the Unix epoch).
    pub published_ms: u64,
    /// When the computation started (milliseconds since the Unix epoch, fractional).
    pub started_ms: f64,
    /// What its parts took.
    pub times: DeltaTimes,
    /// Bytes of tensor data in it.
    pub sent_bytes: u64,
}

/// Computations [`DeltaServer`] remembers for `store.delta.timings`.
pub const DELTA_TIMINGS_KEPT: usize = 16;

/// The cache and the counts behind `store.delta` and `store.delta.stats`.
#[derive(Debug)]
pub struct DeltaServer {
    store: Arc<Store>,
    capacity: usize,
    cache: Mutex<VecDeque<(Key, Slot)>>,
    stats: Mutex<HashMap<u64, DeltaStat>>,
    timings: Mutex<VecDeque<DeltaTiming>>,
}

fn now_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

impl DeltaServer {
    /// Serves `store`'s deltas, keeping the latest `capacity` of them (0: none).
    pub fn new(store: Arc<Store>, capacity: usize) -> DeltaServer {
        DeltaServer {
            store,
            capacity,
            cache: Mutex::new(VecDeque::new()),
            stats: Mutex::new(HashMap::new()),
            timings: Mutex::new(VecDeque::new()),
        }
    }

    /// The store served.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// [`Store::delta_timed`], remembered for [`DeltaServer::timings`].
    fn compute(&self, p: &DeltaParams) -> Result<Delta, StoreError> {
        let started_ms = now_ms();
        let (d, times) = self.store.delta_timed(p)?;
        let mut t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        t.push_back(DeltaTiming {
            name: d.name.clone(),
            from: d.base,
            to: d.version,
            published_ms: d.published_ms,
            started_ms,
            times,
            sent_bytes: d.sent_bytes,
        });
        while t.len() > DELTA_TIMINGS_KEPT {
            t.pop_front();
        }
        Ok(d)
    }

    /// The last deltas computed (at most [`DELTA_TIMINGS_KEPT`]), oldest first.
    pub fn timings(&self) -> Vec<DeltaTiming> {
        self.timings.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    /// [`Store::delta`], from the cache when another reader asked for the same one.
    /// Blocking (call it off an async runtime's threads).
    pub fn delta(&self, p: &DeltaParams) -> Result<Arc<Delta>, StoreError> {
        if self.capacity == 0 {
            return self.compute(p).map(Arc::new);
        }
        let m = self.store.open(&p.name, p.to)?;
        let key = Key {
            name: p.name.clone(),
            from: p.from,
            from_tree: p.from_tree.clone(),
            to: m.manifest().version,
            published_ms: m.manifest().published_ms,
            sparse: p.sparse,
        };
        let slot = {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match c.iter().find(|(k, _)| *k == key) {
                Some((_, s)) => s.clone(),
                None => {
                    let s: Slot = Arc::default();
                    c.push_back((key, s.clone()));
                    while c.len() > self.capacity {
                        c.pop_front();
                    }
                    s
                }
            }
        };
        let mut got = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = &*got {
            return Ok(d.clone());
        }
        let d = Arc::new(self.compute(&DeltaParams { to: Some(m.manifest().version), ..p.clone() })?);
        *got = Some(d.clone());
        Ok(d)
    }

    /// Counts `d` as sent to connection `conn` (at `addr`).
    pub fn count(&self, conn: u64, addr: &str, d: &Delta) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let e = s.entry(conn).or_insert_with(|| DeltaStat { conn, addr: addr.to_owned(), ..DeltaStat::default() });
        e.deltas += 1;
        e.sent_bytes += d.sent_bytes;
        e.full_bytes += d.full_bytes;
    }

    /// The counts per connection, by connection number.
    pub fn stats(&self) -> Vec<DeltaStat> {
        let mut v: Vec<DeltaStat> = self.stats.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        v.sort_by_key(|s| s.conn);
        v
    }
}
