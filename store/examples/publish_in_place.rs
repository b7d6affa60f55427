//! Benchmark: publishing a version built in place (issue 18: at most 1 ms plus the
//! producer's own writes). Each round builds a 1,000-tensor bundle (1 GiB by default) with
//! `Store::builder`, fills every tensor, and commits; the producer's writes are timed apart
//! from the store's own work (allocating the buckets, committing), and a fill of fresh heap
//! memory of the same size is the baseline for the writes.
//!
//!     cargo run --release -p ferry-store --example publish_in_place [-- MIB ROUNDS]

use std::time::{Duration, Instant};

use ferry_core::{DType, TensorMeta};
use ferry_store::{Store, StoreOptions};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let tensors = 1000;
    let per = mib * (1 << 20) / tensors / 4;
    let store = Store::new(StoreOptions { budget_bytes: 64 << 30, ..StoreOptions::default() });
    let specs: Vec<(String, TensorMeta)> =
        (0..tensors).map(|i| (format!("layers.{i}.weight"), TensorMeta::new(DType::F32, vec![per as u64]))).collect();
    let (mut alloc, mut fill, mut commit, mut heap) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let t = Instant::now();
        let mut b = store.builder("m", specs.clone(), None).expect("builder");
        alloc.push(t.elapsed());
        let t = Instant::now();
        for i in 0..tensors {
            b.tensor_mut_at(i).expect("tensor").fill(round as u8);
        }
        fill.push(t.elapsed());
        let t = Instant::now();
        let v = b.commit(serde_json::json!({ "round": round })).expect("commit");
        commit.push(t.elapsed());
        drop(v);
        // The same writes into fresh heap memory (pages faulted in as they are written).
        let t = Instant::now();
        let mut bufs: Vec<Vec<u8>> = (0..tensors).map(|_| vec![0u8; per * 4]).collect();
        for buf in &mut bufs {
            buf.fill(round as u8);
        }
        heap.push(t.elapsed());
        drop(bufs);
    }
    let (a, f, c, h) = (median(alloc), median(fill), median(commit), median(heap));
    println!("publish in place, {tensors} tensors, {mib} MiB, p50 of {rounds}:");
    println!("  builder (allocate buckets)   {:10.3} ms", a.as_secs_f64() * 1e3);
    println!("  producer's writes            {:10.3} ms", f.as_secs_f64() * 1e3);
    println!("  commit                       {:10.3} ms", c.as_secs_f64() * 1e3);
    println!("  store's own work (builder + commit): {:.3} ms (target <= 1 ms)", (a + c).as_secs_f64() * 1e3);
    println!("  the same writes into fresh heap memory: {:.3} ms", h.as_secs_f64() * 1e3);
}
