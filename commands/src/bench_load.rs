//! `ferry bench --load N`: the benchmark on a busy machine. N CPU burners (this binary
//! re-executed as `ferry __burn`, at the default priority: nice 0) spin beside the
//! measurement, as a build or another service would.
//!
//! A burner never outlives the benchmark: it is killed when [`Burners`] is dropped (the
//! benchmark's end, an error, a panic that unwinds), Ctrl-C reaches it with the rest of
//! the terminal's process group, and it exits by itself when its stdin (a pipe from the
//! benchmark) closes, which the kernel does when the benchmark dies in any other way.

use std::io::Read;

use anyhow::Context;

use crate::bench::{ChildProcess, start_child};
use crate::self_exe::SelfExe;

/// The most burners `--load` starts.
pub const MAX_LOAD: usize = 256;

/// Running burners; killed (and reaped) on drop.
pub struct Burners(Vec<ChildProcess>);

impl Burners {
    /// Starts `n` burners (`exe __burn`); each has said it is spinning when this returns.
    /// More than [`MAX_LOAD`] is an error naming `--load`.
    pub fn start(exe: &SelfExe, n: usize) -> anyhow::Result<Burners> {
        if n > MAX_LOAD {
            anyhow::bail!("--load {n}: at most {MAX_LOAD} CPU burners");
        }
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            let (p, _) =
                start_child(exe, &["__burn"], "burning").with_context(|| format!("starting CPU burner {i}"))?;
            v.push(p);
        }
        Ok(Burners(v))
    }

    /// How many run.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Their process ids.
    pub fn ids(&self) -> Vec<u32> {
        self.0.iter().map(ChildProcess::id).collect()
    }
}

/// The burner (`ferry __burn`): says `burning`, then spins on one CPU until its stdin
/// closes (or it is killed).
pub fn burn() -> anyhow::Result<()> {
    use std::io::Write;
    std::thread::spawn(|| {
        let mut b = [0u8; 64];
        while matches!(std::io::stdin().read(&mut b), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    println!("burning");
    std::io::stdout().flush()?;
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}
