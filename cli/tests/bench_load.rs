//! `ferry bench --load N`: its CPU burners start, and never outlive the benchmark.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_commands::bench_load::{Burners, MAX_LOAD};
use ferry_commands::self_exe::SelfExe;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ferry"))
}

/// The `ferry` binary as the benchmark starts its children.
fn self_exe() -> SelfExe {
    SelfExe { program: exe().to_path_buf(), prefix: Vec::new() }
}

/// Starts `ferry args..` with `env` added, its stdin and stdout piped; returns it and its
/// first line.
fn spawn_first_line(args: &[&str], env: &[(&str, String)]) -> (std::process::Child, String) {
    let mut child = Command::new(exe())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (child, line)
}

/// Dropping the burners (the benchmark's end, an error) kills and reaps every one.
#[test]
#[cfg(target_os = "linux")]
fn burners_are_killed_when_dropped() {
    let b = Burners::start(&self_exe(), 2).unwrap();
    let ids = b.ids();
    assert_eq!(ids.len(), 2);
    for id in &ids {
        assert!(Path::new(&format!("/proc/{id}")).exists(), "burner {id} runs");
    }
    drop(b);
    for id in &ids {
        assert!(!Path::new(&format!("/proc/{id}")).exists(), "burner {id} is gone (killed and reaped)");
    }
}

/// A burner whose benchmark died without killing it (its stdin closed) exits by itself.
#[test]
fn a_burner_exits_when_its_stdin_closes() {
    let (mut child, line) = spawn_first_line(&["__burn"], &[]);
    assert_eq!(line.trim(), "burning");
    drop(child.stdin.take());
    // Hang guard only: the exit itself is what is asserted.
    let guard = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > guard {
            let _ = child.kill();
            panic!("the burner did not exit after its stdin closed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn more_burners_than_the_limit_are_refused_by_name() {
    let err = Burners::start(&self_exe(), MAX_LOAD + 1).err().expect("over the limit");
    assert!(err.to_string().contains("--load"), "{err}");
    assert!(Burners::start(&self_exe(), 0).unwrap().is_empty());
}

/// `ferry bench --placement`: an echo peer told a CPU (`FERRY_BENCH_CPU`) pins every thread
/// it has to that CPU as it starts.
#[test]
#[cfg(target_os = "linux")]
fn an_echo_peer_told_a_cpu_runs_there_with_every_thread() {
    use ferry_commands::bench_place::CPU_VAR;
    let allowed = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = allowed.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    // The first CPU this process may use ("0-1", "2,5", "3").
    let cpu: usize = list.split([',', '-']).next().unwrap().parse().unwrap();
    let addr = format!("unix:ferry-place-test-{}", std::process::id());
    let (mut child, line) = spawn_first_line(&["__echo", &addr], &[(CPU_VAR, cpu.to_string())]);
    assert!(line.starts_with("ready"), "{line:?}");
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap().flatten().collect();
    assert!(!tasks.is_empty());
    for t in &tasks {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let Some(mine) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) else { continue };
        assert_eq!(mine.trim(), cpu.to_string(), "thread {:?} of the peer", t.file_name());
    }
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
}
