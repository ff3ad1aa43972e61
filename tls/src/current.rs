//! The settings in force, swappable: an `Arc` behind a lock held only for the
//! moment it takes to clone or replace the `Arc`. Readers get a snapshot and
//! keep it as long as they like; a swap never waits for them and never
//! touches what they hold.

use std::sync::{Arc, PoisonError, RwLock};

#[derive(Debug)]
pub(crate) struct Current<T>(Arc<RwLock<Arc<T>>>);

// Not derived: cloning shares the cell, and `T` need not be `Clone`.
impl<T> Clone for Current<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Current<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(value))))
    }

    pub(crate) fn get(&self) -> Arc<T> {
        // Nothing panics while holding the lock (clone or assignment of an
        // `Arc`), so a poisoned lock still holds a whole value.
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts `value` in force and hands back what was.
    pub(crate) fn replace(&self, value: T) -> Arc<T> {
        let new = Arc::new(value);
        let mut slot = self.0.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *slot, new)
    }
}
