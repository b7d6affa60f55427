//! Shared pieces of the socket tests: a test API, a server on a unique abstract socket,
//! plain-JSON connections, and a timeout on every await.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferry_core::{Endpoint, InlineChannel, Tensor, TensorMeta};
use ferry_rpc::{CallContext, Client, ErrorObject, Methods, RpcLimits, RpcTensor, Server, TensorMap};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Awaits `f` for at most 20 seconds.
pub async fn t<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("timed out after 20 s")
}

static N: AtomicUsize = AtomicUsize::new(0);

/// A unique address for this process and test.
pub fn addr() -> String {
    format!("unix:ferry-rpc-test-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

pub fn endpoint() -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(ferry_local::LocalTransport::new()))
        .channel(Arc::new(InlineChannel))
        .accept_foreign(true)
        .build()
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct Scale {
    pub x: RpcTensor,
    pub factor: f32,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct Sleep {
    pub ms: u64,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct Norms {
    pub weights: TensorMap,
}

/// Counts handlers that were cancelled (their future dropped before it finished).
#[derive(Default)]
pub struct Seen {
    pub cancelled: AtomicUsize,
}

/// Counts a cancellation when dropped before `done` is set.
struct Unfinished(Arc<Seen>, bool);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub fn methods(seen: Arc<Seen>) -> Methods {
    let mut m = Methods::new();
    // Inline: answered from the connection's task when it finishes at once.
    m.register("add", |(a, b): (f64, f64)| async move { Ok::<_, ErrorObject>(a + b) }).unwrap().inline();
    // Inline but waiting: must go on in its own task.
    m.register("nap", |p: Sleep| async move {
        tokio::time::sleep(Duration::from_millis(p.ms)).await;
        Ok::<_, ErrorObject>(p.ms)
    })
    .unwrap()
    .inline();
    m.register_ctx("scale", |p: Scale, ctx: CallContext| async move {
        let mut out = ctx.alloc(p.x.meta().clone()).await?;
        let src = p.x.as_slice::<f32>().map_err(ErrorObject::tensor)?;
        for (o, s) in out.as_mut_slice::<f32>().map_err(ErrorObject::tensor)?.iter_mut().zip(src) {
            *o = s * p.factor;
        }
        Ok::<_, ErrorObject>(RpcTensor(out.freeze()))
    })
    .unwrap();
    m.register("weights", |(): ()| async move {
        let mut w = TensorMap::new();
        w.insert("fc.weight".into(), RpcTensor(Tensor::from_slice(vec![2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap()));
        w.insert("fc.bias".into(), RpcTensor(Tensor::from_slice(vec![2], &[0.5f32, -0.5]).unwrap()));
        Ok::<_, ErrorObject>(w)
    })
    .unwrap();
    m.register("norms", |p: Norms| async move {
        let out: BTreeMap<String, f64> = p
            .weights
            .iter()
            .map(|(k, v)| (k.clone(), v.as_slice::<f32>().unwrap().iter().map(|x| f64::from(*x).abs()).sum()))
            .collect();
        Ok::<_, ErrorObject>(out)
    })
    .unwrap();
    let s = seen.clone();
    m.register_ctx("sleep", move |p: Sleep, ctx: CallContext| {
        let s = s.clone();
        async move {
            let mut guard = Unfinished(s, false);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(p.ms)) => {}
                _ = ctx.cancelled() => return Err(ErrorObject::cancelled("observed")),
            }
            guard.1 = true;
            Ok::<_, ErrorObject>(p.ms)
        }
    })
    .unwrap();
    m.register("block", |p: Sleep| async move {
        // Synchronous work before the first await (what a careless handler does).
        std::thread::sleep(Duration::from_millis(p.ms));
        Ok::<_, ErrorObject>(p.ms)
    })
    .unwrap();
    m.register("fail", |(): ()| async move { Err::<(), _>(ErrorObject::new(42, "custom failure")) }).unwrap();
    m.register("panic", |(): ()| async move {
        if true {
            panic!("boom");
        }
        Ok::<(), ErrorObject>(())
    })
    .unwrap();
    m.register("zeros", |(n,): (u64,)| async move {
        Ok::<_, ErrorObject>(RpcTensor(Tensor::zeros(TensorMeta::new(ferry_core::DType::U8, vec![n])).unwrap()))
    })
    .unwrap();
    m
}

/// A served test API: its address, the server, and the handlers' cancellation counter.
pub struct Fixture {
    pub addr: String,
    pub server: Server,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.shutdown();
        self.task.abort();
    }
}

pub async fn serve(limits: RpcLimits) -> Fixture {
    let seen = Arc::new(Seen::default());
    let server = Server::builder(methods(seen.clone())).limits(limits).title("test").build();
    let addr = addr();
    let listener = t(endpoint().listen(&addr)).await.unwrap();
    let s = server.clone();
    let task = tokio::spawn(async move {
        let _ = s.serve(listener).await;
    });
    Fixture { addr, server, seen, task }
}

pub async fn client(addr: &str) -> Client {
    Client::new(t(endpoint().connect(addr)).await.unwrap())
}

/// A plain newline-delimited JSON connection to the server's local socket (an abstract
/// unix socket on Linux, a named pipe on Windows), through the pipe transport's raw stream.
pub struct Plain {
    pub read: BufReader<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    pub write: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
}

impl Plain {
    pub async fn connect(addr: &str) -> Plain {
        use ferry_core::Transport;
        let conn = t(ferry_local::LocalTransport::new().connect(&addr.parse().unwrap())).await.unwrap();
        let split = conn.split();
        Plain { read: BufReader::new(split.read), write: split.write }
    }

    pub async fn send(&mut self, text: &str) {
        t(self.write.write_all(text.as_bytes())).await.unwrap();
    }

    pub async fn line(&mut self) -> serde_json::Value {
        let mut s = String::new();
        let n = t(self.read.read_line(&mut s)).await.unwrap();
        assert!(n > 0, "connection closed");
        serde_json::from_str(&s).unwrap()
    }
}
