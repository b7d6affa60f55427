//! The device tier's moves, on its mover thread: uploads from the tiers below, and copies
//! down to them.

use bytes::Bytes;

use super::{DevicePin, Job, Shared};
use crate::placement::Key;
use crate::placement::kept::Moves;

impl Moves for Shared {
    type Job = Job;

    fn run(&self, job: Job) {
        match job {
            Job::Up(k) => self.move_up(k),
            Job::Down(k) => self.move_down(k),
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

impl Shared {
    /// Uploads `key` from the tiers below if the device wants it or a use waits for it;
    /// either way the upload ends (waiting uses wake; a failure is theirs to report).
    fn move_up(&self, key: Key) {
        let todo = {
            let st = self.lock();
            let wanted = st.wants(key);
            st.entries.get(&key).filter(|e| e.copy.is_none() && (wanted || e.waiting > 0)).and_then(|e| e.below)
        };
        let up = todo.map(|below| {
            let held = self.below.get(below).map_err(|e| e.to_string())?;
            self.mem.upload(&held.bytes)
        });
        let mut st = self.lock();
        match up {
            Some(Ok(buf)) => {
                st.stats.bytes_up += buf.len() as u64;
                if let Some(e) = st.entries.get_mut(&key) {
                    e.copy.get_or_insert(buf);
                }
            }
            Some(Err(why)) => {
                let why = format!("upload of tensor {key} to {}: {why}", self.mem.device());
                tracing::warn!("{why}");
                st.stats.last_error = Some(why.clone());
                if let Some(e) = st.entries.get_mut(&key).filter(|e| e.waiting > 0) {
                    e.failed = Some(why);
                }
            }
            None => {}
        }
        st.uploading.remove(&key);
        drop(st);
        self.moved.notify_all();
    }

    /// Moves `key` off the device: its host copy is made the first time (copied down and
    /// put in the tiers below, placed there as pinned), then its device copy is dropped,
    /// or deferred while in use. Nothing happens if the device wants it again meanwhile.
    fn move_down(&self, key: Key) {
        let mut st = self.lock();
        let wanted = st.wants(key);
        let todo = match st.entries.get(&key) {
            Some(e) if !wanted && e.below.is_none() => e.copy.clone().map(|c| (c, e.pin)),
            _ => None,
        };
        if let Some((copy, pin)) = todo {
            drop(st);
            let put = self.mem.download(&copy).and_then(|host| {
                let n = host.len() as u64;
                let k = self.below.put(Bytes::from(host)).map_err(|e| e.to_string())?;
                if let DevicePin::Below(p) = pin
                    && let Err(e) = self.below.place(k, p)
                {
                    tracing::warn!("placing tensor {key}'s host copy as {p:?}: {e}");
                }
                Ok((k, n))
            });
            drop(copy);
            st = self.lock();
            match put {
                Ok((k, n)) => match st.entries.get_mut(&key) {
                    Some(e) => {
                        e.below = Some(k);
                        st.stats.bytes_down += n;
                    }
                    // Removed meanwhile.
                    None => self.below.remove(k),
                },
                Err(why) => {
                    let why = format!("copy of tensor {key} off {}: {why}; it stays on the device", self.mem.device());
                    tracing::error!("{why}");
                    st.stats.last_error = Some(why);
                }
            }
        }
        st.drop_copy(key);
        st.downloading.remove(&key);
        drop(st);
        self.moved.notify_all();
    }
}
