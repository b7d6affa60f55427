//! Replaying a trace through a policy: bytes moved, hit rate, and stall time on a modelled
//! link.

use std::collections::HashMap;

use super::trace::Trace;
use super::{Key, Policy, View};

/// A link between the tiers and the compute between uses, for stall times: copies go one
/// at a time at `bytes_per_s`, and each use computes for `compute_s` once its tensor is in.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// The copy bandwidth, bytes per second.
    pub bytes_per_s: f64,
    /// Compute per use, seconds.
    pub compute_s: f64,
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The policy's name.
    pub policy: String,
    /// Uses replayed.
    pub uses: usize,
    /// Uses that found their tensor resident (or arriving: prefetched).
    pub hits: usize,
    /// Bytes moved up into the fast tier (misses and prefetches).
    pub bytes_moved: u64,
    /// Of those, bytes prefetched ahead of use.
    pub bytes_prefetched: u64,
    /// Of those, bytes prefetched and evicted before any use (moved for nothing).
    pub bytes_wasted: u64,
    /// Time uses waited for copies (with a [`Link`]; else zero).
    pub stall_s: f64,
    /// Time the copies that uses needed took on the link (wasted prefetches not counted, so
    /// that they cannot raise [`Report::hidden`]; with a [`Link`]; else zero).
    pub transfer_s: f64,
    /// The whole run: compute plus stalls (with a [`Link`]; else zero).
    pub total_s: f64,
}

impl Report {
    /// Hits over uses.
    pub fn hit_rate(&self) -> f64 {
        if self.uses == 0 { 0.0 } else { self.hits as f64 / self.uses as f64 }
    }

    /// The share of needed copy time hidden behind compute (1: no stall).
    pub fn hidden(&self) -> f64 {
        if self.transfer_s <= 0.0 { 1.0 } else { 1.0 - (self.stall_s / self.transfer_s).min(1.0) }
    }
}

/// A policy broke the rules (evicted what was not resident, or overfilled the tier).
#[derive(Debug, thiserror::Error)]
#[error("policy {policy} at use {step}: {what}")]
pub struct PolicyBug {
    /// The policy.
    pub policy: String,
    /// The use at which it happened.
    pub step: usize,
    /// What it did.
    pub what: String,
}

/// Begins a run of `trace` through `policy`: a trace whose order is known is declared to
/// the policy as its schedule; returns the empty report.
pub fn start(trace: &Trace, policy: &mut dyn Policy) -> Report {
    if trace.known_order {
        let all: Vec<(Key, u64)> = trace.uses.iter().map(|u| (u.key, u.bytes)).collect();
        policy.schedule(&all);
    }
    Report {
        policy: policy.name(),
        uses: trace.uses.len(),
        hits: 0,
        bytes_moved: 0,
        bytes_prefetched: 0,
        bytes_wasted: 0,
        stall_s: 0.0,
        transfer_s: 0.0,
        total_s: 0.0,
    }
}

/// Replays `trace` through `policy` with a fast tier of `budget` bytes. A trace whose order
/// is known is declared to the policy as its schedule first.
pub fn replay(trace: &Trace, policy: &mut dyn Policy, budget: u64, link: Option<Link>) -> Result<Report, PolicyBug> {
    let mut r = start(trace, policy);
    let mut view = View::new(budget);
    let mut clock = Clock { now: 0.0, link_free: 0.0, link };
    // Prefetched tensors not used yet: when they arrive, how long their copy took, size.
    let mut arrives: HashMap<Key, (f64, f64, u64)> = HashMap::new();
    for (t, u) in trace.uses.iter().enumerate() {
        let hit = view.contains(u.key);
        if hit {
            r.hits += 1;
            if let Some((at, took, _)) = arrives.remove(&u.key) {
                r.transfer_s += took;
                r.stall_s += clock.wait_until(at);
            }
        } else {
            r.bytes_moved += u.bytes;
            let (at, took) = clock.copy(u.bytes);
            r.transfer_s += took;
            r.stall_s += clock.wait_until(at);
        }
        clock.compute();
        let d = policy.after_use(t, u.key, u.bytes, hit, &view);
        view.apply(&d, u.key, u.bytes).map_err(|what| PolicyBug { policy: r.policy.clone(), step: t, what })?;
        for &(k, b) in &d.prefetch {
            r.bytes_moved += b;
            r.bytes_prefetched += b;
            let (at, took) = clock.copy(b);
            arrives.insert(k, (at, took, b));
        }
        arrives.retain(|k, &mut (_, _, b)| {
            let kept = view.contains(*k);
            if !kept {
                r.bytes_wasted += b;
            }
            kept
        });
    }
    r.total_s = clock.now;
    Ok(r)
}

/// Time on the modelled link.
struct Clock {
    now: f64,
    link_free: f64,
    link: Option<Link>,
}

impl Clock {
    /// Queues a copy of `bytes` on the link; returns when it is done and how long it takes.
    fn copy(&mut self, bytes: u64) -> (f64, f64) {
        let Some(l) = self.link else { return (self.now, 0.0) };
        let took = bytes as f64 / l.bytes_per_s;
        self.link_free = self.link_free.max(self.now) + took;
        (self.link_free, took)
    }

    /// Waits until `at`; returns the stall.
    fn wait_until(&mut self, at: f64) -> f64 {
        let stall = (at - self.now).max(0.0);
        self.now += stall;
        stall
    }

    fn compute(&mut self) {
        if let Some(l) = self.link {
            self.now += l.compute_s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::trace::{self, Use};
    use crate::placement::{Flow, FlowOptions, Genoa, Lru, Min, Pinned, by_name};

    const MB: u64 = 1 << 20;

    fn run(trace: &Trace, p: &mut dyn Policy, budget: u64) -> Report {
        replay(trace, p, budget, None).unwrap()
    }

    fn keys(t: &Trace) -> Vec<Key> {
        t.uses.iter().map(|u| u.key).collect()
    }

    fn small_trace(keys: &[Key]) -> Trace {
        Trace { name: "t".into(), uses: keys.iter().map(|&key| Use { key, bytes: MB }).collect(), known_order: false }
    }

    #[test]
    fn every_policy_keeps_within_budget_on_every_trace() {
        let traces = [
            trace::layers(12, 3 * MB, 4),
            trace::zipf(500, 1.0, 5_000, MB, 1),
            trace::zipf_with_scans(300, 0.9, 3_000, MB, 500, 100, 2),
        ];
        for t in &traces {
            for budget in [MB / 2, 5 * MB, 40 * MB, 1 << 40] {
                for name in ["pinned", "genoa", "lru", "flow"] {
                    let mut p = by_name(name).unwrap();
                    let r = replay(t, p.as_mut(), budget, None).unwrap_or_else(|e| panic!("{}: {e}", t.name));
                    assert_eq!(r.uses, t.uses.len());
                }
                let mut m = Min::new(&keys(t));
                replay(t, &mut m, budget, None).unwrap();
            }
        }
    }

    #[test]
    fn belady_beats_lru_where_lru_thrashes() {
        // A loop over 4 tensors with room for 3: LRU misses every time, MIN keeps 2 of 3.
        let t = small_trace(&[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(run(&t, &mut Lru::default(), 3 * MB).hits, 0);
        let min = run(&t, &mut Min::new(&keys(&t)), 3 * MB);
        assert_eq!(min.hits, 6, "{min:?}");
    }

    #[test]
    fn min_is_optimal_on_a_small_trace() {
        // Checked against an exhaustive search over every eviction choice.
        let t = small_trace(&[0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 1, 4, 2, 0, 3]);
        let min = run(&t, &mut Min::new(&keys(&t)), 3 * MB);
        assert_eq!(t.uses.len() - min.hits, best_misses(&keys(&t), 3));
    }

    /// Fewest misses with room for `cap` equal tensors, by trying every choice.
    fn best_misses(keys: &[Key], cap: usize) -> usize {
        fn go(keys: &[Key], cap: usize, held: &mut Vec<Key>) -> usize {
            let Some((&k, rest)) = keys.split_first() else { return 0 };
            if held.contains(&k) {
                return go(rest, cap, held);
            }
            // Bypass, or keep (evicting each possible victim when full).
            let mut best = 1 + go(rest, cap, held);
            if held.len() < cap {
                held.push(k);
                best = best.min(1 + go(rest, cap, held));
                held.pop();
            } else {
                for i in 0..held.len() {
                    let old = std::mem::replace(&mut held[i], k);
                    best = best.min(1 + go(rest, cap, held));
                    held[i] = old;
                }
            }
            best
        }
        go(keys, cap, &mut Vec::new())
    }

    #[test]
    fn genoa_keeps_nothing_and_pinned_never_moves() {
        let t = small_trace(&[0, 1, 0, 1, 2, 0]);
        let g = run(&t, &mut Genoa, 10 * MB);
        assert_eq!((g.hits, g.bytes_moved), (0, 6 * MB));
        let p = run(&t, &mut Pinned::keys([0]), 10 * MB);
        assert_eq!(p.hits, 2, "{p:?}");
    }

    #[test]
    fn flow_keeps_the_hot_set_through_a_scan() {
        // A hot set of 8 used over and over, with scans of 40 cold tensors between: LRU
        // loses the hot set to every scan, S3-FIFO keeps it (the scan never leaves probation).
        let mut ks = Vec::new();
        let mut cold = 100;
        for _ in 0..20 {
            for _ in 0..5 {
                ks.extend(0..8);
            }
            ks.extend(cold..cold + 40);
            cold += 40;
        }
        let t = small_trace(&ks);
        let lru = run(&t, &mut Lru::default(), 10 * MB);
        let flow = run(&t, &mut Flow::new(FlowOptions::default()), 10 * MB);
        assert!(flow.hits > lru.hits + 19 * 8 / 2, "flow {} hits, lru {}", flow.hits, lru.hits);
    }

    #[test]
    fn flow_with_a_schedule_prefetches_and_hides_copies() {
        // 12 layers of 3 MiB, room for 4 layers: copies of 3 MiB take 1 ms at 3 GB/s and each
        // layer computes 2 ms, so with the order known every copy can hide behind compute.
        let t = trace::layers(12, 3 * MB, 5);
        let link = Some(Link { bytes_per_s: 3.0 * MB as f64 * 1000.0, compute_s: 0.002 });
        let flow = replay(&t, &mut Flow::new(FlowOptions::default()), 12 * MB, link).unwrap();
        let lru = replay(&t, &mut Lru::default(), 12 * MB, link).unwrap();
        assert!(flow.bytes_prefetched > 0);
        assert!(flow.hidden() > 0.95, "{flow:?}");
        assert!(lru.hidden() < 0.05, "{lru:?}");
        // And it moves no more than MIN.
        let min = run(&t, &mut Min::new(&keys(&t)), 12 * MB);
        assert!(flow.bytes_moved <= min.bytes_moved + 12 * 3 * MB, "flow {} min {}", flow.bytes_moved, min.bytes_moved);
    }

    #[test]
    fn a_pinned_tensor_is_never_evicted() {
        let opts = FlowOptions { pinned: [7].into(), ..FlowOptions::default() };
        let mut ks = vec![7];
        ks.extend(100..150);
        ks.push(7);
        let t = small_trace(&ks);
        let r = run(&t, &mut Flow::new(opts), 4 * MB);
        assert_eq!(r.hits, 1, "the pinned tensor's second use hits: {r:?}");
    }

    #[test]
    fn a_trace_saves_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let t = trace::zipf(50, 1.0, 200, MB, 3);
        let path = dir.path().join("run.jsonl");
        t.save(&path).unwrap();
        let back = Trace::load(&path, false).unwrap();
        assert_eq!(back.uses, t.uses);
        std::fs::write(&path, "{\"key\": 1}\n").unwrap();
        let e = Trace::load(&path, false).unwrap_err().to_string();
        assert!(e.contains("run.jsonl:1"), "{e}");
    }
}
