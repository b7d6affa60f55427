//! Traces: sequences of tensor uses, synthetic or recorded.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Key;

/// One use of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Use {
    /// The tensor.
    pub key: Key,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A named sequence of uses.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Its name in reports.
    pub name: String,
    /// The uses, in order.
    pub uses: Vec<Use>,
    /// Whether the caller knows the order ahead (a model's layers): the replay then
    /// declares it to the policy as a schedule.
    pub known_order: bool,
}

impl Trace {
    /// Distinct tensors and their total size.
    pub fn footprint(&self) -> (usize, u64) {
        let mut seen = std::collections::HashMap::new();
        for u in &self.uses {
            seen.insert(u.key, u.bytes);
        }
        (seen.len(), seen.values().sum())
    }

    /// Writes the trace as JSON lines (`{"key":..,"bytes":..}`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        for u in &self.uses {
            serde_json::to_writer(&mut w, u)?;
            w.write_all(b"\n")?;
        }
        w.flush()
    }

    /// Reads a trace written by [`Trace::save`]. A key must keep one size throughout.
    pub fn load(path: &Path, known_order: bool) -> std::io::Result<Trace> {
        let r = std::io::BufReader::new(std::fs::File::open(path)?);
        let mut uses = Vec::new();
        let mut sizes = std::collections::HashMap::new();
        for (i, line) in r.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let u: Use = serde_json::from_str(&line).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}:{}: {e}", path.display(), i + 1))
            })?;
            if let Some(&b) = sizes.get(&u.key)
                && b != u.bytes
            {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}:{}: tensor {} was {b} bytes, now {}: a key names one tensor",
                        path.display(),
                        i + 1,
                        u.key,
                        u.bytes
                    ),
                ));
            }
            sizes.insert(u.key, u.bytes);
            uses.push(u);
        }
        let name = path.file_stem().map_or_else(|| "recorded".to_owned(), |s| s.to_string_lossy().into_owned());
        Ok(Trace { name, uses, known_order })
    }
}

/// `passes` forward passes over a model of `layers` layers of `layer_bytes` each (every
/// layer's weights used once per pass, in order): the order is known ahead.
pub fn layers(layers: usize, layer_bytes: u64, passes: usize) -> Trace {
    let uses = (0..passes).flat_map(|_| (0..layers as Key).map(|key| Use { key, bytes: layer_bytes })).collect();
    Trace { name: format!("layers({layers}x{}MiB,{passes} passes)", layer_bytes >> 20), uses, known_order: true }
}

/// `len` uses of `n` tensors of `bytes` each, drawn from a Zipf distribution of exponent
/// `alpha` (tensor `i` has weight `1/(i+1)^alpha`), with a fixed seed.
pub fn zipf(n: usize, alpha: f64, len: usize, bytes: u64, seed: u64) -> Trace {
    let mut cdf = Vec::with_capacity(n);
    let mut sum = 0.0;
    for i in 0..n {
        sum += 1.0 / ((i + 1) as f64).powf(alpha);
        cdf.push(sum);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let keys = shuffled_ranks(&mut rng, n);
    let uses = (0..len)
        .map(|_| {
            let x = rng.f64() * sum;
            let rank = cdf.partition_point(|&c| c < x).min(n - 1);
            Use { key: keys[rank], bytes }
        })
        .collect();
    Trace { name: format!("zipf(n={n},a={alpha})"), uses, known_order: false }
}

/// The keys of [`zipf`]`(n, _, _, _, seed)` from the most probable down: the tensors an
/// oracle that knows the distribution (not the draws) keeps, A0 of Aho, Denning and Ullman,
/// the best policy for independent draws on average.
pub fn zipf_by_rank(n: usize, seed: u64) -> Vec<Key> {
    shuffled_ranks(&mut fastrand::Rng::with_seed(seed), n)
}

/// A fixed shuffle of ranks to keys (the first thing `zipf` draws), so that hot keys are
/// not the smallest numbers.
fn shuffled_ranks(rng: &mut fastrand::Rng, n: usize) -> Vec<Key> {
    let mut keys: Vec<Key> = (0..n as Key).collect();
    rng.shuffle(&mut keys);
    keys
}

/// A Zipf mix interrupted every `every` uses by a scan of `scan` cold tensors used once
/// each (a checkpoint save, an evaluation pass): what LRU handles worst.
pub fn zipf_with_scans(n: usize, alpha: f64, len: usize, bytes: u64, every: usize, scan: usize, seed: u64) -> Trace {
    let base = zipf(n, alpha, len, bytes, seed);
    let mut uses = Vec::with_capacity(len + len / every.max(1) * scan);
    let mut cold = n as Key;
    for (i, u) in base.uses.into_iter().enumerate() {
        if i > 0 && i % every.max(1) == 0 {
            for _ in 0..scan {
                uses.push(Use { key: cold, bytes });
                cold += 1;
            }
        }
        uses.push(u);
    }
    Trace { name: format!("zipf+scans(n={n},scan {scan} every {every})"), uses, known_order: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_by_rank_names_the_keys_the_draws_favour() {
        let t = zipf(100, 1.0, 20_000, 1, 3);
        let ranked = zipf_by_rank(100, 3);
        let mut counts = std::collections::HashMap::new();
        for u in &t.uses {
            *counts.entry(u.key).or_insert(0u32) += 1;
        }
        let count = |k: Key| counts.get(&k).copied().unwrap_or(0);
        // Rank 0 is drawn 19% of the time, rank 1 10%, rank 50 0.4%.
        assert!(count(ranked[0]) > count(ranked[1]), "{} vs {}", count(ranked[0]), count(ranked[1]));
        assert!(count(ranked[1]) > 10 * count(ranked[50]), "{} vs {}", count(ranked[1]), count(ranked[50]));
        let mut sorted = ranked.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<Key>>(), "every key once");
    }
}
