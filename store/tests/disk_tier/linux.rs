//! The tests (Linux: modes, flock, setpriv and real child processes).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::Tensor;
use ferry_rpc::RefBacking;
use ferry_store::placement::disk::remove_leftovers;
use ferry_store::{PlacedRefs, PlacementOptions, Store, StoreOptions};
use libtest_mimic::{Arguments, Failed, Trial};

const ROLE: &str = "FERRY_DISK_TIER_ROLE";
/// Long enough for any move to disk here to end (waited for, not slept).
const SETTLE: Duration = Duration::from_secs(60);
const KB: usize = 1 << 10;

fn check(ok: bool, what: impl Into<String>) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(what.into().into()) }
}

/// A store whose references go to a disk tier in `disk_dir` (default: its own directory
/// in the temp directory), with `n` tensors of 64 KiB kept and moved to disk.
fn store_with_tensors_on_disk(disk_dir: Option<PathBuf>, n: usize) -> Result<(Arc<Store>, Arc<PlacedRefs>), Failed> {
    let store = Store::new(StoreOptions::default());
    let opts = PlacementOptions {
        policy: "lru".into(),
        cpu_budget_bytes: (64 * KB) as u64,
        disk_budget_bytes: Some((16 << 20) as u64),
        disk_dir,
        ..PlacementOptions::default()
    };
    let placed = store.enable_placement(&opts).map_err(|e| e.to_string())?;
    for i in 0..n {
        let t = Tensor::from_slice(vec![64 * KB as u64], &vec![i as u8 + 1; 64 * KB]).map_err(|e| e.to_string())?;
        let id = format!("r{i}");
        placed.keep(&id, t).map_err(|e| e.message.clone())?;
        placed.place(&id, "disk").map_err(|e| e.message.clone())?;
    }
    check(placed.tiers().settle(SETTLE), "the moves to disk did not end")?;
    check(placed.stats().bytes_written >= (n * 64 * KB) as u64, format!("written: {:?}", placed.stats()))?;
    Ok((store, placed))
}

fn tensor_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "tensor")).collect()
}

fn mode(p: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).map(|m| m.permissions()).unwrap()) & 0o777
}

fn disk_tier_is_private_to_its_user() -> Result<(), Failed> {
    let (_store, placed) = store_with_tensors_on_disk(None, 2)?;
    let dir = placed.disk_dir().to_owned();
    check(mode(&dir) == 0o700, format!("{}: mode {:o}", dir.display(), mode(&dir)))?;
    let files = tensor_files(&dir);
    check(files.len() == 2, format!("tensor files: {files:?}"))?;
    for f in &files {
        check(mode(f) == 0o600, format!("{}: mode {:o}", f.display(), mode(f)))?;
    }
    drop(placed);
    drop(_store);
    check(!dir.exists(), format!("{} outlived its store", dir.display()))?;
    // A directory the caller names is made private too, missing parents included.
    let parent = tempfile::tempdir()?;
    let given = parent.path().join("a/b");
    let (_s, p) = store_with_tensors_on_disk(Some(given.clone()), 1)?;
    check(mode(&given) == 0o700 && mode(&parent.path().join("a")) == 0o700, "a made directory is not 0700")?;
    for f in tensor_files(&given) {
        check(mode(&f) == 0o600, format!("{}: mode {:o}", f.display(), mode(&f)))?;
    }
    drop(p);
    Ok(())
}

/// Runs `cat path` as uid/gid 65534 with no groups; true when it read the file.
fn nobody_reads(path: &Path) -> Result<bool, Failed> {
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "cat"])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    Ok(out.success())
}

fn another_user_cannot_read_the_disk_tier() -> Result<(), Failed> {
    // The control: uid 65534 reads a 0644 file in a 0755 directory beside the tier's.
    let open = tempfile::Builder::new().prefix("ferry-disk-tier-control").tempdir()?;
    std::fs::set_permissions(open.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let control = open.path().join("control");
    std::fs::write(&control, b"readable")?;
    std::fs::set_permissions(&control, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    check(nobody_reads(&control)?, "the control: uid 65534 cannot read a 0644 file (setpriv?)")?;
    let (_store, placed) = store_with_tensors_on_disk(None, 1)?;
    let files = tensor_files(placed.disk_dir());
    check(files.len() == 1, format!("tensor files: {files:?}"))?;
    check(!nobody_reads(&files[0])?, format!("uid 65534 read {}", files[0].display()))?;
    Ok(())
}

/// A child process of this test: a store with its disk tier in its own directory in
/// `TMPDIR`. `hold`: tensors on disk, says `ready DIR`, then waits until killed (or stdin
/// closes). `start`: says `started DIR` and exits (its store removed with it).
fn child(role: &str) -> Result<(), String> {
    let n = if role == "hold" { 2 } else { 0 };
    let (_store, placed) = store_with_tensors_on_disk(None, n).map_err(|e| format!("{e:?}"))?;
    let word = if role == "hold" { "ready" } else { "started" };
    println!("{word} {}", placed.disk_dir().display());
    if role == "hold" {
        let _ = std::io::stdin().read_line(&mut String::new());
    }
    Ok(())
}

struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a child `role` with `TMPDIR=tmp`; its first line's path.
fn spawn(role: &str, tmp: &Path) -> Result<(Kid, PathBuf), Failed> {
    let mut c = Command::new(std::env::current_exe()?)
        .env(ROLE, role)
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let out = c.stdout.take().ok_or("no stdout")?;
    let kid = Kid(c);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = BufReader::new(out).read_line(&mut l);
        let _ = tx.send(l);
    });
    let line = rx.recv_timeout(SETTLE).map_err(|_| format!("child {role} said nothing"))?;
    let path = line.trim().split_once(' ').map(|(_, p)| PathBuf::from(p)).ok_or(format!("child {role}: {line:?}"))?;
    Ok((kid, path))
}

fn a_killed_stores_disk_tier_is_removed_by_the_next_store_and_a_live_ones_kept() -> Result<(), Failed> {
    let tmp = tempfile::tempdir()?;
    let (mut killed, dead_dir) = spawn("hold", tmp.path())?;
    let (mut live, live_dir) = spawn("hold", tmp.path())?;
    check(dead_dir.starts_with(tmp.path()) && live_dir.starts_with(tmp.path()), "children ignored TMPDIR")?;
    killed.0.kill()?; // SIGKILL
    killed.0.wait()?;
    check(tensor_files(&dead_dir).len() == 2, "SIGKILL left no tensors behind (nothing to test)")?;
    // A pid can be reused: a directory named with a live pid (ours) whose lock is free
    // belongs to a dead store all the same.
    let reused = tmp.path().join(format!("ferry-store-tiers-{}-00000000000000aa", std::process::id()));
    std::fs::create_dir(&reused)?;
    std::fs::write(reused.join("0.tensor"), b"left over")?;
    // Not a store's directory: never touched.
    let other = tmp.path().join("ferry-store-tiersome");
    std::fs::create_dir(&other)?;

    // The next store to start, a real process.
    let (mut next, next_dir) = spawn("start", tmp.path())?;
    let status = next.0.wait()?;
    check(status.success(), format!("the next store: {status}"))?;
    check(!next_dir.exists(), "the next store's own directory outlived it")?;
    check(!dead_dir.exists(), format!("the killed store's {} is still there", dead_dir.display()))?;
    check(!reused.exists(), "a directory with a free lock was kept because its pid is alive")?;
    check(other.exists(), "a directory that is not a store's was removed")?;
    check(tensor_files(&live_dir).len() == 2, format!("the live store's {} lost its tensors", live_dir.display()))?;
    // Once the live one is killed too, it is a leftover like any other.
    live.0.kill()?;
    live.0.wait()?;
    check(remove_leftovers(tmp.path()) == 1, "the second killed store's directory was not the one removed")?;
    check(!live_dir.exists(), "the second killed store's directory is still there")?;
    Ok(())
}

fn a_given_directory_is_held_by_one_store_and_cleaned_of_a_dead_owners_files() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    // What a killed store left: tensor files (removed), a file of the user's (kept).
    std::fs::write(dir.path().join("7.tensor"), b"left over")?;
    std::fs::write(dir.path().join("notes.txt"), b"mine")?;
    let (_s, held) = store_with_tensors_on_disk(Some(dir.path().to_owned()), 1)?;
    check(!dir.path().join("7.tensor").exists(), "a dead owner's tensor file was kept")?;
    check(dir.path().join("notes.txt").exists(), "a file that is not a tensor was removed")?;
    let second = Store::new(StoreOptions::default());
    let opts = PlacementOptions { disk_dir: Some(dir.path().to_owned()), ..PlacementOptions::default() };
    let e = second.enable_placement(&opts).err().ok_or("a second live store took the same disk_dir")?.to_string();
    check(e.contains("disk_dir") && e.contains("live store"), format!("the error: {e}"))?;
    drop(held);
    drop(_s);
    check(std::fs::read_dir(dir.path())?.count() == 1, "the store left files beside the user's")?;
    check(tensor_files(dir.path()).is_empty(), "the store's tensor files outlived it")?;
    check(second.enable_placement(&opts).is_ok(), "the directory is not free once its store is gone")?;
    Ok(())
}

pub fn main() -> ExitCode {
    if let Ok(role) = std::env::var(ROLE) {
        return match child(&role) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("disk tier child {role}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let root = rustix::process::geteuid().is_root();
    if !root {
        eprintln!("another_user_cannot_read_the_disk_tier: ignored, it needs root to run as uid 65534 (setpriv)");
    }
    let trials = vec![
        Trial::test("disk_tier_is_private_to_its_user", disk_tier_is_private_to_its_user),
        Trial::test("another_user_cannot_read_the_disk_tier", another_user_cannot_read_the_disk_tier)
            .with_ignored_flag(!root),
        Trial::test(
            "a_killed_stores_disk_tier_is_removed_by_the_next_store_and_a_live_ones_kept",
            a_killed_stores_disk_tier_is_removed_by_the_next_store_and_a_live_ones_kept,
        ),
        Trial::test(
            "a_given_directory_is_held_by_one_store_and_cleaned_of_a_dead_owners_files",
            a_given_directory_is_held_by_one_store_and_cleaned_of_a_dead_owners_files,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
