//! What the two tiers with a policy share ([`super::Tiers`]' cpu tier, a
//! [`super::DeviceTier`]): [`Kept`], the policy with its view of the tier, the bytes pinned
//! there by hand and the budget (bookkeeping, no I/O); and [`MoverThread`], the thread that
//! carries out a tier's moves and ends the moves deferred for users.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Decision, Key, Policy, View};

/// A tier's policy, its share of the tier and the bytes pinned there.
pub(super) struct Kept {
    /// The policy's share (its budget: the tier's less the pinned bytes).
    pub(super) view: View,
    pub(super) policy: Box<dyn Policy + Send>,
    /// The tier's budget.
    pub(super) budget: u64,
    /// Bytes pinned in the tier by hand (outside the policy).
    pub(super) pinned: u64,
    /// Uses so far (the policy's clock).
    pub(super) step: usize,
}

impl Kept {
    pub(super) fn new(budget: u64, policy: Box<dyn Policy + Send>) -> Kept {
        Kept { view: View::new(budget), policy, budget, pinned: 0, step: 0 }
    }

    /// Asks the policy after a use and applies the decision to the view. A decision that
    /// breaks the rules (a policy bug) is logged naming `tier`, and the used tensor let go.
    pub(super) fn decide(&mut self, key: Key, bytes: u64, hit: bool, tier: &str) -> Decision {
        let step = self.step;
        self.step += 1;
        let d = self.policy.after_use(step, key, bytes, hit, &self.view);
        match self.view.apply(&d, key, bytes) {
            Ok(()) => d,
            Err(e) => {
                tracing::error!("{tier} placement policy {}: {e}", self.policy.name());
                self.view.take(key);
                Decision { keep: false, ..Decision::default() }
            }
        }
    }

    /// Takes `key` out of the policy's share (placed by hand, or freed).
    pub(super) fn unplace(&mut self, key: Key) {
        if self.view.take(key).is_some() {
            self.policy.forget(key);
        }
    }

    /// Pins `bytes` more, or refuses (`Err((pinned, budget))`) when they do not fit.
    pub(super) fn pin(&mut self, bytes: u64) -> Result<(), (u64, u64)> {
        if self.pinned.saturating_add(bytes) > self.budget {
            return Err((self.pinned, self.budget));
        }
        self.pinned += bytes;
        Ok(())
    }

    /// Unpins `bytes` (freed, or given back to the policy); the policy's share grows back.
    pub(super) fn unpin(&mut self, bytes: u64) {
        self.pinned -= bytes;
        self.view.set_budget(self.budget - self.pinned);
    }

    /// Sets the budget, or refuses (`Err(pinned)`) one below the pinned bytes; what no
    /// longer fits goes as [`Kept::shrink`] says.
    pub(super) fn set_budget(&mut self, budget: u64) -> Result<(), u64> {
        if budget < self.pinned {
            return Err(self.pinned);
        }
        self.budget = budget;
        Ok(())
    }

    /// Shrinks the policy's share to the budget less the pinned bytes: the keys let go,
    /// least recently used first (`last_use`).
    pub(super) fn shrink(&mut self, last_use: impl Fn(Key) -> usize) -> Vec<Key> {
        let budget = self.budget - self.pinned;
        let mut resident: Vec<(usize, Key)> = self.view.resident().map(|(k, _)| (last_use(k), k)).collect();
        resident.sort_unstable();
        let mut out = Vec::new();
        for (_, k) in resident {
            if self.view.used() <= budget {
                break;
            }
            self.view.take(k);
            self.policy.forget(k);
            out.push(k);
        }
        self.view.set_budget(budget.max(self.view.used()));
        out
    }

    /// Replaces the policy; the keys the old one kept (let go: the new one decides from
    /// the next use).
    pub(super) fn replace_policy(&mut self, policy: Box<dyn Policy + Send>) -> Vec<Key> {
        let resident: Vec<Key> = self.view.resident().map(|(k, _)| k).collect();
        for &k in &resident {
            self.view.take(k);
        }
        self.policy = policy;
        resident
    }

    /// Bytes placed in the tier: kept by the policy and pinned.
    pub(super) fn used(&self) -> u64 {
        self.view.used() + self.pinned
    }
}

/// While moves are deferred for their users, a mover looks this often whether they let go
/// (nothing tells it: a reader's lease ends in a channel).
const RELEASE_POLL: Duration = Duration::from_millis(10);

/// A tier's mover thread and the queue of its moves: it runs each job, and while
/// `deferred` says moves wait for users, calls `release` every [`RELEASE_POLL`]. It ends
/// when the handle is dropped, after the jobs already queued.
pub(super) struct MoverThread<J> {
    jobs: Mutex<Option<mpsc::Sender<J>>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

/// What a mover thread does with its tier ([`MoverThread::spawn`]).
pub(super) trait Moves: Send + Sync + 'static {
    /// A job.
    type Job: Send + 'static;
    /// Carries out a move.
    fn run(&self, job: Self::Job);
    /// Whether moves wait for their users to let go.
    fn deferred(&self) -> bool;
    /// Ends the deferred moves whose users let go.
    fn release(&self);
}

impl<J: Send + 'static> MoverThread<J> {
    /// Starts a mover thread named `name` for `tier`.
    pub(super) fn spawn<M: Moves<Job = J>>(name: &str, tier: Arc<M>) -> std::io::Result<MoverThread<J>> {
        let (tx, rx) = mpsc::channel::<J>();
        let worker = std::thread::Builder::new().name(name.into()).spawn(move || {
            loop {
                let deferred = tier.deferred();
                let job = if deferred {
                    match rx.recv_timeout(RELEASE_POLL) {
                        Ok(j) => Some(j),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match rx.recv() {
                        Ok(j) => Some(j),
                        Err(_) => return,
                    }
                };
                if let Some(j) = job {
                    tier.run(j);
                }
                if deferred {
                    tier.release();
                }
            }
        })?;
        Ok(MoverThread { jobs: Mutex::new(Some(tx)), worker: Some(worker) })
    }

    /// Queues moves.
    pub(super) fn send(&self, jobs: Vec<J>) {
        if jobs.is_empty() {
            return;
        }
        let tx = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = tx.as_ref() {
            for j in jobs {
                let _ = tx.send(j);
            }
        }
    }
}

impl<J> MoverThread<J> {
    /// Stops the thread once the queued moves are done.
    pub(super) fn stop(&mut self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl<J> Drop for MoverThread<J> {
    fn drop(&mut self) {
        self.stop();
    }
}
