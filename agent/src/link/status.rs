//! The link's status as the local API shows it: online or offline, when the
//! manager was last heard from and when the last session ended, the
//! controller's address and the log settings.
//!
//! The link writes it ([`AgentStatus::connected`], [`AgentStatus::disconnected`],
//! [`AgentStatus::seen`]); `crate::api` reads it for `org.eclipse.bluechi.Agent`
//! properties and is woken by [`AgentStatus::watch`] when `Status` or
//! `ControllerAddress` changed. Lock-free reads except the texts, which sit
//! under a short mutex.

use drover_bus::timestamp::{monotonic_us, realtime_us};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::watch;

/// µs since the epoch (realtime) and since boot (monotonic), as BlueChi's
/// `*Timestamp` / `*TimestampMonotonic` properties.
fn now_us() -> (u64, u64) {
    (realtime_us(), monotonic_us())
}

#[derive(Default)]
struct Stamp {
    realtime: AtomicU64,
    monotonic: AtomicU64,
}

impl Stamp {
    fn set(&self, (realtime, monotonic): (u64, u64)) {
        self.realtime.store(realtime, Ordering::Relaxed);
        self.monotonic.store(monotonic, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        (
            self.realtime.load(Ordering::Relaxed),
            self.monotonic.load(Ordering::Relaxed),
        )
    }
}

/// The texts the local API shows.
#[derive(Default, Clone)]
pub struct Texts {
    pub log_level: String,
    pub log_target: String,
    /// `tcp:host=H,port=P`, empty until set.
    pub controller_address: String,
}

/// The link as the local API shows it. The link calls [`connected`],
/// [`disconnected`] and [`seen`]; the API reads it and is woken by
/// [`AgentStatus::watch`] when `Status` or `ControllerAddress` changed.
///
/// [`connected`]: AgentStatus::connected
/// [`disconnected`]: AgentStatus::disconnected
/// [`seen`]: AgentStatus::seen
pub struct AgentStatus {
    online: AtomicBool,
    disconnect: Stamp,
    seen: Stamp,
    texts: Mutex<Texts>,
    changed: watch::Sender<u64>,
}

impl Default for AgentStatus {
    fn default() -> Self {
        Self {
            online: AtomicBool::new(false),
            disconnect: Stamp::default(),
            seen: Stamp::default(),
            texts: Mutex::new(Texts {
                log_level: "INFO".into(),
                log_target: "journald".into(),
                controller_address: String::new(),
            }),
            changed: watch::channel(0).0,
        }
    }
}

impl AgentStatus {
    fn texts(&self) -> MutexGuard<'_, Texts> {
        self.texts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Registered with the manager.
    pub fn connected(&self) {
        self.seen.set(now_us());
        self.disconnect.set((0, 0));
        if !self.online.swap(true, Ordering::SeqCst) {
            self.bump();
        }
    }

    /// The session ended (or never started).
    pub fn disconnected(&self) {
        if self.online.swap(false, Ordering::SeqCst) {
            self.disconnect.set(now_us());
            self.bump();
        }
    }

    /// A frame arrived from the manager.
    pub fn seen(&self) {
        self.seen.set(now_us());
    }

    /// `online` or `offline`.
    pub fn status(&self) -> &'static str {
        if self.online.load(Ordering::SeqCst) {
            "online"
        } else {
            "offline"
        }
    }

    pub fn set_log_level(&self, level: &str) {
        self.texts().log_level = level.to_owned();
    }

    pub fn set_log_target(&self, target: &str) {
        self.texts().log_target = target.to_owned();
    }

    /// `tcp:host=H,port=P`, BlueChi's address syntax.
    pub fn set_controller(&self, host: &str, port: u16) {
        let address = format!("tcp:host={host},port={port}");
        let mut t = self.texts();
        if t.controller_address != address {
            t.controller_address = address;
            drop(t);
            self.bump();
        }
    }

    /// Woken on every change of `Status` or `ControllerAddress`.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The texts as they are now.
    pub fn snapshot(&self) -> Texts {
        self.texts().clone()
    }

    /// When the last session ended, µs (realtime, monotonic); zeros while
    /// online or before the first session.
    pub fn disconnected_at(&self) -> (u64, u64) {
        self.disconnect.get()
    }

    /// When the manager was last heard from, µs (realtime, monotonic).
    pub fn last_seen(&self) -> (u64, u64) {
        self.seen.get()
    }
}
