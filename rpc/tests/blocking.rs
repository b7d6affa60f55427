//! Compute never starves the server: `register_blocking` handlers run on the blocking pool,
//! a cancelled call is answered at once even when its code ignores cancellation, and
//! `concurrency(n)` caps a method. Asserted by order of events, never by time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{addr, client, endpoint, t};
use ferry_rpc::codes::CANCELLED;
use ferry_rpc::{CallContext, ErrorObject, Methods, Server};

#[derive(Default)]
struct State {
    /// Set by the blocking handler when it returns.
    finished: AtomicBool,
    /// Released by the test to let the handler return.
    release: AtomicBool,
    running: AtomicUsize,
    most: AtomicUsize,
}

/// A handler that ignores cancellation and holds its thread until the test releases it
/// (bounded: it gives up after 30 s, so a failing test still ends).
fn hold(st: &State) {
    let now = st.running.fetch_add(1, Ordering::SeqCst) + 1;
    st.most.fetch_max(now, Ordering::SeqCst);
    for _ in 0..30_000 {
        if st.release.load(Ordering::SeqCst) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    st.running.fetch_sub(1, Ordering::SeqCst);
    st.finished.store(true, Ordering::SeqCst);
}

async fn serve(st: Arc<State>) -> (Server, String) {
    let mut m = Methods::new();
    m.register("add", |(a, b): (f64, f64)| async move { Ok::<_, ErrorObject>(a + b) }).unwrap();
    let s = st.clone();
    m.register_blocking("stubborn", move |(): (), _ctx: CallContext| {
        hold(&s);
        Ok::<_, ErrorObject>("done")
    })
    .unwrap();
    let s = st.clone();
    m.register_blocking("one_at_a_time", move |(): (), _ctx: CallContext| {
        hold(&s);
        Ok::<_, ErrorObject>(1)
    })
    .unwrap()
    .concurrency(1);
    #[cfg(target_os = "linux")]
    m.register_blocking("policy", |(): (), _ctx: CallContext| Ok::<_, ErrorObject>(policy())).unwrap();
    // A panic that skips the panic hook: the hook's backtrace (RUST_BACKTRACE is set under
    // CI) is a second of CPU in a debug build, which a SCHED_IDLE thread does not get while
    // other work fills every CPU (blocking.rs: "compute waits"), and is not what is tested.
    m.register_blocking("boom", |(): (), _ctx: CallContext| -> Result<u8, ErrorObject> {
        std::panic::resume_unwind(Box::new("on purpose"))
    })
    .unwrap();
    let server = Server::new(m);
    let a = addr();
    let l = t(endpoint().listen(&a)).await.unwrap();
    let s = server.clone();
    tokio::spawn(async move { s.serve(l).await });
    (server, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_computing_call_neither_blocks_others_nor_its_own_cancellation() {
    let st = Arc::new(State::default());
    let (server, a) = serve(st.clone()).await;
    // One runtime worker: were the handler on it, nothing else could run.
    let busy = client(&a).await;
    let other = client(&a).await;
    let long = {
        let busy = busy.clone();
        tokio::spawn(async move { busy.call::<_, String>("stubborn", &()).await })
    };
    while st.running.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let sum: f64 = t(other.call("add", &(1.0, 2.0))).await.unwrap();
    assert_eq!(sum, 3.0);
    assert!(!st.finished.load(Ordering::SeqCst), "add was answered only after the computation");
    // A cancelled task is answered `cancelled` at once, though its code runs on.
    let task = t(other.submit("stubborn", &(), false)).await.unwrap();
    assert_eq!(t(other.task_cancel(&task)).await.unwrap().state, ferry_rpc::TaskState::Cancelled);
    let e = t(other.task_result::<String>(&task, Duration::from_secs(10))).await.unwrap_err();
    assert_eq!(e.code(), Some(CANCELLED), "{e}");
    // And a call cancelled by its client's timeout frees its slot on the server at once.
    let e = t(busy.call_timeout::<_, String>("stubborn", &(), Duration::from_millis(50))).await.unwrap_err();
    assert!(matches!(e, ferry_rpc::CallError::Timeout(_)), "{e}");
    assert!(!st.finished.load(Ordering::SeqCst), "the cancellations waited for the computation");
    st.release.store(true, Ordering::SeqCst);
    assert_eq!(t(long).await.unwrap().unwrap(), "done");
    // A panic in a blocking handler is an internal error, not a dead server.
    let e = t(other.call::<_, u8>("boom", &())).await.unwrap_err();
    assert!(e.to_string().contains("on purpose"), "{e}");
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_caps_a_method() {
    let st = Arc::new(State::default());
    let (server, a) = serve(st.clone()).await;
    let c = client(&a).await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.call::<_, u8>("one_at_a_time", &()).await })
        })
        .collect();
    while st.running.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    st.release.store(true, Ordering::SeqCst);
    for call in calls {
        assert_eq!(t(call).await.unwrap().unwrap(), 1);
    }
    assert_eq!(st.most.load(Ordering::SeqCst), 1, "two calls of a method capped at 1 ran at once");
    server.shutdown();
}

/// The calling thread's scheduling policy (field 41 of /proc/thread-self/stat: 0 normal,
/// 5 idle).
#[cfg(target_os = "linux")]
fn policy() -> u32 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let after_name = stat.rsplit_once(')').unwrap().1;
    after_name.split_whitespace().nth(38).unwrap().parse().unwrap()
}

/// Blocking handlers compute under SCHED_IDLE (the runtime's threads keep the normal
/// policy), or under the normal one when asked.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_handlers_compute_under_sched_idle() {
    use ferry_rpc::blocking::{ComputePriority, set_compute_priority};
    let (_server, a) = serve(Arc::default()).await;
    let c = client(&a).await;
    assert_eq!(t(c.call::<_, u32>("policy", &())).await.unwrap(), 5, "SCHED_IDLE");
    assert_eq!(policy(), 0, "the test's own thread");
    set_compute_priority(ComputePriority::Normal);
    let normal = t(c.call::<_, u32>("policy", &())).await.unwrap();
    set_compute_priority(ComputePriority::Idle);
    assert_eq!(normal, 0, "back to the normal policy when asked");
}

/// Only the compute threads take SCHED_IDLE: after blocking handlers ran, every job on
/// Tokio's blocking pool (a store's deltas, file reads) still runs under the normal policy.
/// (On the shared pool, a thread once used for compute kept SCHED_IDLE, and a store's
/// `update` beside two CPU burners went unanswered for 30 s.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compute_leaves_tokios_blocking_pool_at_the_normal_policy() {
    let (_server, a) = serve(Arc::default()).await;
    let c = client(&a).await;
    for _ in 0..8 {
        assert_eq!(t(c.call::<_, u32>("policy", &())).await.unwrap(), 5, "SCHED_IDLE");
    }
    for _ in 0..8 {
        let on_the_pool = t(tokio::task::spawn_blocking(policy)).await.unwrap();
        assert_eq!(on_the_pool, 0, "a job on Tokio's blocking pool after compute ran");
    }
}
