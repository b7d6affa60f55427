//! Recording a trace from real tiers (real files in a temp dir): every use the policy sees
//! is written in order, keys and sizes as the tiers know them, in the format `Trace::load`
//! reads; the file is complete once flushed or once the tiers are dropped; recording stops
//! at its limit; a trace file that fails never fails a use.

use bytes::Bytes;
use ferry_store::placement::trace::{Trace, Use};
use ferry_store::placement::{DEFAULT_TRACE_LIMIT, Flow, FlowOptions, Key, Lru, Pin, TierOptions, Tiers};

const KB: usize = 1 << 10;

fn tensor(i: usize, len: usize) -> Bytes {
    Bytes::from((0..len).map(|j| ((i * 7 + j) % 251) as u8).collect::<Vec<u8>>())
}

fn recording(dir: &std::path::Path, cpu: u64, limit: u64) -> (TierOptions, std::path::PathBuf) {
    let trace = dir.join("uses.jsonl");
    let opts = TierOptions {
        record_trace: Some(trace.clone()),
        trace_limit: limit,
        ..TierOptions::new(cpu, dir.join("disk"))
    };
    (opts, trace)
}

#[test]
fn every_use_the_policy_sees_is_recorded_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (opts, path) = recording(dir.path(), 200 * KB as u64, DEFAULT_TRACE_LIMIT);
    let tiers = Tiers::new(opts, Box::new(Flow::new(FlowOptions::default()))).unwrap();
    let sizes = [64 * KB, 100 * KB, 32 * KB, 128 * KB, 16 * KB];
    let mut made: Vec<Use> = Vec::new();
    let mut keys: Vec<Key> = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let k = tiers.put(tensor(i, len)).unwrap();
        keys.push(k);
        // A put is the tensor's first use, as the policy sees it.
        made.push(Use { key: k, bytes: len as u64 });
    }
    // Passes in layer order, declared, then an irregular mix.
    tiers.schedule(&[keys.clone(), keys.clone()].concat());
    let order: Vec<usize> = (0..2).flat_map(|_| 0..sizes.len()).chain([3, 3, 0, 4, 1, 3, 2, 2, 0]).collect();
    for &i in &order {
        assert_eq!(tiers.get(keys[i]).unwrap().bytes, tensor(i, sizes[i]), "tensor {i}");
        made.push(Use { key: keys[i], bytes: sizes[i] as u64 });
    }
    // A tensor placed by hand is outside the policy: its uses are not the policy's.
    tiers.place(keys[2], Pin::Cpu).unwrap();
    assert!(tiers.get(keys[2]).is_ok());
    tiers.place(keys[2], Pin::Auto).unwrap();
    assert!(tiers.get(keys[2]).is_ok());
    made.push(Use { key: keys[2], bytes: sizes[2] as u64 });

    assert_eq!(tiers.flush_trace(), Some(made.len() as u64));
    let t = Trace::load(&path, true).unwrap();
    assert_eq!(t.uses, made, "the flushed trace is the uses made, in order");
    assert_eq!(t.footprint(), (sizes.len(), sizes.iter().sum::<usize>() as u64));

    // More uses after a flush, then the tiers dropped: the file has them all.
    for &i in &[4, 1] {
        tiers.get(keys[i]).unwrap();
        made.push(Use { key: keys[i], bytes: sizes[i] as u64 });
    }
    drop(tiers);
    assert_eq!(Trace::load(&path, true).unwrap().uses, made, "dropping the tiers writes the rest");
}

#[test]
fn recording_stops_at_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (opts, path) = recording(dir.path(), 64 * KB as u64, 7);
    let tiers = Tiers::new(opts, Box::new(Lru::default())).unwrap();
    let keys: Vec<Key> = (0..4).map(|i| tiers.put(tensor(i, 16 * KB)).unwrap()).collect();
    let mut made: Vec<Use> = keys.iter().map(|&key| Use { key, bytes: 16 * KB as u64 }).collect();
    for round in 0..10 {
        for &k in &keys {
            assert_eq!(tiers.get(k).unwrap().bytes.len(), 16 * KB, "round {round}");
            made.push(Use { key: k, bytes: 16 * KB as u64 });
        }
    }
    assert_eq!(tiers.flush_trace(), Some(7), "recording stopped at 7 uses");
    drop(tiers);
    let t = Trace::load(&path, false).unwrap();
    assert_eq!(t.uses, made[..7], "the first 7 uses, no more");
}

#[test]
fn a_trace_file_that_cannot_be_made_is_named_and_none_recorded_without_asking() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("no such dir").join("uses.jsonl");
    let opts = TierOptions { record_trace: Some(bad.clone()), ..TierOptions::new(KB as u64, dir.path().join("disk")) };
    let e = Tiers::new(opts, Box::new(Lru::default())).err().expect("a trace file in a missing directory");
    assert!(e.to_string().contains("uses.jsonl"), "{e}");
    let tiers = Tiers::new(TierOptions::new(KB as u64, dir.path().join("disk")), Box::new(Lru::default())).unwrap();
    tiers.put(tensor(0, KB)).unwrap();
    assert_eq!(tiers.flush_trace(), None, "no trace unless asked");
}

/// A trace file whose writes fail (`/dev/full`: every write is ENOSPC): recording stops,
/// and every use still succeeds.
#[cfg(target_os = "linux")]
#[test]
fn a_failing_trace_file_never_fails_a_use() {
    let full = std::path::Path::new("/dev/full");
    if !full.exists() {
        eprintln!("skipped: no /dev/full");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = TierOptions { record_trace: Some(full.into()), ..TierOptions::new(32 * KB as u64, dir.path()) };
    let tiers = Tiers::new(opts, Box::new(Lru::default())).unwrap();
    let keys: Vec<Key> = (0..4).map(|i| tiers.put(tensor(i, 16 * KB)).unwrap()).collect();
    assert_eq!(tiers.flush_trace(), Some(4), "4 uses buffered; the flush fails and recording stops");
    for round in 0..3 {
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(tiers.get(k).unwrap().bytes, tensor(i, 16 * KB), "round {round}");
        }
    }
    assert_eq!(tiers.flush_trace(), Some(4), "nothing more recorded after the failure");
}
