//! The placement benchmark (`cargo xtask placement-bench`): traces replayed through every
//! policy against Belady's MIN (synthetic ones, and `recorded-mlp`: one recorded from a
//! real run of the store, [`RECORDED_MLP`]), then the layer trace run for real between a
//! disk tier (a file whose pages are dropped from the page cache after each read) and a
//! cpu tier.
//!
//! `cargo run --release -p ferry-store --example placement -- [--quick] [--dir DIR]
//! [--trace FILE]...` (`--trace`: a JSON-lines trace, e.g. recorded by `ferry serve-weights
//! --placement POLICY --record-trace FILE`; `--quick`: small sizes; `--dir`: where
//! the disk tier's file goes, default the temp directory, which must not be tmpfs).

use std::collections::HashMap;
use std::fs::File;
use std::hint::black_box;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_store::placement::replay::{Link, Report, replay, start};
use ferry_store::placement::trace::{self, Trace};
use ferry_store::placement::{Flow, FlowOptions, Genoa, Key, Lru, Min, Pinned, Policy, View};

const MIB: u64 = 1 << 20;

/// A trace recorded from a real run of the store: `ferry serve-weights --placement flow
/// --cpu-budget-mib 12 --record-trace` under examples/python/placement_mlp.py
/// `--passes 20` (8 layers of 4 MiB kept as references, then 20 forward passes with `lru`
/// and 20 with `flow` and the declared layer order; the trace holds the uses, not the
/// policy). Relative to this crate's directory.
const RECORDED_MLP: &str = "examples/traces/mlp.jsonl";

/// The cpu tier that run had (`--cpu-budget-mib 12`).
const RECORDED_MLP_BUDGET: u64 = 12 * MIB;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let recorded: Vec<&String> =
        args.iter().zip(args.iter().skip(1)).filter(|(a, _)| *a == "--trace").map(|(_, f)| f).collect();
    let base = args
        .iter()
        .zip(args.iter().skip(1))
        .find(|(a, _)| *a == "--dir")
        .map_or_else(std::env::temp_dir, |(_, d)| d.into());
    let dir = tempfile::tempdir_in(&base)?;
    eprintln!("the disk tier's files go in {} (--dir DIR to choose; tmpfs would make it RAM)", base.display());

    eprintln!("measuring the disk -> cpu copy bandwidth (a file read with its pages dropped)...");
    let bw = disk_bandwidth(dir.path(), if quick { 64 * MIB } else { 256 * MIB })?;
    println!("disk -> cpu copies: {:.2} GB/s (measured)\n", bw / 1e9);

    let scale = if quick { 10 } else { 1 };
    let zipf = trace::zipf(10_000 / scale, 1.0, 200_000 / scale, MIB, 7);
    let scans = trace::zipf_with_scans(10_000 / scale, 1.0, 200_000 / scale, MIB, 5_000 / scale, 2_000 / scale, 8);
    let layer_bytes = 64 * MIB;
    let layers = trace::layers(32, layer_bytes, 4);
    let copy_s = layer_bytes as f64 / bw;
    let link = Link { bytes_per_s: bw, compute_s: 1.25 * copy_s };
    let a0 = trace::zipf_by_rank(10_000 / scale, 7);
    table(&zipf, 1000 / scale as u64 * MIB, None, Some(a0))?;
    table(&scans, 1000 / scale as u64 * MIB, None, None)?;
    table(&layers, 8 * layer_bytes, Some(link), None)?;
    // The recorded MLP: its order is known (the example declares its layer schedule); a
    // use computes for 1.25x a layer's copy, as above.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDED_MLP);
    let mut mlp = Trace::load(&path, true).map_err(|e| format!("{}: {e}", path.display()))?;
    mlp.name = format!("recorded-mlp ({RECORDED_MLP})");
    let per_use = mlp.uses.iter().map(|u| u.bytes).max().unwrap_or(0) as f64 / bw;
    table(&mlp, RECORDED_MLP_BUDGET, Some(Link { bytes_per_s: bw, compute_s: 1.25 * per_use }), None)?;
    for f in recorded {
        let t = Trace::load(Path::new(f), false)?;
        let (n, bytes) = t.footprint();
        table(&t, (bytes / 10).max(t.uses.iter().map(|u| u.bytes).max().unwrap_or(0)), None, None)?;
        eprintln!("({n} tensors in {f})");
    }

    let (n, per, budget, passes) = if quick { (8, 16 * MIB, 3, 2) } else { (16, 32 * MIB, 4, 3) };
    println!(
        "\nreal copies: {n} layers of {} MiB on disk, a cpu tier of {budget} layers, {passes} passes, compute per layer \
         1.25x its copy",
        per >> 20
    );
    println!("| policy | bytes read | wasted | stall | copy time needed | hidden | wall |");
    println!("|---|---|---|---|---|---|---|");
    let disk = DiskTier::create(dir.path(), n, per)?;
    let t = trace::layers(n, per, passes);
    let work = calibrate(per as usize, per as f64 / bw * 1.25);
    let keys: Vec<Key> = t.uses.iter().map(|u| u.key).collect();
    let policies: Vec<Box<dyn Policy>> = vec![
        Box::new(Flow::new(FlowOptions::default())),
        Box::new(Lru::default()),
        Box::new(Genoa),
        Box::new(Min::new(&keys)),
    ];
    for mut p in policies {
        let r = run_real(&t, p.as_mut(), budget as u64 * per, &disk, work)?;
        println!(
            "| {} | {} MiB | {} MiB | {:.1} ms | {:.1} ms | {:.0}% | {:.1} ms |",
            r.policy,
            r.bytes_moved >> 20,
            r.bytes_wasted >> 20,
            r.stall_s * 1e3,
            r.transfer_s * 1e3,
            r.hidden() * 100.0,
            r.total_s * 1e3
        );
    }
    Ok(())
}

/// Every policy on one trace: bytes moved against MIN, hit rate, and with a link the
/// modelled stall.
/// One trace through every policy, MIN and the oracles. `by_probability`: for a trace of
/// independent draws, its tensors from the most probable down (A0's row).
fn table(t: &Trace, budget: u64, link: Option<Link>, by_probability: Option<Vec<Key>>) -> Result<(), Error> {
    let (n, bytes) = t.footprint();
    println!(
        "trace {}: {} uses of {n} tensors ({} MiB), fast tier {} MiB{}",
        t.name,
        t.uses.len(),
        bytes >> 20,
        budget >> 20,
        link.map_or(String::new(), |l| format!(", compute {:.1} ms per use", l.compute_s * 1e3))
    );
    println!("| policy | bytes moved | x MIN | hit rate | stall (modelled) | hidden |");
    println!("|---|---|---|---|---|---|");
    let keys: Vec<Key> = t.uses.iter().map(|u| u.key).collect();
    let min = replay(t, &mut Min::new(&keys), budget, link)?;
    let policies: Vec<Box<dyn Policy>> = vec![
        Box::new(Pinned::default()),
        Box::new(Genoa),
        Box::new(Lru::default()),
        Box::new(Flow::new(FlowOptions::default())),
    ];
    let mut rows: Vec<Report> = Vec::new();
    for mut p in policies {
        rows.push(replay(t, p.as_mut(), budget, link)?);
    }
    // The most used tensors that fit, pinned from the start: knows each tensor's count in
    // the whole trace but not the order. On a trace of independent draws (Zipf) no online
    // policy does better on average: the limit for flow there, as MIN is for everyone.
    let sizes: HashMap<Key, u64> = t.uses.iter().map(|u| (u.key, u.bytes)).collect();
    let mut counts: HashMap<Key, u64> = HashMap::new();
    for u in &t.uses {
        *counts.entry(u.key).or_insert(0) += 1;
    }
    let mut by_count: Vec<(Key, u64)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let top = first_that_fit(by_count.into_iter().map(|(k, _)| k), &sizes, budget);
    let mut oracle = replay(t, &mut Pinned::keys(top), budget, link)?;
    oracle.policy = "top-by-count (oracle)".into();
    rows.push(oracle);
    // A0: the most probable tensors that fit, pinned. It knows the distribution, not the
    // draws; under independent draws it is the best any policy does on average (Aho,
    // Denning and Ullman 1971), so its ratio to MIN is the floor for flow's on this trace.
    if let Some(ranked) = by_probability {
        let keep = first_that_fit(ranked.into_iter(), &sizes, budget);
        let mut a0 = replay(t, &mut Pinned::keys(keep), budget, link)?;
        a0.policy = "most-probable (A0, the IRM optimum)".into();
        rows.push(a0);
    }
    rows.push(min.clone());
    for r in rows {
        println!(
            "| {} | {} MiB | {:.2}x | {:.1}% | {} | {} |",
            r.policy,
            r.bytes_moved >> 20,
            r.bytes_moved as f64 / min.bytes_moved.max(1) as f64,
            r.hit_rate() * 100.0,
            link.map_or("-".to_owned(), |_| format!("{:.0} ms", r.stall_s * 1e3)),
            link.map_or("-".to_owned(), |_| format!("{:.0}%", r.hidden() * 100.0)),
        );
    }
    println!();
    Ok(())
}

/// The keys of `ranked`, in order, that fit in `budget` bytes together (one that does not
/// fit is skipped, a smaller one after it may still fit).
fn first_that_fit(ranked: impl Iterator<Item = Key>, sizes: &HashMap<Key, u64>, budget: u64) -> Vec<Key> {
    let mut room = budget;
    let mut keep = Vec::new();
    for k in ranked {
        let b = sizes.get(&k).copied().unwrap_or(0);
        if b <= room {
            room -= b;
            keep.push(k);
        }
    }
    keep
}

/// The disk tier: one file holding every layer, its pages dropped from the page cache so
/// that each read comes from the disk.
struct DiskTier {
    file: File,
    per: u64,
}

impl DiskTier {
    fn create(dir: &Path, n: usize, per: u64) -> Result<DiskTier, Error> {
        let path = dir.join("disk-tier.bin");
        let mut f = File::create(&path)?;
        let chunk: Vec<u8> = (0..per).map(|i| (i % 251) as u8).collect();
        for _ in 0..n {
            std::io::Write::write_all(&mut f, &chunk)?;
        }
        f.sync_all()?;
        let file = File::open(&path)?;
        drop_cache(&file, 0, n as u64 * per);
        Ok(DiskTier { file, per })
    }

    /// Reads layer `key` into a new cpu buffer (a real copy), then drops its cached pages.
    fn read(&self, key: Key) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.per as usize];
        read_at(&self.file, &mut buf, key * self.per)?;
        drop_cache(&self.file, key * self.per, self.per);
        Ok(buf)
    }
}

fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_read(f, &mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

/// Drops the page cache's copy of a range (Linux; elsewhere reads may come from the cache).
fn drop_cache(_f: &File, _offset: u64, _len: u64) {
    #[cfg(target_os = "linux")]
    let _ = rustix::fs::fadvise(_f, _offset, std::num::NonZeroU64::new(_len), rustix::fs::Advice::DontNeed);
}

/// Copy bandwidth of the disk tier: a file of `bytes` written, its cache dropped, read back.
fn disk_bandwidth(dir: &Path, bytes: u64) -> Result<f64, Error> {
    let per = 8 * MIB;
    let disk = DiskTier::create(dir, (bytes / per) as usize, per)?;
    let start = Instant::now();
    for k in 0..bytes / per {
        black_box(disk.read(k)?);
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64())
}

/// How many passes over a buffer of `len` bytes take about `seconds` (the compute of a use).
fn calibrate(len: usize, seconds: f64) -> usize {
    let buf: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let start = Instant::now();
    for _ in 0..3 {
        black_box(compute(&buf, 1));
    }
    let one = start.elapsed().as_secs_f64() / 3.0;
    ((seconds / one).ceil() as usize).max(1)
}

/// The compute of a use: `passes` sums over the tensor's bytes.
fn compute(buf: &[u8], passes: usize) -> u64 {
    let mut s = 0u64;
    for p in 0..passes {
        s = s.wrapping_add(buf.iter().fold(p as u64, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b))));
    }
    s
}

/// Runs `t` with real copies: an I/O thread reads layers from the disk tier (misses and
/// prefetches, in order), the main thread waits for each use's tensor and computes.
fn run_real(t: &Trace, policy: &mut dyn Policy, budget: u64, disk: &DiskTier, work: usize) -> Result<Report, Error> {
    let mut r = start(t, policy);
    let mut view = View::new(budget);
    let mut io = Io::default();
    let began = Instant::now();
    std::thread::scope(|s| -> Result<(), Error> {
        let (req_tx, req_rx) = mpsc::channel::<Key>();
        let (done_tx, done_rx) = mpsc::channel::<Arrival>();
        s.spawn(move || {
            for k in req_rx {
                let t0 = Instant::now();
                let buf = disk.read(k);
                if done_tx.send((k, buf, t0.elapsed())).is_err() {
                    return;
                }
            }
        });
        for (step, u) in t.uses.iter().enumerate() {
            let hit = view.contains(u.key);
            if hit {
                r.hits += 1;
            } else {
                io.want(u.key, &req_tx)?;
            }
            let wait = Instant::now();
            while !io.have.contains_key(&u.key) {
                io.arrived(done_rx.recv_timeout(Duration::from_secs(60))?, &mut r)?;
            }
            r.stall_s += wait.elapsed().as_secs_f64();
            // The copy this use needed (none when the buffer was used before).
            if let Some(took) = io.copy_s.remove(&u.key) {
                r.transfer_s += took;
            }
            black_box(compute(&io.have[&u.key], work));
            let d = policy.after_use(step, u.key, u.bytes, hit, &view);
            view.apply(&d, u.key, u.bytes).map_err(|e| format!("{}: {e}", r.policy))?;
            for k in d.evict.iter().copied().chain((!d.keep).then_some(u.key)) {
                io.evict(k, &mut r);
            }
            for &(k, b) in &d.prefetch {
                if io.want(k, &req_tx)? {
                    r.bytes_prefetched += b;
                }
            }
            while let Ok(a) = done_rx.try_recv() {
                io.arrived(a, &mut r)?;
            }
        }
        drop(req_tx);
        Ok(())
    })?;
    r.total_s = began.elapsed().as_secs_f64();
    Ok(r)
}

/// A copy done by the I/O thread: the layer, its buffer, how long the read took.
type Arrival = (Key, std::io::Result<Vec<u8>>, Duration);

/// The cpu tier's buffers and the copies in flight.
#[derive(Default)]
struct Io {
    have: HashMap<Key, Vec<u8>>,
    /// How long the copy of each buffer in `have` took, until a use takes it.
    copy_s: HashMap<Key, f64>,
    /// Copies requested and not arrived, per layer.
    in_flight: HashMap<Key, u32>,
    /// Of those, how many to throw away on arrival (evicted meanwhile).
    discard: HashMap<Key, u32>,
}

impl Io {
    /// Makes sure a copy of `k` is coming: one in flight that was to be discarded is kept
    /// instead, else one is requested (then `true`).
    fn want(&mut self, k: Key, req: &mpsc::Sender<Key>) -> Result<bool, Error> {
        if let Some(n) = self.discard.get_mut(&k).filter(|n| **n > 0) {
            *n -= 1;
            return Ok(false);
        }
        req.send(k)?;
        *self.in_flight.entry(k).or_default() += 1;
        Ok(true)
    }

    /// Lets `k` go: its buffer (wasted if no use took it), or every copy of it in flight.
    fn evict(&mut self, k: Key, r: &mut Report) {
        match self.have.remove(&k) {
            Some(buf) => {
                if self.copy_s.remove(&k).is_some() {
                    r.bytes_wasted += buf.len() as u64;
                }
            }
            None => {
                let n = self.in_flight.get(&k).copied().unwrap_or(0);
                self.discard.insert(k, n);
            }
        }
    }

    /// A copy arrived: every read counts in bytes moved; one evicted meanwhile is wasted.
    fn arrived(&mut self, (k, buf, took): Arrival, r: &mut Report) -> Result<(), Error> {
        let buf = buf?;
        r.bytes_moved += buf.len() as u64;
        if let Some(n) = self.in_flight.get_mut(&k) {
            *n = n.saturating_sub(1);
        }
        match self.discard.get_mut(&k).filter(|n| **n > 0) {
            Some(n) => {
                *n -= 1;
                r.bytes_wasted += buf.len() as u64;
            }
            None => {
                self.copy_s.insert(k, took.as_secs_f64());
                self.have.insert(k, buf);
            }
        }
        Ok(())
    }
}
