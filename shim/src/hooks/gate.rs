//! A gate between a hook's question to the driver and the driver's answer: hooks that act on
//! an answer pass it shared (the read side) from asking to the driver's call; the calls that
//! change the answer pass it alone (the write side). A thread passes a gate once however deep
//! its hooks nest (a hook's driver call may run another hook): an inner passage shares the
//! outer one, which also keeps a thread from waiting on itself.

use std::cell::Cell;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::LocalKey;

pub(crate) struct Gate {
    lock: RwLock<()>,
    /// How many passages through this gate the current thread has open.
    open: &'static LocalKey<Cell<u32>>,
}

/// An open passage; the gate closes behind it when it is dropped.
pub(crate) struct Passage {
    open: &'static LocalKey<Cell<u32>>,
    _read: Option<RwLockReadGuard<'static, ()>>,
    _write: Option<RwLockWriteGuard<'static, ()>>,
}

impl Drop for Passage {
    fn drop(&mut self) {
        self.open.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

impl Gate {
    /// A gate whose per-thread count of passages is `open` (a `thread_local!` of its own).
    pub(crate) const fn new(open: &'static LocalKey<Cell<u32>>) -> Self {
        Self {
            lock: RwLock::new(()),
            open,
        }
    }

    /// Whether this is the thread's first passage, counting it.
    fn first(&self) -> bool {
        self.open.with(|n| {
            let before = n.get();
            n.set(before + 1);
            before == 0
        })
    }

    /// Passes shared with others: while it lives, no one passes alone.
    pub(crate) fn shared(&'static self) -> Passage {
        let first = self.first();
        Passage {
            open: self.open,
            _read: first.then(|| self.lock.read().unwrap_or_else(PoisonError::into_inner)),
            _write: None,
        }
    }

    /// Passes alone: while it lives, no one else passes.
    pub(crate) fn alone(&'static self) -> Passage {
        let first = self.first();
        Passage {
            open: self.open,
            _read: None,
            _write: first.then(|| self.lock.write().unwrap_or_else(PoisonError::into_inner)),
        }
    }
}
