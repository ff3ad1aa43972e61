//! The manager's own log level in force: what `Controller.SetLogLevel` and a
//! reload set and `Controller.LogLevel` reads. Not persisted.
//!
//! Invariant: the level reported is the level applied; the filter is
//! changed through the [`LogHandle`] the daemon installs (none in library
//! use, where only the reported level changes).

use drover_config::{LogHandle, LogLevel};
use std::sync::{Mutex, OnceLock};

pub struct LogControl {
    level: Mutex<LogLevel>,
    handle: OnceLock<LogHandle>,
}

impl LogControl {
    pub fn new(level: LogLevel) -> Self {
        Self {
            level: Mutex::new(level),
            handle: OnceLock::new(),
        }
    }

    /// Where the level applies (the daemon sets it once; later calls are
    /// ignored).
    pub fn set_handle(&self, handle: LogHandle) {
        let _ = self.handle.set(handle);
    }

    /// Puts `level` in force and reports it from now on.
    pub fn set(&self, level: LogLevel) {
        *self.level.lock().unwrap_or_else(|p| p.into_inner()) = level;
        if let Some(h) = self.handle.get() {
            h.set_level(level);
        }
    }

    pub fn get(&self) -> LogLevel {
        *self.level.lock().unwrap_or_else(|p| p.into_inner())
    }
}
