//! The disk tier's directory on the file system: private to the store's user, held by its
//! live owner, and cleaned of what dead owners left.
//!
//! - A directory the tiers make is mode 0700, every file in it 0600 (SECURITY.md, "What
//!   belongs to whom"): other local users can neither list nor read the tensors.
//! - The owner holds an exclusive `flock` on the directory itself while it lives
//!   (`DirLock`). The kernel lets go of it when the process dies, however it dies (SIGKILL
//!   included), and no later process can inherit it by reusing the pid: whoever can take
//!   the lock knows the owner is dead. (No pid is trusted, and no file is added to the
//!   directory.)
//! - When a store makes its own directory (`ferry-store-tiers-PID-RAND` in the temp
//!   directory), it first removes those of dead owners ([`remove_leftovers`]): every such
//!   directory of this user whose lock it can take. Its own is made under a hidden name,
//!   locked, then renamed, so that no other store ever sees it unlocked.
//! - A directory the caller gives (`PlacementOptions::disk_dir`) is locked the same way: a
//!   second live store on it is refused, and the tensor files (`N.tensor`) a dead owner left
//!   there are removed when the next store takes it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

/// The prefix of the directories stores make in the temp directory.
pub const OWN_DIR_PREFIX: &str = "ferry-store-tiers-";

/// The exclusive lock of a disk tier directory, held while this lives.
#[derive(Debug)]
pub(crate) struct DirLock {
    _dir: File,
}

/// Makes `dir` (and its missing parents) mode 0700 where it does not exist; an existing
/// directory keeps its mode.
pub(crate) fn make_private_dir(dir: &Path) -> io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Options to create (or truncate) a file of the disk tier: mode 0600.
pub(crate) fn private_file() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o
}

/// Takes `dir`'s lock: `Ok(None)` while a live process holds it.
pub(crate) fn try_lock(dir: &Path) -> io::Result<Option<DirLock>> {
    let f = File::open(dir)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(DirLock { _dir: f })),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Locks `dir` for a store's disk tier, removing the tensor files (`N.tensor`) a dead owner
/// left there. An error when a live store holds it.
pub(crate) fn lock_for_tiers(dir: &Path) -> io::Result<DirLock> {
    let lock = try_lock(dir)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::ResourceBusy,
            "a live store holds this disk tier directory (its lock is taken): give each store its own",
        )
    })?;
    remove_tensor_files(dir);
    Ok(lock)
}

/// Removes the tensor files in `dir`.
pub(crate) fn remove_tensor_files(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        if is_tensor_file(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A file the tiers write: `KEY.tensor`.
fn is_tensor_file(name: &str) -> bool {
    name.strip_suffix(".tensor").is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// Makes a new private directory for a store's disk tier in `parent` (the temp directory),
/// locked: `ferry-store-tiers-PID-RAND`, mode 0700, made under a hidden name (`.` before
/// it) and renamed once locked.
pub(crate) fn make_own_dir(parent: &Path) -> io::Result<(PathBuf, DirLock)> {
    let mut last = None;
    for _ in 0..8 {
        let name = format!("{OWN_DIR_PREFIX}{}-{:016x}", std::process::id(), fastrand::u64(..));
        let (hidden, path) = (parent.join(format!(".{name}")), parent.join(&name));
        #[cfg_attr(not(unix), allow(unused_mut))]
        let mut b = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        match b.create(&hidden) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        }
        let locked = try_lock(&hidden).and_then(|l| l.ok_or_else(|| io::Error::other("locked by another")));
        let renamed = locked.and_then(|l| std::fs::rename(&hidden, &path).map(|()| l));
        match renamed {
            Ok(lock) => return Ok((path, lock)),
            Err(e) => {
                let _ = std::fs::remove_dir(&hidden);
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free name")))
}

/// Removes the disk tier directories (`ferry-store-tiers-*`) of dead stores in `parent`
/// (see the module docs); the count removed. Directories of other users, of live stores,
/// and anything that is not such a directory are left alone; errors are skipped.
pub fn remove_leftovers(parent: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else { return 0 };
    let mut n = 0;
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(OWN_DIR_PREFIX) {
            continue;
        }
        let path = e.path();
        // Not a symbolic link, and ours.
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if !meta.is_dir() || !owned_by_me(&meta) {
            continue;
        }
        // Taken: its owner is dead; held while the directory goes.
        let Ok(Some(_lock)) = try_lock(&path) else { continue };
        if std::fs::remove_dir_all(&path).is_ok() {
            tracing::info!("removed the disk tier {} of a store that is not running", path.display());
            n += 1;
        }
    }
    n
}

#[cfg(target_os = "linux")]
fn owned_by_me(meta: &std::fs::Metadata) -> bool {
    std::os::unix::fs::MetadataExt::uid(meta) == rustix::process::geteuid().as_raw()
}

#[cfg(not(target_os = "linux"))]
fn owned_by_me(_: &std::fs::Metadata) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_file_names() {
        assert!(is_tensor_file("0.tensor") && is_tensor_file("1234.tensor"));
        assert!(!is_tensor_file(".tensor") && !is_tensor_file("a.tensor") && !is_tensor_file("1.tensor.tmp"));
    }

    #[test]
    fn a_held_lock_is_refused_and_free_again_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let held = try_lock(dir.path()).unwrap().expect("a free directory");
        // Another open file description of the same directory (as another process has).
        assert!(try_lock(dir.path()).unwrap().is_none(), "a held lock is taken twice");
        let e = lock_for_tiers(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        drop(held);
        assert!(try_lock(dir.path()).unwrap().is_some());
    }

    #[test]
    fn an_own_directory_is_locked_and_never_seen_unlocked() {
        let parent = tempfile::tempdir().unwrap();
        let (dir, lock) = make_own_dir(parent.path()).unwrap();
        assert!(dir.file_name().unwrap().to_string_lossy().starts_with(OWN_DIR_PREFIX));
        let names: Vec<_> = std::fs::read_dir(parent.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 1, "the hidden name is left: {names:?}");
        assert!(try_lock(&dir).unwrap().is_none(), "made unlocked");
        assert_eq!(remove_leftovers(parent.path()), 0);
        assert!(dir.exists(), "a live store's directory was removed");
        drop(lock);
        assert_eq!(remove_leftovers(parent.path()), 1);
        assert!(!dir.exists());
    }
}
