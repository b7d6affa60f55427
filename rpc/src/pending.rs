//! The client's table of calls awaiting a response, sans-IO.
//!
//! Order of use: [`Pending::insert`] before the request is written; [`Pending::resolve`]
//! for each response read (the id picks the waiter); [`Pending::remove`] when a caller
//! gives up (timeout, dropped future); [`Pending::close`] once when the connection ends,
//! which hands back every waiter so each can be failed, and makes later inserts fail.

use std::collections::HashMap;

use serde_json::Value;

/// Waiters by request id. `W` is whatever wakes a caller (a oneshot sender).
#[derive(Debug)]
pub struct Pending<W> {
    map: HashMap<u64, W>,
    closed: bool,
}

impl<W> Default for Pending<W> {
    fn default() -> Self {
        Pending { map: HashMap::new(), closed: false }
    }
}

impl<W> Pending<W> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a waiter. Gives it back if the connection is closed already.
    pub fn insert(&mut self, id: u64, waiter: W) -> Result<(), W> {
        if self.closed {
            return Err(waiter);
        }
        self.map.insert(id, waiter);
        Ok(())
    }

    /// The waiter for a response's id, if it is one of ours and still waiting.
    pub fn resolve(&mut self, id: &Value) -> Option<W> {
        self.map.remove(&id.as_u64()?)
    }

    /// Forgets a waiter (the caller gave up).
    pub fn remove(&mut self, id: u64) -> Option<W> {
        self.map.remove(&id)
    }

    /// Marks the connection closed and returns every waiter.
    pub fn close(&mut self) -> Vec<W> {
        self.closed = true;
        self.map.drain().map(|(_, w)| w).collect()
    }

    /// True once [`Pending::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Calls waiting.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn routes_by_id_and_fails_all_on_close() {
        let mut p = Pending::new();
        p.insert(1, "a").unwrap();
        p.insert(2, "b").unwrap();
        p.insert(3, "c").unwrap();
        assert_eq!(p.resolve(&json!(2)), Some("b"));
        assert_eq!(p.resolve(&json!(2)), None, "answered once");
        assert_eq!(p.resolve(&json!("1")), None, "a string id is not ours");
        assert_eq!(p.resolve(&json!(null)), None);
        assert_eq!(p.remove(3), Some("c"));
        let mut rest = p.close();
        rest.sort();
        assert_eq!(rest, ["a"]);
        assert_eq!(p.insert(4, "d"), Err("d"));
        assert!(p.is_closed() && p.is_empty());
    }
}
