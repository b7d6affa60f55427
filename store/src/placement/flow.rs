//! Flow: S3-FIFO with pinning, a maximum reuse distance and a declared schedule.
//!
//! Without a schedule, admission and eviction are S3-FIFO's (Yang et al., SOSP 2023): a
//! tensor first enters a small probation queue (`small_fraction` of the budget); evicted
//! from there it goes to the main queue if it was used again meanwhile, else out, its key
//! remembered in a ghost list; a ghost used again enters the main queue directly. The main
//! queue evicts in FIFO order, giving a tensor used since its last pass one more round
//! (frequency counted to 3). One-hit wonders (a scan) never displace the hot set. Admission
//! also passes TinyLFU's test (Einziger et al.): a new tensor used less often lately than
//! the victim it would displace is not kept (use counts of every tensor seen, halved every
//! [`FlowOptions::aging`] tier-fulls of uses; a ghost is exempt).
//!
//! With a schedule (the caller declared the order of upcoming uses), it plans as Belady's
//! MIN does within what it knows: it evicts the resident tensor used farthest ahead,
//! declines to keep a tensor that is used later than everything resident (or beyond
//! `max_reuse_distance` uses, or never again), and prefetches the next `lookahead` uses so
//! their copies overlap the compute before them. Pinned tensors are never evicted.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{Decision, Key, Policy, View};

/// Options of [`Flow`].
#[derive(Debug, Clone)]
pub struct FlowOptions {
    /// The probation queue's share of the budget (default 0.1, as S3-FIFO).
    pub small_fraction: f64,
    /// Tensors never evicted (they still need room: the first use admits them).
    pub pinned: HashSet<Key>,
    /// With a schedule: a tensor whose next use is more than this many uses ahead is not
    /// kept (DeepSpeed ZeRO-3's `max_reuse_distance`; default none).
    pub max_reuse_distance: Option<usize>,
    /// With a schedule: how many upcoming uses to prefetch (default 2).
    pub lookahead: usize,
    /// Use counts halve every `aging` x (tensors in the tier) uses, at least every 1024
    /// (default 100: TinyLFU
    /// takes 10, which on a Zipf trace costs 5% more bytes moved here; longer remembers
    /// better and follows a shifting workload more slowly).
    pub aging: usize,
}

impl Default for FlowOptions {
    fn default() -> Self {
        FlowOptions { small_fraction: 0.1, pinned: HashSet::new(), max_reuse_distance: None, lookahead: 2, aging: 100 }
    }
}

/// What [`Flow::fifo_victim`] found.
enum Victim {
    Evict(Key),
    /// The incoming tensor loses the frequency test.
    Refuse,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// The Flow policy (see the module docs).
#[derive(Debug)]
pub struct Flow {
    opts: FlowOptions,
    /// Queue entries: a key and the generation it was queued with.
    small: VecDeque<(Key, u64)>,
    main: VecDeque<(Key, u64)>,
    /// Where each queued key is, and its generation (queue entries not matching are stale).
    place: HashMap<Key, (Queue, u64)>,
    generation: u64,
    small_bytes: u64,
    /// The size of each tensor in the probation queue.
    small_sizes: HashMap<Key, u64>,
    freq: HashMap<Key, u8>,
    ghost: VecDeque<Key>,
    ghosts: HashSet<Key>,
    /// The declared order of uses, the position of the next one, and each key's positions.
    schedule: Vec<Key>,
    cursor: usize,
    positions: HashMap<Key, VecDeque<usize>>,
    /// Sizes of scheduled tensors.
    sizes: HashMap<Key, u64>,
    /// Recent use counts of every tensor seen (TinyLFU's admission test), aged.
    history: HashMap<Key, u32>,
    since_aging: usize,
}

impl Flow {
    /// A Flow policy with these options.
    pub fn new(opts: FlowOptions) -> Flow {
        Flow {
            opts,
            small: VecDeque::new(),
            main: VecDeque::new(),
            place: HashMap::new(),
            generation: 0,
            small_bytes: 0,
            small_sizes: HashMap::new(),
            freq: HashMap::new(),
            ghost: VecDeque::new(),
            ghosts: HashSet::new(),
            schedule: Vec::new(),
            cursor: 0,
            positions: HashMap::new(),
            sizes: HashMap::new(),
            history: HashMap::new(),
            since_aging: 0,
        }
    }

    fn scheduled(&self) -> bool {
        self.cursor < self.schedule.len()
    }

    /// The position of `key`'s next scheduled use at or after the cursor (`usize::MAX`:
    /// none).
    fn next_use(&mut self, key: Key) -> usize {
        let Some(q) = self.positions.get_mut(&key) else { return usize::MAX };
        while q.front().is_some_and(|&p| p < self.cursor) {
            q.pop_front();
        }
        q.front().copied().unwrap_or(usize::MAX)
    }

    fn unqueue(&mut self, key: Key, bytes: u64) {
        self.small_sizes.remove(&key);
        if let Some((Queue::Small, _)) = self.place.remove(&key) {
            self.small_bytes -= bytes;
        }
        self.freq.remove(&key);
    }

    fn remember_ghost(&mut self, key: Key) {
        if self.ghosts.insert(key) {
            self.ghost.push_back(key);
        }
        // As many ghosts as there are queued tensors (S3-FIFO sizes G like M).
        while self.ghost.len() > self.place.len().max(16) {
            if let Some(k) = self.ghost.pop_front() {
                self.ghosts.remove(&k);
            }
        }
    }

    /// S3-FIFO's next victim (never `keep`, never pinned), with TinyLFU's admission test
    /// against `incoming` (its use count): when the victim has been used more often, it
    /// stays and the incoming tensor is refused instead.
    fn fifo_victim(&mut self, view: &View, keep: Key, gone: &HashSet<Key>, incoming: Option<u32>) -> Victim {
        let small_target = (view.budget() as f64 * self.opts.small_fraction) as u64;
        // Bounded: each key is looked at most a few times (frequency ≤ 3 rounds per key).
        for _ in 0..4 * (self.small.len() + self.main.len()) + 4 {
            let from_small = self.small_bytes > small_target || self.main.is_empty();
            let (queue, which) = if from_small && !self.small.is_empty() {
                (&mut self.small, Queue::Small)
            } else {
                (&mut self.main, Queue::Main)
            };
            let Some((k, g)) = queue.pop_front() else { return Victim::None };
            if self.place.get(&k) != Some(&(which, g)) || gone.contains(&k) || !view.contains(k) {
                continue;
            }
            if k == keep || self.opts.pinned.contains(&k) {
                queue.push_back((k, g));
                continue;
            }
            let f = self.freq.get(&k).copied().unwrap_or(0);
            let bytes = view.bytes_of(k).unwrap_or(0);
            match which {
                Queue::Small if f > 0 => {
                    self.small_bytes -= bytes;
                    self.small_sizes.remove(&k);
                    self.freq.insert(k, 0);
                    self.enqueue(k, Queue::Main);
                }
                Queue::Main if f > 0 => {
                    self.freq.insert(k, f - 1);
                    self.main.push_back((k, g));
                }
                _ if incoming.is_some_and(|c| c < self.uses_of(k)) => {
                    let queue = if which == Queue::Small { &mut self.small } else { &mut self.main };
                    queue.push_front((k, g));
                    return Victim::Refuse;
                }
                Queue::Small => {
                    self.unqueue(k, bytes);
                    self.remember_ghost(k);
                    return Victim::Evict(k);
                }
                Queue::Main => {
                    self.unqueue(k, bytes);
                    return Victim::Evict(k);
                }
            }
        }
        Victim::None
    }

    /// How often `key` was used lately (halved every `aging` uses).
    fn uses_of(&self, key: Key) -> u32 {
        self.history.get(&key).copied().unwrap_or(0)
    }

    /// Counts a use of `key`; every [`FlowOptions::aging`] x the queued tensors' count of
    /// uses (at least 1024), all counts halve, so that the counts follow a changing workload.
    fn count_use(&mut self, key: Key) {
        *self.history.entry(key).or_default() += 1;
        self.since_aging += 1;
        if self.since_aging >= self.opts.aging.saturating_mul(self.place.len()).max(1024) {
            self.since_aging = 0;
            self.history.retain(|_, n| {
                *n /= 2;
                *n > 0
            });
        }
    }

    /// With a schedule: the resident tensor (not pinned, not `keep`, not already going) used
    /// farthest ahead, with its next use.
    fn farthest(&mut self, view: &View, keep: &HashSet<Key>, gone: &HashSet<Key>) -> Option<(usize, Key)> {
        let candidates: Vec<Key> = view
            .resident()
            .map(|(k, _)| k)
            .filter(|k| !keep.contains(k) && !gone.contains(k) && !self.opts.pinned.contains(k))
            .collect();
        candidates.into_iter().map(|k| (self.next_use(k), k)).max()
    }

    fn admit(&mut self, key: Key, bytes: u64) {
        if self.place.contains_key(&key) {
            return;
        }
        // Drop stale queue entries once they outnumber the live ones.
        if self.small.len() + self.main.len() > 2 * self.place.len() + 64 {
            let place = &self.place;
            self.small.retain(|&(k, g)| place.get(&k) == Some(&(Queue::Small, g)));
            self.main.retain(|&(k, g)| place.get(&k) == Some(&(Queue::Main, g)));
        }
        let q = if self.ghosts.remove(&key) { Queue::Main } else { Queue::Small };
        if q == Queue::Small {
            self.small_bytes += bytes;
            self.small_sizes.insert(key, bytes);
        }
        self.freq.insert(key, 0);
        self.enqueue(key, q);
    }

    /// Queues `key` at the back of `q` with a new generation.
    fn enqueue(&mut self, key: Key, q: Queue) {
        self.generation += 1;
        let g = self.generation;
        self.place.insert(key, (q, g));
        match q {
            Queue::Small => self.small.push_back((key, g)),
            Queue::Main => self.main.push_back((key, g)),
        }
    }

    fn after_use_fifo(&mut self, key: Key, bytes: u64, hit: bool, view: &View) -> Decision {
        if hit {
            let f = self.freq.entry(key).or_insert(0);
            *f = (*f + 1).min(3);
            return Decision { keep: true, ..Decision::default() };
        }
        if bytes > view.budget() {
            return Decision::default();
        }
        let mut need = bytes.saturating_sub(view.free());
        let mut evict = Vec::new();
        let mut gone = HashSet::new();
        // The frequency test is against the first victim only, before anything is evicted;
        // a ghost (used again soon after leaving) and a pinned tensor are exempt.
        let exempt = self.ghosts.contains(&key) || self.opts.pinned.contains(&key);
        let mut incoming = (!exempt).then(|| self.uses_of(key));
        while need > 0 {
            match self.fifo_victim(view, key, &gone, incoming.take()) {
                Victim::Evict(v) => {
                    need = need.saturating_sub(view.bytes_of(v).unwrap_or(0));
                    gone.insert(v);
                    evict.push(v);
                }
                Victim::Refuse => return Decision::default(),
                Victim::None => break,
            }
        }
        // Without room (only pinned tensors left to evict) the victims found still go: the
        // queues have let go of them.
        let keep = need == 0;
        if keep {
            self.admit(key, bytes);
        }
        Decision { keep, evict, prefetch: Vec::new() }
    }

    fn after_use_scheduled(&mut self, key: Key, bytes: u64, view: &View) -> Decision {
        let pinned = self.opts.pinned.contains(&key);
        let next = self.next_use(key);
        let too_far = self.opts.max_reuse_distance.is_some_and(|d| next != usize::MAX && next - self.cursor > d);
        let mut d = Decision::default();
        let mut gone = HashSet::new();
        let mut used = view.used().saturating_sub(if view.contains(key) { bytes } else { 0 });
        let mut keep_set: HashSet<Key> = HashSet::from([key]);
        // The tensor just used: kept when pinned, or when it is needed sooner than what
        // would have to make room for it. Victims are committed only if room is made.
        if bytes <= view.budget() && (pinned || (next != usize::MAX && !too_far)) {
            let mut victims = Vec::new();
            let mut room = used;
            while room + bytes > view.budget() {
                match self.farthest(view, &keep_set, &gone) {
                    Some((far, v)) if pinned || far > next => {
                        room -= view.bytes_of(v).unwrap_or(0);
                        gone.insert(v);
                        victims.push(v);
                    }
                    _ => break,
                }
            }
            if room + bytes <= view.budget() {
                d.keep = true;
                d.evict = victims;
                used = room + bytes;
            } else {
                for v in victims {
                    gone.remove(&v);
                }
            }
        }
        // Prefetch the next uses, each only by evicting tensors needed later than it.
        let ahead: Vec<Key> =
            self.schedule[self.cursor..].iter().copied().filter(|&k| k != key).take(self.opts.lookahead).collect();
        for k in ahead {
            keep_set.insert(k);
            if (view.contains(k) && !gone.contains(&k)) || d.prefetch.iter().any(|&(p, _)| p == k) {
                continue;
            }
            let Some(&b) = self.sizes.get(&k) else { continue };
            let at = self.next_use(k);
            let mut evict = Vec::new();
            let mut freed = 0;
            while used - freed + b > view.budget() {
                match self.farthest(view, &keep_set, &gone) {
                    Some((far, v)) if far > at => {
                        freed += view.bytes_of(v).unwrap_or(0);
                        gone.insert(v);
                        evict.push(v);
                    }
                    _ => break,
                }
            }
            if used - freed + b > view.budget() {
                // Cannot make room without evicting something needed sooner: stop here.
                for v in evict {
                    gone.remove(&v);
                }
                break;
            }
            used = used - freed + b;
            d.evict.extend(evict);
            d.prefetch.push((k, b));
        }
        // The queues follow, so that S3-FIFO takes over where the schedule ends.
        for &v in &d.evict {
            self.unqueue(v, view.bytes_of(v).unwrap_or(0));
        }
        if d.keep {
            self.admit(key, bytes);
        } else if view.contains(key) {
            self.unqueue(key, bytes);
        }
        for &(k, b) in &d.prefetch {
            self.admit(k, b);
        }
        d
    }
}

impl Policy for Flow {
    fn name(&self) -> String {
        "flow".into()
    }

    fn schedule(&mut self, upcoming: &[(Key, u64)]) {
        self.schedule = upcoming.iter().map(|&(k, _)| k).collect();
        self.cursor = 0;
        self.positions.clear();
        for (i, &(k, b)) in upcoming.iter().enumerate() {
            self.positions.entry(k).or_default().push_back(i);
            self.sizes.insert(k, b);
        }
    }

    fn after_use(&mut self, _t: usize, key: Key, bytes: u64, hit: bool, view: &View) -> Decision {
        self.count_use(key);
        if self.scheduled() {
            if self.schedule[self.cursor] == key {
                self.cursor += 1;
            }
            return self.after_use_scheduled(key, bytes, view);
        }
        self.after_use_fifo(key, bytes, hit, view)
    }

    fn forget(&mut self, key: Key) {
        // (Its queue entry turns stale; the probation bytes it counted are let go.)
        if let Some((Queue::Small, _)) = self.place.get(&key) {
            let b = self.small_sizes.get(&key).copied().unwrap_or(0);
            self.small_bytes = self.small_bytes.saturating_sub(b);
        }
        self.place.remove(&key);
        self.freq.remove(&key);
        self.small_sizes.remove(&key);
    }
}
