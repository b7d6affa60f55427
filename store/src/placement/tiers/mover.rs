//! The tiers' moves: files read into shared memory and written out, on the mover thread.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;

use bytes::Bytes;

use super::state::{Job, Mem, Shared, State};
use super::{Key, TierError};
use crate::bucket::{Bucket, BucketMut};
use crate::placement::kept::Moves;

impl Moves for Shared {
    type Job = Job;

    fn run(&self, job: Job) {
        match job {
            Job::Up(k) => self.read_in(k),
            Job::Down(k) => self.write_out(k),
        }
    }

    fn deferred(&self) -> bool {
        !self.lock().deferred.is_empty()
    }

    fn release(&self) {
        if self.lock().release_deferred() {
            self.moved.notify_all();
        }
    }
}

/// `data` as memory of the tiers: where it lies when that is a shared segment, else copied
/// once into a new one.
pub(super) fn to_mem(data: &Bytes) -> std::io::Result<Mem> {
    if !data.is_empty()
        && let Some((bucket, off)) = Bucket::containing(data)
    {
        return Ok(Mem { bucket, off, len: data.len() });
    }
    let mut b = BucketMut::create(data.len())?;
    b.as_mut_slice()[..data.len()].copy_from_slice(data);
    Ok(Mem { bucket: Bucket::from(b.freeze()), off: 0, len: data.len() })
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn path(&self, key: Key) -> PathBuf {
        self.dir.join(format!("{key}.tensor"))
    }

    /// Reads `key`'s file (`len` bytes) into new shared memory.
    pub(super) fn read_file(&self, key: Key, len: u64) -> Result<Mem, TierError> {
        let path = self.path(key);
        let io = |source| TierError::Io { path: path.clone(), source };
        let len = usize::try_from(len).map_err(|_| io(std::io::Error::other("too large for this machine")))?;
        let mut b = BucketMut::create(len).map_err(io)?;
        let mut f = std::fs::File::open(&path).map_err(io)?;
        f.read_exact(&mut b.as_mut_slice()[..len]).map_err(io)?;
        Ok(Mem { bucket: Bucket::from(b.freeze()), off: 0, len })
    }

    /// The mover: reads `key` in if the cpu tier still wants it; either way the read ends
    /// (a use waiting for it wakes).
    pub(super) fn read_in(&self, key: Key) {
        let wanted = {
            let st = self.lock();
            st.entries.get(&key).filter(|e| e.cpu.is_none() && st.wants_cpu(key)).map(|e| e.bytes)
        };
        let read = wanted.map(|len| (len, self.read_file(key, len)));
        let mut st = self.lock();
        match read {
            Some((len, Ok(m))) => {
                st.stats.bytes_read += len;
                if st.wants_cpu(key)
                    && let Some(e) = st.entries.get_mut(&key)
                {
                    e.cpu.get_or_insert(m);
                }
            }
            // The use reads it itself, and reports the error.
            Some((_, Err(e))) => {
                tracing::warn!("prefetch of tensor {key}: {e}");
                st.stats.last_error = Some(e.to_string());
            }
            None => {}
        }
        st.reading.remove(&key);
        drop(st);
        self.moved.notify_all();
    }

    /// The mover: moves `key` down (its file written the first time, its cpu copy then
    /// dropped), unless the cpu tier wants it again meanwhile. A tensor in use is never
    /// moved under its user: its file is written (a copy out, nothing changes for the
    /// user) but its cpu copy stays until the last user lets go ([`State::drop_cpu_copy`]).
    pub(super) fn write_out(&self, key: Key) {
        let mut st = self.lock();
        let todo = match st.entries.get(&key) {
            Some(e) if !st.wants_cpu(key) && !e.on_disk => e.cpu.clone().map(|m| (m, e.bytes)),
            _ => None,
        };
        if let Some((m, len)) = todo {
            drop(st);
            let written = write_file(&self.path(key), &m.bytes());
            drop(m);
            st = self.lock();
            match written {
                Ok(()) => match st.entries.get_mut(&key) {
                    Some(e) => {
                        e.on_disk = true;
                        st.stats.bytes_written += len;
                    }
                    // Removed meanwhile.
                    None => {
                        let _ = std::fs::remove_file(self.path(key));
                    }
                },
                Err(e) => {
                    tracing::error!("moving tensor {key} to disk: {e}; it stays in memory");
                    st.stats.last_error = Some(e.to_string());
                }
            }
        }
        st.drop_cpu_copy(key);
        st.writing.remove(&key);
        drop(st);
        self.moved.notify_all();
    }
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), TierError> {
    let io = |source| TierError::Io { path: path.to_owned(), source };
    let mut f = crate::placement::disk::private_file().open(path).map_err(io)?;
    f.write_all(data).map_err(io)
}
