//! Benchmark: publishing a `.safetensors` checkpoint (`weights::publish_safetensors`, the
//! path of `ferry serve-weights`): the file read into a bucket, decoded by core's
//! `SafetensorsCodec` through the `TensorCodec` trait, and published. A 1,000-tensor file
//! (512 MiB by default) is written once to a temporary directory; each round publishes it
//! as the next version of one name, so the previous version's buckets are freed between
//! rounds. A plain read of the same file into a fresh heap buffer is the baseline.
//!
//!     cargo run --release -p ferry-store --example import [-- MIB ROUNDS]

use std::io::Read;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_core::{DType, SafetensorsCodec, Tensor, TensorCodec, TensorMeta};
use ferry_store::{Store, StoreOptions};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(512);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let tensors = 1000;
    let per = mib * (1 << 20) / tensors / 4;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("model.safetensors");
    let named: Vec<(String, Tensor)> = (0..tensors)
        .map(|i| {
            let meta = TensorMeta::new(DType::F32, vec![per as u64]);
            (format!("layers.{i}.weight"), Tensor::new(meta, Bytes::from(vec![i as u8; per * 4])).expect("tensor"))
        })
        .collect();
    let mut file = Vec::new();
    SafetensorsCodec.encode(&named, &mut file).expect("encode");
    drop(named);
    std::fs::write(&path, &file).expect("write the checkpoint");
    let len = file.len();
    drop(file);
    let store = Store::new(StoreOptions { budget_bytes: 64 << 30, digest: false, ..StoreOptions::default() });
    let (mut publish, mut read) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let mut buf = vec![0u8; len];
        std::fs::File::open(&path).and_then(|mut f| f.read_exact(&mut buf)).expect("read");
        read.push(t.elapsed());
        drop(buf);
        let t = Instant::now();
        let v = ferry_store::weights::publish_safetensors(
            &store,
            "model",
            std::slice::from_ref(&path),
            serde_json::Value::Null,
            &mut |_, _| {},
        )
        .expect("publish");
        publish.push(t.elapsed());
        assert_eq!(v.tensors().len(), tensors);
    }
    println!(
        "import of {tensors} tensors, {} MiB: publish_safetensors p50 {:.1} ms; plain read into the heap p50 {:.1} ms ({rounds} rounds)",
        len >> 20,
        median(publish).as_secs_f64() * 1e3,
        median(read).as_secs_f64() * 1e3,
    );
}
