//! The Rust RPC client's conformance cases (`rpc::*`) against a server of the conformance
//! API: `ferry serve ADDR --api conformance` (this package's binary), or
//! `$FERRY_CONFORMANCE_SERVER`, a command line in which `{addr}` stands for the address
//! (the Python-served API, for the `python-server` column of `cargo xtask conformance`).
//! The report's column is `$FERRY_CONFORMANCE_COLUMN` (default `rust-server`).
//!
//! Every case starts from a shared server (one per run); the cases that kill a server start
//! their own.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use ferry::ferry_rpc::{CallError, Client, RpcTensor, TaskState, TensorMap};
use ferry::{DType, Tensor, TensorMeta};
use ferry_commands::conformance_api::{MapParams, Nested, NestedParams, TensorInfo, TensorParams, checksum, pattern};
use ferry_conformance::{Failed, Outcome, Suite, ensure, run_async};
use serde_json::{Value, json};

static N: AtomicUsize = AtomicUsize::new(0);

/// A server of the conformance API, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start() -> Result<Server, String> {
        let addr = format!("unix:ferry-rpc-conformance-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let mut cmd = match std::env::var("FERRY_CONFORMANCE_SERVER") {
            Ok(line) if !line.trim().is_empty() => {
                let mut parts = line.split_whitespace().map(|p| p.replace("{addr}", &addr));
                let mut cmd = Command::new(parts.next().unwrap_or_default());
                cmd.args(parts);
                cmd
            }
            _ => {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
                cmd.args(["serve", &addr, "--api", "conformance"]);
                cmd
            }
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {cmd:?}: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut server = Server { child, addr };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(line)) if line.starts_with("listening on") => Ok(server),
            other => {
                server.kill();
                Err(format!("{cmd:?} did not say `listening on` within 60 s (got {other:?})"))
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The server the cases share (started once; killed when the run ends, see `main`).
fn shared() -> &'static Result<std::sync::Mutex<Server>, String> {
    static S: OnceLock<Result<std::sync::Mutex<Server>, String>> = OnceLock::new();
    S.get_or_init(|| Server::start().map(std::sync::Mutex::new))
}

fn shared_addr() -> Result<String, Failed> {
    match shared() {
        Ok(s) => Ok(s.lock().unwrap_or_else(|e| e.into_inner()).addr.clone()),
        Err(e) => Err(Failed::from(e.clone())),
    }
}

/// A client over every channel both sides have (`shm` first), or the inline channel only.
async fn connect(addr: &str, shm: bool) -> Result<Client, Failed> {
    let mut b = ferry::Endpoint::builder();
    for t in ferry::transports() {
        b = b.transport(t);
    }
    for c in ferry::channels() {
        if shm || c.name() != "shm" {
            b = b.channel(c);
        }
    }
    let pipe = b.build().connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
    Ok(Client::new(pipe).with_timeout(Some(Duration::from_secs(60))))
}

fn fail(what: impl std::fmt::Display) -> Failed {
    Failed::from(what.to_string())
}

/// The conformance API's `make` tensor, computed here.
fn expected(dtype: DType, shape: &[u64]) -> Tensor {
    let n: u64 = shape.iter().product();
    let mut bytes = Vec::with_capacity((n * dtype.itemsize() as u64) as usize);
    for i in 0..n {
        let v = pattern(dtype, i);
        match dtype {
            DType::Bool => bytes.push(v as u8),
            DType::U8 => bytes.push(v as u8),
            DType::I8 => bytes.extend((v as i8).to_le_bytes()),
            DType::U16 => bytes.extend((v as u16).to_le_bytes()),
            DType::I16 => bytes.extend((v as i16).to_le_bytes()),
            DType::U32 => bytes.extend((v as u32).to_le_bytes()),
            DType::I32 => bytes.extend((v as i32).to_le_bytes()),
            DType::U64 => bytes.extend((v as u64).to_le_bytes()),
            DType::I64 => bytes.extend((v as i64).to_le_bytes()),
            DType::F16 => bytes.extend(half::f16::from_f64(v).to_le_bytes()),
            DType::Bf16 => bytes.extend(half::bf16::from_f64(v).to_le_bytes()),
            DType::F32 => bytes.extend((v as f32).to_le_bytes()),
            DType::F64 => bytes.extend(v.to_le_bytes()),
            DType::F8E4M3Fn => bytes.push(ferry_core::float8::f64_to_e4m3fn(v)),
            DType::F8E5M2 => bytes.push(ferry_core::float8::f64_to_e5m2(v)),
            DType::C64 => bytes.extend([(v as f32).to_le_bytes(), 0f32.to_le_bytes()].concat()),
            DType::C128 => bytes.extend([v.to_le_bytes(), 0f64.to_le_bytes()].concat()),
        }
    }
    Tensor::new(TensorMeta::new(dtype, shape.to_vec()), bytes.into()).expect("a valid pattern tensor")
}

/// Same dtype, shape and bytes.
fn same(got: &Tensor, want: &Tensor, what: &str) -> Outcome {
    ensure!(got.dtype() == want.dtype(), "{what}: dtype {:?}, want {:?}", got.dtype(), want.dtype());
    ensure!(got.shape() == want.shape(), "{what}: shape {:?}, want {:?}", got.shape(), want.shape());
    let bytes = got.host_bytes().ok_or_else(|| fail(format!("{what}: not a host tensor")))?;
    ensure!(bytes == want.as_bytes(), "{what}: the bytes differ");
    Ok(())
}

async fn make(c: &Client, dtype: DType, shape: &[u64]) -> Result<Tensor, Failed> {
    let t: RpcTensor = c.call("make", &json!({"dtype": dtype, "shape": shape})).await.map_err(fail)?;
    Ok(t.0)
}

async fn inspect(c: &Client, t: &Tensor) -> Result<TensorInfo, Failed> {
    c.call("inspect", &TensorParams { tensor: RpcTensor(t.clone()) }).await.map_err(fail)
}

/// Every dtype made, echoed and inspected, small (inline-sized) and larger, over `shm` or
/// the inline channel; `whoami` names the channel.
async fn dtypes(shm: bool) -> Outcome {
    let c = connect(&shared_addr()?, shm).await?;
    let who: Value = c.call("whoami", &()).await.map_err(fail)?;
    let channel = if shm && cfg!(feature = "shm") { "shm" } else { "inline" };
    ensure!(c.pipe().channel() == channel, "negotiated {}, want {channel}", c.pipe().channel());
    ensure!(who["channel"] == channel && who["kind"] == "pipe", "whoami says {who}");
    for dtype in DType::ALL {
        for shape in [&[3u64, 5][..], &[64, 128]] {
            let want = expected(dtype, shape);
            let got = make(&c, dtype, shape).await?;
            same(&got, &want, &format!("make {dtype:?}{shape:?}"))?;
            let back: RpcTensor = c.call("echo", &TensorParams { tensor: RpcTensor(got) }).await.map_err(fail)?;
            same(&back, &want, &format!("echo of make {dtype:?}{shape:?}"))?;
            let info = inspect(&c, &want).await?;
            ensure!(info.dtype == dtype && info.shape == shape, "inspect {dtype:?}{shape:?}: {info:?}");
            ensure!(info.nbytes == want.as_bytes().len() as u64, "inspect nbytes: {info:?}");
            ensure!(info.checksum == checksum(want.as_bytes()).to_string(), "inspect checksum: {info:?}");
            let back: RpcTensor =
                c.call("echo", &TensorParams { tensor: RpcTensor(want.clone()) }).await.map_err(fail)?;
            same(&back, &want, &format!("echo of a local {dtype:?}{shape:?}"))?;
        }
    }
    Ok(())
}

async fn empty_and_scalar() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    for dtype in [DType::F32, DType::U8, DType::Bf16, DType::Bool] {
        for shape in [&[0u64][..], &[2, 0, 3], &[]] {
            let want = expected(dtype, shape);
            same(&make(&c, dtype, shape).await?, &want, &format!("make {dtype:?}{shape:?}"))?;
            let back: RpcTensor =
                c.call("echo", &TensorParams { tensor: RpcTensor(want.clone()) }).await.map_err(fail)?;
            same(&back, &want, &format!("echo {dtype:?}{shape:?}"))?;
            let info = inspect(&c, &want).await?;
            ensure!(info.shape == shape && info.nbytes == want.as_bytes().len() as u64, "inspect: {info:?}");
        }
    }
    Ok(())
}

async fn large_tensor() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let shape = [1920u64, 1080, 3];
    let want = expected(DType::F32, &shape);
    let got = make(&c, DType::F32, &shape).await?;
    same(&got, &want, "make f32[1920,1080,3]")?;
    let info = inspect(&c, &want).await?;
    ensure!(info.checksum == checksum(want.as_bytes()).to_string(), "inspect of 24.9 MB: {info:?}");
    let back: RpcTensor = c.call("echo", &TensorParams { tensor: RpcTensor(got) }).await.map_err(fail)?;
    same(&back, &want, "echo of 24.9 MB")
}

async fn named_maps() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let names = ["fc1.weight", "fc1.bias", "layers/0/w", "ünïcode"];
    let m: TensorMap =
        c.call("make_map", &json!({"names": names, "dtype": "bf16", "shape": [32, 16]})).await.map_err(fail)?;
    let mut keys: Vec<&str> = m.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want_keys = names.to_vec();
    want_keys.sort_unstable();
    ensure!(keys == want_keys, "make_map keys {keys:?}");
    let want = expected(DType::Bf16, &[32, 16]);
    for (name, t) in &m {
        same(t, &want, &format!("make_map {name}"))?;
    }
    let back: TensorMap = c.call("echo_map", &MapParams { tensors: m }).await.map_err(fail)?;
    ensure!(back.len() == names.len(), "echo_map gave {} tensors", back.len());
    let mut local = TensorMap::new();
    local.insert("w".into(), RpcTensor(expected(DType::I64, &[100, 100])));
    local.insert("b".into(), RpcTensor(expected(DType::F16, &[7])));
    local.insert("e".into(), RpcTensor(expected(DType::U8, &[0])));
    let infos: std::collections::BTreeMap<String, TensorInfo> =
        c.call("inspect_map", &MapParams { tensors: local.clone() }).await.map_err(fail)?;
    for (k, t) in &local {
        let info = infos.get(k).ok_or_else(|| fail(format!("inspect_map lost {k}")))?;
        ensure!(info.checksum == checksum(t.as_bytes()).to_string(), "inspect_map {k}: {info:?}");
    }
    let empty: TensorMap = c.call("echo_map", &json!({"tensors": {}})).await.map_err(fail)?;
    ensure!(empty.is_empty(), "echo_map of nothing gave {empty:?}");
    let over: Vec<String> = (0..=4096).map(|i| format!("t{i}")).collect();
    let e = c
        .call::<_, TensorMap>("make_map", &json!({"names": over, "dtype": "u8", "shape": [1]}))
        .await
        .expect_err("4097 names");
    ensure!(e.code() == Some(-32602), "over MAX_MAP_ENTRIES: {e}");
    Ok(())
}

async fn nested() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let big = RpcTensor(expected(DType::F32, &[300, 300]));
    let small = RpcTensor(expected(DType::I32, &[3]));
    let u = RpcTensor(expected(DType::U8, &[5]));
    for maybe in [None, Some(RpcTensor(expected(DType::F64, &[2, 2])))] {
        let map = TensorMap::from([("a".to_string(), u.clone())]);
        let value = Nested { name: "n".into(), list: vec![small.clone(), big.clone()], map, maybe: maybe.clone() };
        let back: Nested = c.call("echo_nested", &NestedParams { value }).await.map_err(fail)?;
        ensure!(back.name == "n" && back.list.len() == 2, "echo_nested: name {} list {}", back.name, back.list.len());
        same(&back.list[1], &big, "nested list")?;
        same(back.map.get("a").ok_or_else(|| fail("nested map lost a"))?, &u, "nested map")?;
        match (&back.maybe, &maybe) {
            (None, None) => {}
            (Some(got), Some(want)) => same(got, want, "nested maybe")?,
            _ => return Err(fail(format!("nested maybe: sent {}, got {}", maybe.is_some(), back.maybe.is_some()))),
        }
    }
    Ok(())
}

async fn roundtrip() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let child = json!({"points": [], "color": "blue", "counts": {}, "pair": [-1, ""], "flag": false,
                       "big": -(1i64 << 53) + 1, "child": null});
    let value = json!({
        "points": [{"x": 1.5, "y": -2.0, "label": "ä ß 東京"}, {"x": 0.0, "y": 1e300}],
        "color": "red", "counts": {"a": 1, "b": 4294967295u32}, "pair": [(1i64 << 53) - 1, "two"],
        "flag": true, "big": (1i64 << 53) - 1, "child": child,
    });
    let back: Value = c.call("roundtrip", &json!({"value": value})).await.map_err(fail)?;
    ensure!(back == value, "roundtrip gave {back}");
    for bad in [json!({"color": "mauve"}), json!({"counts": {"a": -1}}), json!({"pair": [1]})] {
        let mut v = value.clone();
        for (k, x) in bad.as_object().into_iter().flatten() {
            v[k] = x.clone();
        }
        let e = c.call::<_, Value>("roundtrip", &json!({"value": v})).await.expect_err("ill-typed");
        ensure!(e.code() == Some(-32602), "ill-typed roundtrip ({bad}): {e}");
    }
    Ok(())
}

async fn errors() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let doc = c.discover().await.map_err(fail)?;
    let table = doc["x-ferry-errors"].as_array().ok_or_else(|| fail("no x-ferry-errors in rpc.discover"))?;
    ensure!(!table.is_empty(), "an empty error table");
    for row in table {
        let code = row["code"].as_i64().ok_or_else(|| fail(format!("error row {row}")))?;
        let message = row["message"].as_str().unwrap_or("m");
        let e = c
            .call::<_, Value>("fail", &json!({"code": code, "message": message, "data": {"row": row["name"]}}))
            .await
            .expect_err("fail fails");
        let CallError::Rpc(e) = e else { return Err(fail(format!("fail {code}: {e}"))) };
        ensure!(e.code == code && e.message == message, "fail {code}: {e}");
        ensure!(e.data == Some(json!({"row": row["name"]})), "fail {code}: data {:?}", e.data);
    }
    let e = c.call::<_, Value>("fail", &json!({"code": 4242, "message": "app"})).await.expect_err("fails");
    ensure!(e.code() == Some(4242), "an application code: {e}");
    let e = c.call::<_, Value>("no_such_method", &()).await.expect_err("no such method");
    ensure!(e.code() == Some(-32601), "method not found: {e}");
    let e = c.call::<_, Value>("make", &json!({"dtype": "f33", "shape": [1]})).await.expect_err("bad dtype");
    let CallError::Rpc(e) = e else { return Err(fail(format!("bad dtype: {e}"))) };
    ensure!(e.code == -32602, "bad dtype: {e}");
    let path = e.data.as_ref().and_then(|d| d.get("path")).cloned();
    ensure!(path == Some(json!("dtype")), "bad dtype: data.path is {path:?}");
    let e = c.call::<_, Value>("make", &json!({"dtype": "u8", "shape": [1], "extra": 1})).await.expect_err("extra");
    ensure!(e.code() == Some(-32602), "an unknown param: {e}");
    let e = c.call::<_, Value>("make", &json!({"dtype": "f32", "shape": [1 << 20, 1 << 10]})).await.expect_err("big");
    ensure!(e.code() == Some(-32602), "over MAX_MAKE_BYTES: {e}");
    let e = c.call::<_, Value>("slow", &json!({"ms": 600_001})).await.expect_err("too slow");
    ensure!(e.code() == Some(-32602), "over MAX_SLOW_MS: {e}");
    Ok(())
}

async fn batch_and_notify() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let x = expected(DType::F32, &[100, 100]);
    let calls = [
        ("make", Some(json!({"dtype": "u8", "shape": [4]}))),
        ("fail", Some(json!({"code": 42, "message": "no"}))),
        ("inspect", Some(json!({"tensor": {"$tensor": 0}}))),
        ("nope", None),
    ];
    let r = c.batch(&calls, vec![x.clone()]).await.map_err(fail)?;
    ensure!(r.len() == 4, "{} results", r.len());
    let (v, ts) = r[0].as_ref().map_err(|e| fail(format!("batch make: {e}")))?;
    let t: RpcTensor = ferry::ferry_rpc::tensor::from_value(v.clone(), ts).map_err(|e| fail(e.inner().to_string()))?;
    same(&t, &expected(DType::U8, &[4]), "batch make")?;
    ensure!(matches!(&r[1], Err(e) if e.code == 42), "batch fail: {:?}", r[1].as_ref().err());
    let info = r[2].as_ref().map_err(|e| fail(format!("batch inspect: {e}")))?;
    ensure!(info.0["checksum"] == json!(checksum(x.as_bytes()).to_string()), "batch inspect: {}", info.0);
    ensure!(matches!(&r[3], Err(e) if e.code == -32601), "batch nope: {:?}", r[3].as_ref().err());
    c.notify("fail", &json!({"code": 1, "message": "never answered"})).await.map_err(fail)?;
    c.notify("echo", &TensorParams { tensor: RpcTensor(x) }).await.map_err(fail)?;
    let who: Value = c.call("whoami", &()).await.map_err(fail)?;
    ensure!(who["kind"] == "pipe", "after notifications: {who}");
    Ok(())
}

async fn timeout_and_concurrency() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let t0 = Instant::now();
    let e = c.call_timeout::<_, u64>("slow", &json!({"ms": 10_000}), Duration::from_millis(300)).await;
    ensure!(matches!(e, Err(CallError::Timeout(_))), "slow 10 s with a 300 ms timeout: {e:?}");
    ensure!(t0.elapsed() < Duration::from_secs(3), "the timeout took {:?}", t0.elapsed());
    let one: u64 = c.call("slow", &json!({"ms": 1})).await.map_err(fail)?;
    ensure!(one == 1, "slow 1 after a timeout: {one}");
    let calls = (0..32u64).map(|i| {
        let c = c.clone();
        async move {
            if i % 2 == 0 {
                let ms: u64 = c.call("slow", &json!({"ms": 40 - i})).await.map_err(fail)?;
                ensure!(ms == 40 - i, "slow {} gave {ms}", 40 - i);
            } else {
                let t = make(&c, DType::I32, &[i, 10]).await?;
                same(&t, &expected(DType::I32, &[i, 10]), "make in flight")?;
            }
            Ok::<(), Failed>(())
        }
    });
    for r in futures_join(calls).await {
        r?;
    }
    Ok(())
}

async fn futures_join<F: std::future::Future + Send + 'static>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a call task panicked"));
    }
    out
}

async fn tasks() -> Outcome {
    let c = connect(&shared_addr()?, true).await?;
    let id = c.submit("slow", &json!({"ms": 300}), false).await.map_err(fail)?;
    let st = c.task_status(&id).await.map_err(fail)?;
    ensure!(st.state == TaskState::Running && st.method == "slow", "status right after submit: {st:?}");
    let ms: u64 = c.task_result(&id, Duration::from_secs(10)).await.map_err(fail)?;
    ensure!(ms == 300, "task result {ms}");
    let again = c.task_result::<u64>(&id, Duration::ZERO).await;
    ensure!(again.is_err(), "a result fetched twice");
    let long = c.submit("slow", &json!({"ms": 60_000}), false).await.map_err(fail)?;
    let st = c.task_cancel(&long).await.map_err(fail)?;
    ensure!(st.state == TaskState::Cancelled, "cancel: {st:?}");
    let r = c.task_result::<u64>(&long, Duration::from_secs(1)).await;
    ensure!(r.is_err(), "a cancelled task gave {r:?}");
    let id = c.submit("make", &json!({"dtype": "i16", "shape": [10, 10]}), false).await.map_err(fail)?;
    let t: RpcTensor = c.task_result(&id, Duration::from_secs(10)).await.map_err(fail)?;
    same(&t, &expected(DType::I16, &[10, 10]), "task make")
}

/// A server killed (SIGKILL) while calls run: they fail within 2 s, later calls fail, and
/// the tensors received from it stay readable.
async fn server_gone_mid_call() -> Outcome {
    let mut server = Server::start().map_err(fail)?;
    let c = connect(&server.addr, true).await?;
    let held = make(&c, DType::F32, &[1024, 1024]).await?;
    let pending: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.call::<_, u64>("slow", &json!({"ms": 60_000})).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    server.kill();
    for p in pending {
        let r = tokio::time::timeout(Duration::from_secs(5), p).await.map_err(|_| fail("a call hangs"))?;
        let r = r.map_err(fail)?;
        ensure!(matches!(r, Err(CallError::Closed(_))), "a call when the server died: {r:?}");
    }
    ensure!(killed.elapsed() < Duration::from_secs(2), "took {:?} to notice", killed.elapsed());
    let r = c.call::<_, Value>("whoami", &()).await;
    ensure!(matches!(r, Err(CallError::Closed(_))), "a call after: {r:?}");
    same(&held, &expected(DType::F32, &[1024, 1024]), "memory of a dead server")
}

fn case<Fut>(f: fn() -> Fut) -> Suite
where
    Fut: std::future::Future<Output = Outcome> + 'static,
{
    Box::new(move || run_async(Duration::from_secs(120), f()))
}

fn main() -> ExitCode {
    let column = std::env::var("FERRY_CONFORMANCE_COLUMN").unwrap_or_else(|_| "rust-server".into());
    let cases: Vec<(String, Suite)> = vec![
        ("rpc::dtypes_shm".into(), Box::new(|| run_async(Duration::from_secs(120), dtypes(true)))),
        ("rpc::dtypes_inline".into(), Box::new(|| run_async(Duration::from_secs(120), dtypes(false)))),
        ("rpc::empty_and_scalar".into(), case(empty_and_scalar)),
        ("rpc::large_tensor".into(), case(large_tensor)),
        ("rpc::named_maps".into(), case(named_maps)),
        ("rpc::nested".into(), case(nested)),
        ("rpc::roundtrip".into(), case(roundtrip)),
        ("rpc::errors".into(), case(errors)),
        ("rpc::batch_and_notify".into(), case(batch_and_notify)),
        ("rpc::timeout_and_concurrency".into(), case(timeout_and_concurrency)),
        ("rpc::tasks".into(), case(tasks)),
        ("rpc::server_gone_mid_call".into(), case(server_gone_mid_call)),
    ];
    let listing = std::env::args().any(|a| a == "--list");
    let viability = if listing { Ok(()) } else { shared().as_ref().map(|_| ()).map_err(Clone::clone) };
    let code = ferry_conformance::run_suite(&column, viability, cases);
    if let Ok(s) = shared() {
        s.lock().unwrap_or_else(|e| e.into_inner()).kill();
    }
    code
}
