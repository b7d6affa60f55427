//! Long calls: `ferry.task.submit / status / result / cancel`, over a bounded table whose
//! finished entries expire.
//!
//! - `submit {method, params, keep?}` checks the method and decodes its params at once
//!   (errors come back immediately), then runs the call detached from the connection and
//!   returns `{"task": id}`. The table holds at most [`RpcLimits::max_tasks`] tasks.
//! - `status {task}` returns `{task, method, state, elapsed_ms}`; `state` is `running`,
//!   `done`, `failed` or `cancelled`.
//! - `result {task, wait_ms?, keep?}` waits up to `wait_ms` (at most
//!   [`RpcLimits::max_task_wait`]) and returns the call's own result (or its error). A
//!   result is fetched once and then forgotten, unless `keep` was set at submit or here.
//!   Still running: error `TASK_PENDING`.
//! - `cancel {task}` cancels a running task (its handler future is dropped) and returns its
//!   status.
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
use crate::method::{HandlerFuture, Reply};

/// Params of `ferry.task.submit`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SubmitParams {
    /// The method to run.
    pub method: String,
    /// Its params (array or object; may reference the message's tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
    /// Keep the result after it is fetched (until it expires).
    #[serde(default)]
    pub keep: bool,
}

/// Result of `ferry.task.submit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Submitted {
    /// The task id.
    pub task: String,
}

/// Params of `ferry.task.status` and `ferry.task.cancel`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TaskParams {
    /// The task id.
    pub task: String,
}

/// Params of `ferry.task.result`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
    next: u64,
    salt: u64,
}

fn not_found(id: &str) -> ErrorObject {
    ErrorObject::new(TASK_NOT_FOUND, format!("Task not found: {id:?} (never submitted, already fetched, or expired)"))
}

impl TaskTable {
    /// An empty table.
    pub fn new(limits: RpcLimits) -> TaskTable {
        use std::hash::{BuildHasher, Hasher};
        let salt = std::collections::hash_map::RandomState::new().build_hasher().finish();
        TaskTable { inner: Arc::new(Mutex::new(Inner { tasks: HashMap::new(), next: 1, salt })), limits }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets finished tasks older than the time to live.
    fn purge(inner: &mut Inner, ttl: Duration, now: Instant) {
        inner.tasks.retain(|_, t| t.finished.is_none_or(|f| now.saturating_duration_since(f) < ttl));
    }

    /// Number of tasks held.
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// True when no task is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts `fut` (a call already decoded) as a task and returns its id. `token` must be
    /// the one the call's context watches.
    pub fn submit(
        &self,
        method: &str,
        fut: HandlerFuture,
        token: CancellationToken,
        keep: bool,
        now: Instant,
    ) -> Result<String, ErrorObject> {
        let (done_tx, done) = watch::channel(false);
        let id = {
            let mut inner = self.lock();
            Self::purge(&mut inner, self.limits.task_ttl, now);
            if inner.tasks.len() >= self.limits.max_tasks {
                return Err(ErrorObject::limit(
                    "max_tasks",
                    "tasks held (running, or finished and not fetched)",
                    inner.tasks.len() as u64 + 1,
                    self.limits.max_tasks as u64,
                ));
            }
            let n = inner.next;
            inner.next += 1;
            let id = format!("t{n}-{:08x}", (inner.salt ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) as u32);
            let task = Task {
                method: method.to_owned(),
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

    /// The status of a task.
    pub fn status(&self, id: &str, now: Instant) -> Result<TaskStatus, ErrorObject> {
        let mut inner = self.lock();
        Self::purge(&mut inner, self.limits.task_ttl, now);
        inner.tasks.get(id).map(|t| t.status(id, now)).ok_or_else(|| not_found(id))
    }

    /// Cancels a task (no effect once it has finished) and returns its status.
    pub fn cancel(&self, id: &str, now: Instant) -> Result<TaskStatus, ErrorObject> {
        let mut inner = self.lock();
        Self::purge(&mut inner, self.limits.task_ttl, now);
        let t = inner.tasks.get_mut(id).ok_or_else(|| not_found(id))?;
        if matches!(t.outcome, Outcome::Running) {
            t.token.cancel();
            t.outcome = Outcome::Cancelled;
            t.finished = Some(now);
        }
        Ok(t.status(id, now))
    }

    /// The result of a task, waiting up to `wait` (capped) for it to finish.
    pub async fn result(&self, id: &str, wait: Duration, keep: bool) -> Result<Reply, ErrorObject> {
        let done = {
            let mut inner = self.lock();
            Self::purge(&mut inner, self.limits.task_ttl, Instant::now());
            inner.tasks.get(id).map(|t| t.done.clone()).ok_or_else(|| not_found(id))?
        };
        let wait = wait.min(self.limits.max_task_wait);
        if !wait.is_zero() {
            let mut done = done;
            let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        }
        self.take(id, keep, Instant::now())
    }

    /// The result of a finished task, now (sans-IO part of [`TaskTable::result`]).
    pub fn take(&self, id: &str, keep: bool, now: Instant) -> Result<Reply, ErrorObject> {
        let mut inner = self.lock();
        let t = inner.tasks.get(id).ok_or_else(|| not_found(id))?;
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

    fn ready(v: Value) -> HandlerFuture {
        Box::pin(async move { Ok(Reply { value: v, tensors: Vec::new() }) })
    }

    fn table(max: usize) -> TaskTable {
        TaskTable::new(RpcLimits::default().max_tasks(max).task_ttl(Duration::from_secs(10)))
    }

    async fn settle(t: &TaskTable, id: &str) {
        for _ in 0..200 {
            if t.status(id, Instant::now()).map(|s| s.state != TaskState::Running).unwrap_or(true) {
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
        let a = t.submit("m", ready(json!(1)), CancellationToken::new(), false, now).unwrap();
        let b = t.submit("m", ready(json!(2)), CancellationToken::new(), true, now).unwrap();
        settle(&t, &a).await;
        settle(&t, &b).await;
        assert_eq!(t.take(&a, false, Instant::now()).unwrap().value, json!(1));
        assert_eq!(t.take(&a, false, Instant::now()).unwrap_err().code, TASK_NOT_FOUND);
        assert_eq!(t.take(&b, false, Instant::now()).unwrap().value, json!(2));
        assert_eq!(t.take(&b, false, Instant::now()).unwrap().value, json!(2));
    }

    #[tokio::test]
    async fn bounded_and_expiring() {
        let t = table(1);
        let now = Instant::now();
        let a = t.submit("m", ready(json!(1)), CancellationToken::new(), true, now).unwrap();
        settle(&t, &a).await;
        let e = t.submit("m", ready(json!(2)), CancellationToken::new(), false, now).unwrap_err();
        assert!(e.message.contains("max_tasks"), "{}", e.message);
        // Eleven seconds later the finished task has expired and there is room again.
        let later = Instant::now() + Duration::from_secs(11);
        assert_eq!(t.status(&a, later).unwrap_err().code, TASK_NOT_FOUND);
        t.submit("m", ready(json!(2)), CancellationToken::new(), false, later).unwrap();
    }

    #[tokio::test]
    async fn pending_and_cancelled() {
        let t = table(4);
        let token = CancellationToken::new();
        let slow: HandlerFuture = Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Reply::default())
        });
        let id = t.submit("sleep", slow, token.clone(), false, Instant::now()).unwrap();
        assert_eq!(t.take(&id, false, Instant::now()).unwrap_err().code, TASK_PENDING);
        let r = tokio::time::timeout(Duration::from_secs(5), t.result(&id, Duration::from_millis(20), false)).await;
        assert_eq!(r.unwrap().unwrap_err().code, TASK_PENDING);
        let s = t.cancel(&id, Instant::now()).unwrap();
        assert_eq!(s.state, TaskState::Cancelled);
        assert!(token.is_cancelled());
        assert_eq!(t.take(&id, false, Instant::now()).unwrap_err().code, CANCELLED);
    }
}
