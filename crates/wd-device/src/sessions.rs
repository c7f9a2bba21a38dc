//! Sessions of one device queue: a slab indexed by handle, with a
//! generation per slot so a stale handle never reaches a newer session,
//! a bound on how many one queue holds, and a count shared by the
//! driver's queues (the `devN/sessions` leak gauge).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::status;

/// The sessions of one queue.
#[derive(Debug)]
pub struct SessionTable<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    max: usize,
    live: Arc<AtomicU64>,
}

impl<T> Drop for SessionTable<T> {
    fn drop(&mut self) {
        self.live.fetch_sub(self.len() as u64, Ordering::Relaxed);
    }
}

impl<T> SessionTable<T> {
    /// A table of at most `max` sessions counting itself in `live`.
    pub fn new(max: usize, live: Arc<AtomicU64>) -> SessionTable<T> {
        SessionTable {
            slots: Vec::new(),
            free: Vec::new(),
            max,
            live,
        }
    }

    fn handle(index: u32, generation: u32) -> u64 {
        (u64::from(generation) << 32) | u64::from(index + 1)
    }

    /// Sessions alive.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.1.is_some()).count()
    }

    /// Whether none is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep `s`; its handle, or `ENOSPC` when the table is full.
    pub fn insert(&mut self, s: T) -> Result<u64, i32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < self.max => {
                self.slots.push((0, None));
                self.slots.len() as u32 - 1
            }
            None => return Err(status::ENOSPC),
        };
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(s);
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(Self::handle(index, slot.0))
    }

    fn index(&self, handle: u64) -> Option<usize> {
        let index = ((handle & 0xffff_ffff) as usize).checked_sub(1)?;
        match self.slots.get(index) {
            Some((g, Some(_))) if *g == (handle >> 32) as u32 => Some(index),
            _ => None,
        }
    }

    /// The session of `handle`, or `ENOENT`.
    pub fn get(&mut self, handle: u64) -> Result<&mut T, i32> {
        let i = self.index(handle).ok_or(status::ENOENT)?;
        Ok(self.slots[i].1.as_mut().expect("checked by index"))
    }

    /// The session of `handle`, if alive.
    pub fn peek(&self, handle: u64) -> Option<&T> {
        self.index(handle).and_then(|i| self.slots[i].1.as_ref())
    }

    /// End the session of `handle` (`ENOENT` when none).
    pub fn remove(&mut self, handle: u64) -> Result<T, i32> {
        let i = self.index(handle).ok_or(status::ENOENT)?;
        let s = self.slots[i].1.take().expect("checked by index");
        // A slot whose generation would wrap is retired: a handle kept
        // from its first session would reach its next one.
        if self.slots[i].0 != u32::MAX {
            self.free.push(i as u32);
        }
        self.live.fetch_sub(1, Ordering::Relaxed);
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_handles_miss_and_counts_hold() {
        let live = Arc::new(AtomicU64::new(0));
        let mut t = SessionTable::new(2, live.clone());
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!(t.insert("c"), Err(status::ENOSPC));
        assert_eq!(t.remove(a), Ok("a"));
        assert_eq!(t.get(a), Err(status::ENOENT));
        let c = t.insert("c").unwrap();
        assert_ne!(a, c, "a reused slot has a new generation");
        assert_eq!(t.peek(a), None);
        assert_eq!(t.peek(c), Some(&"c"));
        assert_eq!(t.get(0), Err(status::ENOENT));
        assert_eq!(t.get(u64::MAX), Err(status::ENOENT));
        assert_eq!(live.load(Ordering::Relaxed), 2);
        assert_eq!(*t.get(b).unwrap(), "b");
        drop(t);
        assert_eq!(live.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_slot_is_retired_before_its_generation_wraps() {
        let mut t = SessionTable::new(2, Arc::new(AtomicU64::new(0)));
        let a = t.insert("a").unwrap();
        t.slots[0].0 = u32::MAX - 1;
        t.remove(a).unwrap_err();
        let a = SessionTable::<&str>::handle(0, u32::MAX - 1);
        t.remove(a).unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!(b >> 32, u64::from(u32::MAX));
        t.remove(b).unwrap();
        let c = t.insert("c").unwrap();
        assert_ne!(
            c & 0xffff_ffff,
            b & 0xffff_ffff,
            "the wrapped slot is not reused"
        );
        assert_eq!(t.insert("d"), Err(status::ENOSPC));
    }
}
