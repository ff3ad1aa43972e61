//! The D-Bus error names drover produces, forwards or recognises: D-Bus's own
//! (`org.freedesktop.DBus.Error.*`), systemd's (`org.freedesktop.systemd1.*`)
//! and BlueChi's (`org.eclipse.bluechi.*`).
//!
//! Every process of drover speaks to another one in these names — the agent
//! forwards systemd's error names over the wire unchanged ([`crate::RemoteError`]),
//! the manager hands them to its D-Bus callers, droverctl and the proxy helper
//! turn them into messages for people — so each name is written once, here.
//! The names are part of the public API (BlueChi clients match on them): never
//! change one.

// ---- D-Bus's own error names ---------------------------------------------

/// Generic failure; also what a name that is not a valid D-Bus error name
/// becomes before it goes on a bus.
pub const FAILED: &str = "org.freedesktop.DBus.Error.Failed";
/// An argument is malformed or has the wrong type.
pub const INVALID_ARGS: &str = "org.freedesktop.DBus.Error.InvalidArgs";
/// The request needs something this process does not do.
pub const NOT_SUPPORTED: &str = "org.freedesktop.DBus.Error.NotSupported";
/// The peer does not implement the method (e.g. an older systemd).
pub const UNKNOWN_METHOD: &str = "org.freedesktop.DBus.Error.UnknownMethod";
/// No object at the path called.
pub const UNKNOWN_OBJECT: &str = "org.freedesktop.DBus.Error.UnknownObject";
/// The caller may not make this call (it is not root, not the monitor's
/// owner, not the proxy unit it names, …).
pub const ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
/// A bound was hit (too many monitors, a reply too large for one frame, …).
pub const LIMITS_EXCEEDED: &str = "org.freedesktop.DBus.Error.LimitsExceeded";
/// Nobody owns the bus name called, and it cannot be activated.
pub const SERVICE_UNKNOWN: &str = "org.freedesktop.DBus.Error.ServiceUnknown";
/// Nobody owns the bus name asked about.
pub const NAME_HAS_NO_OWNER: &str = "org.freedesktop.DBus.Error.NameHasNoOwner";
/// The callee left the bus (or timed out) without answering.
pub const NO_REPLY: &str = "org.freedesktop.DBus.Error.NoReply";
/// The connection to the bus is gone.
pub const DISCONNECTED: &str = "org.freedesktop.DBus.Error.Disconnected";
/// A file named in the call does not exist (systemd: unknown unit file).
pub const FILE_NOT_FOUND: &str = "org.freedesktop.DBus.Error.FileNotFound";

// ---- systemd's -------------------------------------------------------------

/// systemd does not know the unit.
pub const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// systemd does not know the job (it ended already).
pub const NO_SUCH_JOB: &str = "org.freedesktop.systemd1.NoSuchJob";

// ---- BlueChi's -------------------------------------------------------------

/// Every BlueChi error name starts with this.
pub const BLUECHI_PREFIX: &str = "org.eclipse.bluechi.";
/// The node called is offline.
pub const OFFLINE: &str = "org.eclipse.bluechi.Offline";
/// A proxy cannot be served: its target is not active and cannot become so.
pub const ACTIVATION_FAILED: &str = "org.eclipse.bluechi.ActivationFailed";

// ---- drover's --------------------------------------------------------------

/// This manager stands by while another leads (high availability); the
/// message names the leader.
pub const NOT_LEADER: &str = "io.drover.NotLeader";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bluechi_names_share_the_prefix() {
        for name in [OFFLINE, ACTIVATION_FAILED] {
            assert!(name.starts_with(BLUECHI_PREFIX), "{name}");
        }
    }
}
