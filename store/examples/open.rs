//! Benchmark: `store.open` of a 1,000-tensor bundle against a one-tensor bundle of the same
//! bytes (issue 18: p50 at most 2 ms, and at most 2x the one-tensor open), from a Rust
//! client over a real pipe with the shm channel, in one run. The Python side of the same
//! target is `bindings/python/bench/store_open.py`.
//!
//!     cargo run --release -p ferry-store --example open [-- MIB OPENS]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{DType, Endpoint, InlineChannel, TensorMeta};
use ferry_local::LocalTransport;
use ferry_rpc::{Client, Server};
use ferry_shm::ShmChannel;
use ferry_store::{Store, StoreOptions};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn build(store: &Arc<Store>, name: &str, tensors: usize, bytes: usize) {
    let per = bytes / tensors / 4;
    let specs = (0..tensors).map(|i| (format!("layers.{i}.weight"), TensorMeta::new(DType::F32, vec![per as u64])));
    let b = store.builder(name, specs.collect(), None).expect("builder");
    let v = b.commit(serde_json::Value::Null).expect("commit");
    v.manifest().wait_digest(); // (the digest thread would compete with the opens)
}

/// p50 of `opens` opens: the open alone (the version's buckets mapped, its manifest read:
/// what Python's `open_bundle` does before a lookup), and the open with every tensor made.
async fn p50(client: &Client, name: &str, opens: usize) -> (Duration, Duration) {
    let (mut open, mut all) = (Vec::with_capacity(opens), Vec::with_capacity(opens));
    for _ in 0..opens {
        let t = Instant::now();
        let opened = ferry_store::rpc::open(client, name, None, None).await.expect("open");
        open.push(t.elapsed());
        let tensors = opened.tensors().expect("manifest");
        all.push(t.elapsed());
        drop((tensors, opened));
    }
    (median(open), median(all))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let opens: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let store = Store::new(StoreOptions { budget_bytes: 64 << 30, ..StoreOptions::default() });
    build(&store, "many", 1000, mib << 20);
    build(&store, "one", 1, mib << 20);
    let ep = Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build();
    let addr = format!("unix:ferry-store-open-bench-{}", std::process::id());
    let listener = ep.listen(&addr).await.expect("listen");
    let server = Server::builder(ferry_store::rpc::methods(store).expect("methods")).build();
    tokio::spawn(async move { server.serve(listener).await });
    let client = Client::new(ep.connect(&addr).await.expect("connect"));
    p50(&client, "many", 10).await; // (warm-up: first mappings)
    p50(&client, "one", 10).await;
    let many = p50(&client, "many", opens).await;
    let one = p50(&client, "one", opens).await;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("store.open from Rust, {mib} MiB, p50 of {opens}:   open    open + every tensor made");
    println!("  1000 tensors                     {:8.3} ms  {:8.3} ms", ms(many.0), ms(many.1));
    println!("  1 tensor                         {:8.3} ms  {:8.3} ms", ms(one.0), ms(one.1));
    println!(
        "  ratio                            {:8.2}x   {:8.2}x   (target <= 2x; p50 target <= 2 ms)",
        ms(many.0) / ms(one.0),
        ms(many.1) / ms(one.1)
    );
}
