//! The simple policies: pinned, genoa, LRU.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Decision, Key, Policy, View};

/// A fixed set stays resident; nothing else ever moves (it is used in place from the slow
/// tier). With no set given, the first tensors used that fit the budget are pinned.
#[derive(Debug, Default)]
pub struct Pinned {
    set: Option<HashSet<Key>>,
}

impl Pinned {
    /// Pins exactly `keys` (those that fit, in the order they are first used).
    pub fn keys(keys: impl IntoIterator<Item = Key>) -> Pinned {
        Pinned { set: Some(keys.into_iter().collect()) }
    }
}

impl Policy for Pinned {
    fn name(&self) -> String {
        "pinned".into()
    }

    fn after_use(&mut self, _t: usize, key: Key, bytes: u64, hit: bool, view: &View) -> Decision {
        let wanted = self.set.as_ref().is_none_or(|s| s.contains(&key));
        Decision { keep: hit || (wanted && bytes <= view.free()), ..Decision::default() }
    }
}

/// Promote for the use, demote right after: nothing stays in the fast tier.
#[derive(Debug, Default)]
pub struct Genoa;

impl Policy for Genoa {
    fn name(&self) -> String {
        "genoa".into()
    }

    fn after_use(&mut self, _t: usize, _key: Key, _bytes: u64, _hit: bool, _view: &View) -> Decision {
        Decision::default()
    }
}

/// Keeps what was used; evicts the least recently used.
#[derive(Debug, Default)]
pub struct Lru {
    /// Last use -> key, oldest first.
    order: BTreeMap<usize, Key>,
    last: HashMap<Key, usize>,
}

impl Policy for Lru {
    fn name(&self) -> String {
        "lru".into()
    }

    fn after_use(&mut self, t: usize, key: Key, bytes: u64, _hit: bool, view: &View) -> Decision {
        if let Some(old) = self.last.insert(key, t) {
            self.order.remove(&old);
        }
        self.order.insert(t, key);
        if bytes > view.budget() {
            self.order.remove(&t);
            self.last.remove(&key);
            return Decision::default();
        }
        let mut need = if view.contains(key) { 0 } else { bytes.saturating_sub(view.free()) };
        let mut evict = Vec::new();
        while need > 0 {
            // Every key in `order` but `key` is resident: LRU keeps all it uses.
            let Some((&at, &victim)) = self.order.iter().find(|&(_, &k)| k != key) else { break };
            self.order.remove(&at);
            self.last.remove(&victim);
            let size = view.bytes_of(victim).unwrap_or(0);
            need = need.saturating_sub(size);
            evict.push(victim);
        }
        Decision { keep: need == 0, evict, prefetch: Vec::new() }
    }

    fn forget(&mut self, key: Key) {
        if let Some(at) = self.last.remove(&key) {
            self.order.remove(&at);
        }
    }
}
