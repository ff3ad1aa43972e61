//! Unit files the tests install on nodes.

/// A oneshot unit that succeeds at once.
pub const ONESHOT_OK: &str = "[Service]\nType=oneshot\nExecStart=/bin/true\n";
/// A long-running service.
pub const SLEEPER: &str = "[Service]\nExecStart=/bin/sleep 600\nExecReload=/bin/true\n";
/// A unit whose ExecStart fails.
pub const FAILING: &str = "[Service]\nType=oneshot\nExecStart=/bin/false\n";
/// A oneshot whose start job stays pending for a while.
pub const SLOW_START: &str = "[Service]\nType=oneshot\nExecStart=/bin/sleep 60\n";
/// A service that can be enabled: it is wanted by default.target.
pub const INSTALLABLE: &str =
    "[Service]\nExecStart=/bin/sleep 600\n[Install]\nWantedBy=default.target\n";
/// A service without an `[Install]` section: `static`.
pub const STATIC: &str = "[Service]\nType=oneshot\nExecStart=/bin/true\n";

/// A long-running requester of `proxy` (`drover-proxy@NODE_UNIT.service`) with
/// dependency kind `kind` (`Wants`, `Requires`, `BindsTo`) and `After=`.
pub fn requester(kind: &str, proxy: &str) -> String {
    format!("[Unit]\n{kind}={proxy}\nAfter={proxy}\n[Service]\nExecStart=/bin/sleep 600\n")
}
