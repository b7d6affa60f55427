//! Long calls: `ferry.task.submit / status / result / cancel`, over a bounded table whose
//! finished entries expire.
//!
//! - `submit {method, params, keep?, detached?}` checks the method and decodes its params
//!   at once (errors come back immediately), then runs the call and returns `{"task": id}`.
//!   The id is 128 random bits: unguessable. The table holds at most
//!   [`RpcLimits::max_tasks`] tasks, and one identity at most
//!   [`RpcLimits::max_tasks_per_identity`] (cancelled tasks count toward neither).
//! - A task belongs to the [`Identity`] that submitted it. `status`, `result` and `cancel`
//!   from any other identity answer exactly as for an unknown id.
//! - A task belongs to its connection too: when that connection closes, its running tasks
//!   are cancelled and its finished results (and the shared memory they hold) dropped,
//!   unless it was submitted with `detached: true` (tasks submitted over HTTP always are:
//!   an HTTP request is its own connection). Detached tasks live until fetched or expired.
//! - `status {task}` returns `{task, method, state, elapsed_ms}`; `state` is `running`,
//!   `done`, `failed` or `cancelled`.
//! - `result {task, wait_ms?, keep?}` waits up to `wait_ms` (at most
//!   [`RpcLimits::max_task_wait`]) and returns the call's own result (or its error). A
//!   result is fetched once and then forgotten, unless `keep` was set at submit or here.
//!   Still running: error `TASK_PENDING`.
//! - `cancel {task}` cancels a running task and returns its status at once: the task's
//!   handler future is dropped, and its slot is free even if the handler is stuck in code
//!   that never returns to the runtime.
//! - A finished task is forgotten [`RpcLimits::task_ttl`] after it finished.
//!
//! The table is plain code over a mutex; time is passed in (`now`) so tests need no clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::codes::{CANCELLED, ErrorObject, TASK_NOT_FOUND, TASK_PENDING};
use crate::limits::RpcLimits;
use crate::method::{HandlerFuture, Identity, Reply};

/// Params of `ferry.task.submit`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitParams {
    /// The method to run.
    pub method: String,
    /// Its params (array or object; may reference the message's tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
    /// Keep the result after it is fetched (until it expires).
    #[serde(default)]
    pub keep: bool,
    /// Let the task outlive the connection that submitted it (until fetched or expired).
    /// Without it, closing the connection cancels the task and drops its result.
    #[serde(default)]
    pub detached: bool,
}

/// Result of `ferry.task.submit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Submitted {
    /// The task id.
    pub task: String,
}

/// Params of `ferry.task.status` and `ferry.task.cancel`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskParams {
    /// The task id.
    pub task: String,
}

/// Params of `ferry.task.result`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultParams {
    /// The task id.
    pub task: String,
    /// Wait this long for the task to finish (milliseconds; capped by the server).
    #[serde(default)]
    pub wait_ms: u64,
    /// Keep the result after this fetch (until it expires).
    #[serde(default)]
    pub keep: bool,
}

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Still running.
    Running,
    /// Finished with a result.
    Done,
    /// Finished with an error.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// Result of `ferry.task.status` and `ferry.task.cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskStatus {
    /// The task id.
    pub task: String,
    /// The method it runs.
    pub method: String,
    /// Where it is.
    pub state: TaskState,
    /// Milliseconds since it was submitted (until it finished).
    pub elapsed_ms: u64,
}

enum Outcome {
    Running,
    Done(Reply),
    Failed(ErrorObject),
    Cancelled,
}

struct Task {
    method: String,
    owner: Identity,
    /// The connection it dies with (`None`: detached).
    conn: Option<u64>,
    outcome: Outcome,
    token: CancellationToken,
    started: Instant,
    finished: Option<Instant>,
    keep: bool,
    done: watch::Receiver<bool>,
}

impl Task {
    fn state(&self) -> TaskState {
        match self.outcome {
            Outcome::Running => TaskState::Running,
            Outcome::Done(_) => TaskState::Done,
            Outcome::Failed(_) => TaskState::Failed,
            Outcome::Cancelled => TaskState::Cancelled,
        }
    }

    fn status(&self, id: &str, now: Instant) -> TaskStatus {
        let end = self.finished.unwrap_or(now);
        TaskStatus {
            task: id.to_owned(),
            method: self.method.clone(),
            state: self.state(),
            elapsed_ms: end.saturating_duration_since(self.started).as_millis() as u64,
        }
    }
}

/// The task table. Cheap to clone (shared).
#[derive(Clone)]
pub struct TaskTable {
    inner: Arc<Mutex<Inner>>,
    limits: RpcLimits,
}

struct Inner {
    tasks: HashMap<String, Task>,
}

impl Inner {
    /// Tasks that count toward the limits (all but cancelled ones), in all and of `who`.
    fn counts(&self, who: &Identity) -> (usize, usize) {
        let live = self.tasks.values().filter(|t| !matches!(t.outcome, Outcome::Cancelled));
        live.fold((0, 0), |(all, mine), t| (all + 1, mine + usize::from(&t.owner == who)))
    }

    /// `who`'s task `id`; another identity's task is not found, exactly like a missing one.
    fn get(&self, id: &str, who: &Identity) -> Result<&Task, ErrorObject> {
        self.tasks.get(id).filter(|t| &t.owner == who).ok_or_else(|| not_found(id))
    }

    fn get_mut(&mut self, id: &str, who: &Identity) -> Result<&mut Task, ErrorObject> {
        self.tasks.get_mut(id).filter(|t| &t.owner == who).ok_or_else(|| not_found(id))
    }

    /// Keeps at most `max` cancelled records (the oldest go first): they count toward no
    /// limit, but must not grow the table without bound.
    fn trim_cancelled(&mut self, max: usize) {
        let mut cancelled: Vec<(Instant, String)> = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.outcome, Outcome::Cancelled))
            .map(|(id, t)| (t.finished.unwrap_or(t.started), id.clone()))
            .collect();
        if cancelled.len() > max {
            cancelled.sort();
            let over = cancelled.len() - max;
            for (_, id) in cancelled.into_iter().take(over) {
                self.tasks.remove(&id);
            }
        }
    }
}

/// A fresh id: `prefix` and 128 random bits from the OS in hex (unguessable); tasks and
/// remote tensor references use it. `what` names it in the error.
pub(crate) fn random_id(prefix: char, what: &str) -> Result<String, ErrorObject> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).map_err(|e| ErrorObject::internal(format!("no randomness for {what}: {e}")))?;
    Ok(format!("{prefix}{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()))
}

fn not_found(id: &str) -> ErrorObject {
    ErrorObject::new(TASK_NOT_FOUND, format!("Task not found: {id:?} (never submitted, already fetched, or expired)"))
}

/// Who submits a task and where: its owner, and the connection it dies with (`None`:
/// detached).
#[derive(Debug, Clone)]
pub struct Submitter {
    /// The owner.
    pub owner: Identity,
    /// The connection it is cancelled with, unless detached.
    pub conn: Option<u64>,
}

impl TaskTable {
    /// An empty table.
    pub fn new(limits: RpcLimits) -> TaskTable {
        TaskTable { inner: Arc::new(Mutex::new(Inner { tasks: HashMap::new() })), limits }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets finished tasks older than the time to live.
    fn purge(inner: &mut Inner, ttl: Duration, now: Instant) {
        inner.tasks.retain(|_, t| t.finished.is_none_or(|f| now.saturating_duration_since(f) < ttl));
    }

    /// Number of tasks held (cancelled records included).
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// True when no task is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts `fut` (a call already decoded) as a task of `by` and returns its id. `token`
    /// must be the one the call's context watches.
    pub fn submit(
        &self,
        method: &str,
        fut: HandlerFuture,
        token: CancellationToken,
        keep: bool,
        by: Submitter,
        now: Instant,
    ) -> Result<String, ErrorObject> {
        let (done_tx, done) = watch::channel(false);
        let id = {
            let mut inner = self.lock();
            Self::purge(&mut inner, self.limits.task_ttl, now);
            inner.trim_cancelled(self.limits.max_tasks);
            let (all, mine) = inner.counts(&by.owner);
            if mine >= self.limits.max_tasks_per_identity {
                return Err(ErrorObject::limit(
                    "max_tasks_per_identity",
                    "tasks held by this caller's identity (running, or finished and not fetched)",
                    mine as u64 + 1,
                    self.limits.max_tasks_per_identity as u64,
                ));
            }
            if all >= self.limits.max_tasks {
                return Err(ErrorObject::limit(
                    "max_tasks",
                    "tasks held (running, or finished and not fetched)",
                    all as u64 + 1,
                    self.limits.max_tasks as u64,
                ));
            }
            let id = random_id('t', "a task id")?;
            let task = Task {
                method: method.to_owned(),
                owner: by.owner,
                conn: by.conn,
                outcome: Outcome::Running,
                token: token.clone(),
                started: now,
                finished: None,
                keep,
                done,
            };
            inner.tasks.insert(id.clone(), task);
            id
        };
        let table = self.clone();
        let task_id = id.clone();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                biased;
                _ = token.cancelled() => Outcome::Cancelled,
                r = fut => match r {
                    Ok(reply) => Outcome::Done(reply),
                    Err(e) if e.code == CANCELLED => Outcome::Cancelled,
                    Err(e) => Outcome::Failed(e),
                },
            };
            table.finish(&task_id, outcome, Instant::now());
            let _ = done_tx.send(true);
        });
        Ok(id)
    }

    fn finish(&self, id: &str, outcome: Outcome, now: Instant) {
        if let Some(t) = self.lock().tasks.get_mut(id)
            && matches!(t.outcome, Outcome::Running)
        {
            t.outcome = outcome;
            t.finished = Some(now);
        }
    }

    /// The status of `who`'s task.
    pub fn status(&self, id: &str, who: &Identity, now: Instant) -> Result<TaskStatus, ErrorObject> {
        let mut inner = self.lock();
        Self::purge(&mut inner, self.limits.task_ttl, now);
        inner.get(id, who).map(|t| t.status(id, now))
    }

    /// Cancels `who`'s task (no effect once it has finished) and returns its status. The
    /// task stops counting toward the limits at once, whatever its handler does.
    pub fn cancel(&self, id: &str, who: &Identity, now: Instant) -> Result<TaskStatus, ErrorObject> {
        let mut inner = self.lock();
        Self::purge(&mut inner, self.limits.task_ttl, now);
        let t = inner.get_mut(id, who)?;
        if matches!(t.outcome, Outcome::Running) {
            t.token.cancel();
            t.outcome = Outcome::Cancelled;
            t.finished = Some(now);
        }
        Ok(t.status(id, now))
    }

    /// Whether connection `conn` has tasks that die with it (not detached).
    pub fn held_by_connection(&self, conn: u64) -> bool {
        self.lock().tasks.values().any(|t| t.conn == Some(conn))
    }

    /// The connection `conn` closed: its tasks that are not detached are cancelled and
    /// forgotten, with their results. Returns how many.
    pub fn connection_closed(&self, conn: u64) -> usize {
        let mut inner = self.lock();
        let before = inner.tasks.len();
        inner.tasks.retain(|_, t| {
            let dies = t.conn == Some(conn);
            if dies {
                t.token.cancel();
            }
            !dies
        });
        before - inner.tasks.len()
    }

    /// The result of `who`'s task, waiting up to `wait` (capped) for it to finish.
    pub async fn result(&self, id: &str, who: &Identity, wait: Duration, keep: bool) -> Result<Reply, ErrorObject> {
        let done = {
            let mut inner = self.lock();
            Self::purge(&mut inner, self.limits.task_ttl, Instant::now());
            inner.get(id, who)?.done.clone()
        };
        let wait = wait.min(self.limits.max_task_wait);
        if !wait.is_zero() {
            let mut done = done;
            let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        }
        self.take(id, who, keep, Instant::now())
    }

    /// The result of `who`'s finished task, now (sans-IO part of [`TaskTable::result`]).
    pub fn take(&self, id: &str, who: &Identity, keep: bool, now: Instant) -> Result<Reply, ErrorObject> {
        let mut inner = self.lock();
        let t = inner.get(id, who)?;
        let r = match &t.outcome {
            Outcome::Running => {
                return Err(ErrorObject::new(
                    TASK_PENDING,
                    format!(
                        "Task pending: {id:?} has run for {} ms",
                        now.saturating_duration_since(t.started).as_millis()
                    ),
                ));
            }
            Outcome::Done(reply) => Ok(reply.clone()),
            Outcome::Failed(e) => Err(e.clone()),
            Outcome::Cancelled => Err(ErrorObject::cancelled(&format!("task {id:?} was cancelled"))),
        };
        if !(keep || t.keep) {
            inner.tasks.remove(id);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const A: Identity = Identity::Uid(1000);
    const B: Identity = Identity::Uid(1001);

    fn ready(v: Value) -> HandlerFuture {
        Box::pin(async move { Ok(Reply { value: v, tensors: Vec::new() }) })
    }

    fn forever() -> HandlerFuture {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Reply::default())
        })
    }

    fn by(owner: Identity, conn: Option<u64>) -> Submitter {
        Submitter { owner, conn }
    }

    fn table(max: usize) -> TaskTable {
        TaskTable::new(RpcLimits::default().max_tasks(max).task_ttl(Duration::from_secs(10)))
    }

    async fn settle(t: &TaskTable, id: &str, who: &Identity) {
        for _ in 0..200 {
            if t.status(id, who, Instant::now()).map(|s| s.state != TaskState::Running).unwrap_or(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("task {id} did not settle");
    }

    #[tokio::test]
    async fn fetched_once_unless_kept() {
        let t = table(4);
        let now = Instant::now();
        let a = t.submit("m", ready(json!(1)), CancellationToken::new(), false, by(A, None), now).unwrap();
        let b = t.submit("m", ready(json!(2)), CancellationToken::new(), true, by(A, None), now).unwrap();
        settle(&t, &a, &A).await;
        settle(&t, &b, &A).await;
        assert_eq!(t.take(&a, &A, false, Instant::now()).unwrap().value, json!(1));
        assert_eq!(t.take(&a, &A, false, Instant::now()).unwrap_err().code, TASK_NOT_FOUND);
        assert_eq!(t.take(&b, &A, false, Instant::now()).unwrap().value, json!(2));
        assert_eq!(t.take(&b, &A, false, Instant::now()).unwrap().value, json!(2));
    }

    #[tokio::test]
    async fn bounded_and_expiring() {
        let t = table(1);
        let now = Instant::now();
        let a = t.submit("m", ready(json!(1)), CancellationToken::new(), true, by(A, None), now).unwrap();
        settle(&t, &a, &A).await;
        let e = t.submit("m", ready(json!(2)), CancellationToken::new(), false, by(B, None), now).unwrap_err();
        assert!(e.message.contains("max_tasks"), "{}", e.message);
        // Eleven seconds later the finished task has expired and there is room again.
        let later = Instant::now() + Duration::from_secs(11);
        assert_eq!(t.status(&a, &A, later).unwrap_err().code, TASK_NOT_FOUND);
        t.submit("m", ready(json!(2)), CancellationToken::new(), false, by(A, None), later).unwrap();
    }

    #[tokio::test]
    async fn pending_and_cancelled() {
        let t = table(4);
        let token = CancellationToken::new();
        let id = t.submit("sleep", forever(), token.clone(), false, by(A, None), Instant::now()).unwrap();
        assert_eq!(t.take(&id, &A, false, Instant::now()).unwrap_err().code, TASK_PENDING);
        let r = tokio::time::timeout(Duration::from_secs(5), t.result(&id, &A, Duration::from_millis(20), false)).await;
        assert_eq!(r.unwrap().unwrap_err().code, TASK_PENDING);
        let s = t.cancel(&id, &A, Instant::now()).unwrap();
        assert_eq!(s.state, TaskState::Cancelled);
        assert!(token.is_cancelled());
        assert_eq!(t.take(&id, &A, false, Instant::now()).unwrap_err().code, CANCELLED);
    }

    #[tokio::test]
    async fn ids_are_random_128_bit_hex() {
        let t = table(8);
        let ids: Vec<String> = (0..4)
            .map(|_| t.submit("m", forever(), CancellationToken::new(), false, by(A, None), Instant::now()).unwrap())
            .collect();
        for id in &ids {
            assert_eq!(id.len(), 33, "{id}");
            assert!(id[1..].chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }

    #[tokio::test]
    async fn another_identity_sees_nothing() {
        let t = table(8);
        let token = CancellationToken::new();
        let id = t.submit("m", forever(), token.clone(), false, by(A, None), Instant::now()).unwrap();
        let unknown = t.status("t00000000000000000000000000000000", &B, Instant::now()).unwrap_err();
        for e in [
            t.status(&id, &B, Instant::now()).unwrap_err(),
            t.cancel(&id, &B, Instant::now()).unwrap_err(),
            t.take(&id, &B, false, Instant::now()).unwrap_err(),
        ] {
            assert_eq!(e.code, unknown.code);
            assert_eq!(
                e.message.replace(&id, "ID"),
                unknown.message.replace("t00000000000000000000000000000000", "ID")
            );
        }
        assert!(!token.is_cancelled(), "B cancelled A's task");
        assert_eq!(t.status(&id, &A, Instant::now()).unwrap().state, TaskState::Running);
    }

    #[tokio::test]
    async fn per_identity_quota_and_cancel_frees_at_once() {
        let t = TaskTable::new(RpcLimits::default().max_tasks(8).max_tasks_per_identity(2));
        let now = Instant::now();
        let a1 = t.submit("m", forever(), CancellationToken::new(), false, by(A, None), now).unwrap();
        t.submit("m", forever(), CancellationToken::new(), false, by(A, None), now).unwrap();
        let e = t.submit("m", forever(), CancellationToken::new(), false, by(A, None), now).unwrap_err();
        assert!(e.message.contains("max_tasks_per_identity"), "{}", e.message);
        // Others are not affected.
        t.submit("m", forever(), CancellationToken::new(), false, by(B, None), now).unwrap();
        // A handler that ignores cancellation (a future that never yields its slot) still
        // frees the slot at once.
        t.cancel(&a1, &A, now).unwrap();
        t.submit("m", forever(), CancellationToken::new(), false, by(A, None), now).unwrap();
    }

    #[tokio::test]
    async fn a_closed_connection_takes_its_tasks_along() {
        let t = table(8);
        let now = Instant::now();
        let (k1, k2) = (CancellationToken::new(), CancellationToken::new());
        let mine = t.submit("m", forever(), k1.clone(), false, by(A, Some(7)), now).unwrap();
        let done = t.submit("m", ready(json!(1)), CancellationToken::new(), false, by(A, Some(7)), now).unwrap();
        let detached = t.submit("m", forever(), k2.clone(), false, by(A, None), now).unwrap();
        let other = t.submit("m", forever(), CancellationToken::new(), false, by(A, Some(8)), now).unwrap();
        settle(&t, &done, &A).await;
        assert_eq!(t.connection_closed(7), 2);
        assert!(k1.is_cancelled());
        assert!(!k2.is_cancelled());
        for gone in [&mine, &done] {
            assert_eq!(t.status(gone, &A, Instant::now()).unwrap_err().code, TASK_NOT_FOUND);
        }
        for kept in [&detached, &other] {
            assert_eq!(t.status(kept, &A, Instant::now()).unwrap().state, TaskState::Running);
        }
    }
}
