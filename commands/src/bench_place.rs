//! `ferry bench --placement one-cpu|two-cpus`: every row with its two processes pinned, so
//! that two rows compare like with like.
//!
//! A round trip through the kernel costs several times more between two CPUs (a wake-up
//! across CPUs) than on one, and the scheduler picks either from one pair of processes to
//! the next: on a 2-vCPU VM beside two burners, the same ring row took 7.5 µs in one run and
//! 26 µs in the next, as its two processes happened to share a CPU or not. Pinned, the
//! benchmark's process (every thread it has, and those it starts) runs on the first CPU it
//! may use, and each echo peer on that CPU (`one-cpu`) or the second (`two-cpus`); the
//! peer learns which from [`CPU_VAR`] and pins itself as it starts.

use std::path::Path;

/// Where the benchmark's two processes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// Both on the first CPU this process may use.
    OneCpu,
    /// The benchmark on the first, each peer on the second.
    TwoCpus,
}

/// The environment variable that tells an echo peer the CPU to pin itself to.
pub const CPU_VAR: &str = "FERRY_BENCH_CPU";

/// Pins this process for `placement` and returns the CPU its peers are to run on.
pub fn pin_benchmark(placement: Placement) -> anyhow::Result<usize> {
    let cpus = allowed_cpus()?;
    let (mine, theirs) = match (placement, cpus.as_slice()) {
        (Placement::OneCpu, [a, ..]) => (*a, *a),
        (Placement::TwoCpus, [a, b, ..]) => (*a, *b),
        _ => anyhow::bail!("--placement {placement:?}: this process may use CPUs {cpus:?} only"),
    };
    pin_process(mine)?;
    Ok(theirs)
}

/// An echo peer: pins itself where [`CPU_VAR`] says, if it says.
pub fn pin_peer_from_env() -> anyhow::Result<()> {
    let Ok(cpu) = std::env::var(CPU_VAR) else { return Ok(()) };
    let cpu: usize = cpu.parse().map_err(|e| anyhow::anyhow!("{CPU_VAR}={cpu}: {e}"))?;
    pin_process(cpu)
}

#[cfg(target_os = "linux")]
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Pins every thread of this process to `cpu` (threads started later inherit it from the
/// thread that starts them).
#[cfg(target_os = "linux")]
fn pin_process(cpu: usize) -> anyhow::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    for entry in std::fs::read_dir(Path::new("/proc/self/task"))? {
        let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Some(pid) = rustix::thread::Pid::from_raw(tid) else { continue };
        // A thread that ended meanwhile is no error.
        match rustix::thread::sched_setaffinity(Some(pid), &set) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => anyhow::bail!("pinning thread {tid} to CPU {cpu}: {e}"),
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    anyhow::bail!("--placement pins processes to CPUs, which ferry bench does on Linux only")
}

#[cfg(not(target_os = "linux"))]
fn pin_process(_cpu: usize) -> anyhow::Result<()> {
    let _ = Path::new("");
    anyhow::bail!("--placement pins processes to CPUs, which ferry bench does on Linux only")
}
