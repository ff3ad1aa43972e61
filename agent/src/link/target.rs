//! Where the link dials: the managers' hosts and ports (one, or the
//! managers of a high-availability group, `ControllerHost=` /
//! `ControllerAddress=` lists), which
//! `org.eclipse.bluechi.Agent.SwitchController` may change while the agent
//! runs (BlueChi's way to move a node to a standby manager): a switch
//! replaces the whole list with the one manager it names.
//!
//! Invariants: the target is always a host the config crate accepts
//! (`drover_config::agent::parse_controller_address` is the one parser of
//! BlueChi's `tcp:host=H,port=P`), so garbage never reaches the link; a switch
//! to the address already dialled is refused and changes nothing (as
//! BlueChi); every accepted switch wakes [`ControllerTarget::watch`]ers once,
//! and the link ([`crate::connection`]) then drops its session or
//! connection attempt and dials the new target at once, without backoff. A
//! switch lasts for the life of the process: a restarted agent dials what its
//! config says, as BlueChi's agent does.

use std::sync::{Mutex, MutexGuard};
use tokio::sync::watch;

/// The manager's host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// BlueChi's address syntax, as `ControllerAddress` shows it.
    pub fn address(&self) -> String {
        format!("tcp:host={},port={}", self.host, self.port)
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `host:port`; an IPv6 literal gets brackets so the port stays readable.
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The endpoints the link dials, and a watch that fires on every switch.
pub struct ControllerTarget {
    current: Mutex<Vec<Endpoint>>,
    switched: watch::Sender<u64>,
}

impl Default for ControllerTarget {
    fn default() -> Self {
        Self {
            current: Mutex::new(Vec::new()),
            switched: watch::channel(0).0,
        }
    }
}

impl ControllerTarget {
    fn lock(&self) -> MutexGuard<'_, Vec<Endpoint>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The endpoints from the configuration, set once before the link runs
    /// (wakes nobody).
    pub fn init(&self, endpoints: Vec<Endpoint>) {
        *self.lock() = endpoints;
    }

    /// Every endpoint the link dials now.
    pub fn all(&self) -> Vec<Endpoint> {
        self.lock().clone()
    }

    /// Switches to `address` (`tcp:host=H,port=P`) and returns the new
    /// endpoint, or says why not; nothing changes on an error.
    pub fn switch(&self, address: &str) -> Result<Endpoint, String> {
        let (host, port) = drover_config::agent::parse_controller_address(address)?;
        let new = Endpoint { host, port };
        {
            let mut current = self.lock();
            if current.as_slice() == std::slice::from_ref(&new) {
                return Err(format!("the agent already connects to {}", new.address()));
            }
            *current = vec![new.clone()];
        }
        self.switched.send_modify(|n| *n = n.wrapping_add(1));
        Ok(new)
    }

    /// Fires after each accepted [`ControllerTarget::switch`].
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_parses_refuses_garbage_and_the_same_address() {
        let t = ControllerTarget::default();
        t.init(vec![Endpoint {
            host: "127.0.0.1".into(),
            port: 842,
        }]);
        let rx = t.watch();
        for bad in [
            "",
            "tcp:host=h",
            "unix:path=/run/bluechi/bluechi.sock",
            "tcp:host=a b,port=1",
            "tcp:host=h,port=0",
            "h:842",
            "tcp:host=h,port=1,port=2",
        ] {
            assert!(t.switch(bad).is_err(), "{bad:?}");
        }
        // The same endpoint, in another spelling, is refused too.
        let err = t.switch("tcp:port=842,host=127.0.0.1").unwrap_err();
        assert_eq!(
            err,
            "the agent already connects to tcp:host=127.0.0.1,port=842"
        );
        assert!(
            !rx.has_changed().unwrap(),
            "no refused switch wakes the link"
        );
        assert_eq!(t.all()[0].port, 842);

        let new = t.switch("tcp:host=::1,port=9000").unwrap();
        assert_eq!(new.to_string(), "[::1]:9000");
        assert_eq!(new.address(), "tcp:host=::1,port=9000");
        assert_eq!(t.all(), std::slice::from_ref(&new));
        assert!(rx.has_changed().unwrap());
        // A list is replaced by the one manager named, even one of its own.
        let a = Endpoint {
            host: "a".into(),
            port: 1,
        };
        let b = Endpoint {
            host: "b".into(),
            port: 1,
        };
        t.init(vec![a.clone(), b]);
        assert_eq!(t.switch("tcp:host=a,port=1").unwrap(), a);
        assert_eq!(t.all(), [a]);
    }
}
