//! Belady's MIN: the optimal offline policy, given the whole trace.

use std::collections::{BTreeSet, HashMap};

use super::{Decision, Key, Policy, View};

/// Evicts the resident tensor whose next use is farthest ahead, and does not keep a tensor
/// used later than every resident one (or never again). Optimal in misses for tensors of
/// equal size; a strong heuristic otherwise.
#[derive(Debug)]
pub struct Min {
    /// For each step, the step of the next use of the same key (`usize::MAX`: none).
    next: Vec<usize>,
    /// Residents by their next use, farthest last.
    by_next: BTreeSet<(usize, Key)>,
    next_of: HashMap<Key, usize>,
}

impl Min {
    /// MIN for this sequence of uses (the trace's keys, in order).
    pub fn new(keys: &[Key]) -> Min {
        let mut next = vec![usize::MAX; keys.len()];
        let mut seen: HashMap<Key, usize> = HashMap::new();
        for (i, &k) in keys.iter().enumerate().rev() {
            if let Some(&j) = seen.get(&k) {
                next[i] = j;
            }
            seen.insert(k, i);
        }
        Min { next, by_next: BTreeSet::new(), next_of: HashMap::new() }
    }

    fn set_next(&mut self, key: Key, at: Option<usize>) {
        if let Some(old) = self.next_of.remove(&key) {
            self.by_next.remove(&(old, key));
        }
        if let Some(at) = at {
            self.next_of.insert(key, at);
            self.by_next.insert((at, key));
        }
    }
}

impl Policy for Min {
    fn name(&self) -> String {
        "min".into()
    }

    fn after_use(&mut self, t: usize, key: Key, bytes: u64, _hit: bool, view: &View) -> Decision {
        let next = self.next.get(t).copied().unwrap_or(usize::MAX);
        self.set_next(key, None);
        let mut d = Decision::default();
        if next == usize::MAX || bytes > view.budget() {
            return d;
        }
        let mut used = view.used().saturating_sub(if view.contains(key) { bytes } else { 0 });
        let mut victims = Vec::new();
        for &(at, k) in self.by_next.iter().rev() {
            if used + bytes <= view.budget() || at < next {
                break;
            }
            used -= view.bytes_of(k).unwrap_or(0);
            victims.push(k);
        }
        if used + bytes > view.budget() {
            // Everything resident is needed sooner: use this one and let it go.
            return d;
        }
        for &v in &victims {
            self.set_next(v, None);
        }
        d.evict = victims;
        d.keep = true;
        self.set_next(key, Some(next));
        d
    }
}
