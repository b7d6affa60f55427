//! Figures for weight sync (issue 47), not a test: `cargo test --release -p ferry-store
//! --test bench_weights -- --ignored --nocapture` (`FERRY_BENCH_TENSORS`, default 256
//! tensors of 4 MiB bf16: 1 GiB). Prints, for a "training step" that changes 1% of the
//! elements at random, the delta's bytes against the full state's, and the same-host
//! publish against a memcpy of the changed bytes; then the same for a step that changes
//! 1% of the tensors whole.
#![cfg(target_os = "linux")]

use std::time::Instant;

use bytes::Bytes;
use ferry_core::{DType, Tensor, TensorMeta};
use ferry_store::delta::DeltaParams;
use ferry_store::replica::Replica;
use ferry_store::{Store, StoreOptions};
use serde_json::Value;

const ELEMS: usize = 2 << 20; // 4 MiB of bf16

fn tensor(v: &[u8]) -> Tensor {
    Tensor::new(TensorMeta::new(DType::Bf16, vec![(v.len() / 2) as u64]), Bytes::copy_from_slice(v)).unwrap()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[test]
#[ignore = "a benchmark: run with --release --ignored --nocapture"]
fn bench_weights() {
    let n: usize = std::env::var("FERRY_BENCH_TENSORS").ok().and_then(|s| s.parse().ok()).unwrap_or(256);
    let mut rng = fastrand::Rng::with_seed(47);
    let mut state: Vec<Vec<u8>> = (0..n).map(|_| (0..ELEMS * 2).map(|_| rng.u8(..)).collect()).collect();
    let full = (n * ELEMS * 2) as u64;
    let store = Store::new(StoreOptions { budget_bytes: 64 << 30, delta_bases: 1, ..StoreOptions::default() });
    let names: Vec<String> = (0..n).map(|i| format!("layer.{i:03}.weight")).collect();
    let publish = |state: &[Vec<u8>]| {
        let ts = names.iter().zip(state).map(|(k, v)| (k.clone(), tensor(v))).collect();
        let t = Instant::now();
        let v = store.publish("m", ts, Value::Null, None).unwrap();
        (v, ms(t))
    };
    let (v1, t1) = publish(&state);
    v1.manifest().wait_digest();
    let mut replica = Replica::new("m");
    let d = store
        .delta(&DeltaParams { name: "m".into(), from: None, from_tree: None, to: None, sparse: true, wait_ms: None })
        .unwrap();
    replica.apply(&d).unwrap();
    drop((d, v1));
    println!("state: {n} x 4 MiB bf16 = {} MiB; first publish (copy) {t1:.1} ms", full >> 20);

    // Step 1: 1% of the elements, at random.
    let changes = n * ELEMS / 100;
    for _ in 0..changes {
        let (t, e) = (rng.usize(..n), rng.usize(..ELEMS));
        state[t][e * 2] ^= 1 + rng.u8(..0x7f);
    }
    let (v2, tp) = publish(&state);
    let new_bytes = v2.manifest().new_bytes;
    v2.manifest().wait_digest();
    let t = Instant::now();
    let d = store.delta(&replica.held().params(None)).unwrap();
    let td = ms(t);
    let t = Instant::now();
    let a = replica.apply(&d).unwrap();
    let ta = ms(t);
    // A memcpy of the bytes of the changed tensors (here every one) and of the changed elements.
    let mut dst = vec![0u8; ELEMS * 2];
    let t = Instant::now();
    for v in &state {
        dst.copy_from_slice(v);
    }
    let tc = ms(t);
    std::hint::black_box(&dst);
    println!("\n1% of elements changed at random ({changes} changes, {} elements differ):", a.elements);
    println!("| what | bytes | % of full | ms |");
    println!("|---|---|---|---|");
    println!("| full state | {full} | 100 | |");
    println!(
        "| delta (sent_bytes: u32 indices + values) | {} | {:.2} | {td:.1} (store.delta) |",
        d.sent_bytes,
        100.0 * d.sent_bytes as f64 / full as f64
    );
    println!("| apply at the reader (verify + write) | | | {ta:.1} |");
    println!(
        "| same-host publish (compares with v1) | {new_bytes} new | {:.1} | {tp:.1} |",
        100.0 * new_bytes as f64 / full as f64
    );
    println!("| memcpy of the changed tensors' bytes | {full} | 100 | {tc:.1} |");
    drop((d, v2));

    // Step 2: 1% of the tensors change whole (the case sharing is for).
    let k = (n / 100).max(1);
    let changed: Vec<usize> = (0..k).map(|i| i * 97 % n).collect();
    for &i in &changed {
        state[i].iter_mut().for_each(|b| *b = b.wrapping_add(1));
    }
    let (v3, tp) = publish(&state);
    let new_bytes = v3.manifest().new_bytes;
    v3.manifest().wait_digest();
    let base = v3.manifest().version;
    for &i in &changed {
        state[i].iter_mut().for_each(|b| *b = b.wrapping_add(1));
    }
    let ts: Vec<(String, Tensor)> = changed.iter().map(|&i| (names[i].clone(), tensor(&state[i]))).collect();
    let t = Instant::now();
    let v4 = store.publish_delta("m", base, ts, &[], Value::Null, None).unwrap();
    let tpd = ms(t);
    let t = Instant::now();
    for &i in &changed {
        dst.copy_from_slice(&state[i]);
    }
    let tc = ms(t);
    std::hint::black_box(&dst);
    let t = Instant::now();
    let d = store.delta(&replica.held().params(None)).unwrap();
    let td = ms(t);
    println!("\n1% of the tensors changed whole ({k} of {n}):");
    println!("| what | bytes | ms |");
    println!("|---|---|---|");
    println!("| same-host publish, whole state (compares) | {new_bytes} new | {tp:.1} |");
    println!("| same-host publish_delta (told what changed) | {} new | {tpd:.2} |", v4.manifest().new_bytes);
    println!("| memcpy of the changed bytes | {} | {tc:.2} |", k * ELEMS * 2);
    println!("| delta from v2 to v4 | {} sent of {} | {td:.1} |", d.sent_bytes, d.full_bytes);
    println!("store used_bytes: {} MiB (versions share storage; v2 kept as a delta base)", store.used_bytes() >> 20);
}
