//! How many unit lists the manager works on at once, and how many it keeps
//! waiting, per client and in total: the fleet-wide ones
//! (`Controller.ListUnits`, `ListUnitFiles`, [`ListKind::Fleet`]) and, with
//! their own bounds, one node's (`Node.ListUnits`, `ListUnitFiles`,
//! [`ListKind::Node`]), which `drover-readers` may call too.
//!
//! Each fleet-wide list asks every node and holds the answers until the
//! reply goes out: up to one D-Bus reply's worth of rows; a node's list
//! holds that node's rows. Unbounded, a few clients with many pending calls
//! (the system bus lets one user keep 128 per connection, and open many
//! connections) made the manager hold hundreds of MB and starved every
//! other client. So, for each kind:
//!
//! * at most [`FleetCallLimits::running`] gather at a time; the others wait
//!   their turn, first come first served (a waiting call holds its message
//!   and a task, not rows);
//! * at most [`FleetCallLimits::per_client`] per bus connection (unique
//!   name), running or waiting, and at most [`FleetCallLimits::waiting`]
//!   waiting in all: a call over either is refused at once with
//!   `org.freedesktop.DBus.Error.LimitsExceeded`, which says which limit and
//!   what to do.
//!
//! A [`Turn`] is the right to gather; dropping it (the call answered,
//! refused or abandoned) frees the place and the client's count.

use crate::error::ApiError;
use drover_protocol::error_names::LIMITS_EXCEEDED;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Which lists a [`FleetCalls`] bounds (the words of its refusals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `Controller.ListUnits`, `ListUnitFiles`.
    Fleet,
    /// `Node.ListUnits`, `ListUnitFiles` (any node).
    Node,
}

impl ListKind {
    fn interface(self) -> &'static str {
        match self {
            ListKind::Fleet => "Controller",
            ListKind::Node => "Node",
        }
    }

    fn lists(self) -> &'static str {
        match self {
            ListKind::Fleet => "fleet-wide lists",
            ListKind::Node => "node unit lists",
        }
    }
}

/// The bounds (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetCallLimits {
    /// Lists gathered at the same time.
    pub running: usize,
    /// Lists waiting for their turn, all clients together.
    pub waiting: usize,
    /// Lists of one bus connection, running or waiting.
    pub per_client: usize,
}

impl Default for FleetCallLimits {
    fn default() -> Self {
        Self {
            running: 2,
            waiting: 32,
            per_client: 2,
        }
    }
}

impl FleetCallLimits {
    /// The bounds of one node's lists: `droverctl list-units` asks
    /// [`NODE_LISTS_PER_CLIENT`] nodes at a time on one connection, and a
    /// node's list weighs a fleet-wide one divided by the fleet.
    pub fn node_lists() -> Self {
        Self {
            running: NODE_LISTS_PER_CLIENT,
            waiting: 240,
            per_client: NODE_LISTS_PER_CLIENT,
        }
    }
}

/// One connection's node lists at a time (running or waiting): what
/// `droverctl list-units` asks at once (`IN_FLIGHT` in droverctl).
pub const NODE_LISTS_PER_CLIENT: usize = 16;

/// The counters behind the limits; one per manager and [`ListKind`].
#[derive(Debug)]
pub struct FleetCalls {
    kind: ListKind,
    limits: FleetCallLimits,
    running: Arc<Semaphore>,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Calls admitted (running or waiting) per client.
    per_client: HashMap<String, usize>,
    /// Calls admitted, running or waiting.
    admitted: usize,
}

/// A call's place: counted for its client until dropped.
#[derive(Debug)]
struct Place {
    client: String,
    counts: Arc<Mutex<Counts>>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        counts.admitted = counts.admitted.saturating_sub(1);
        if let Some(n) = counts.per_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                counts.per_client.remove(&self.client);
            }
        }
    }
}

/// The right to gather one fleet-wide list (module docs).
#[derive(Debug)]
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    _place: Place,
}

impl FleetCalls {
    pub fn new(kind: ListKind, limits: FleetCallLimits) -> Self {
        Self {
            kind,
            limits,
            running: Arc::new(Semaphore::new(limits.running.max(1))),
            counts: Arc::default(),
        }
    }

    /// Waits for `client`'s turn to gather `method`, or refuses at once when
    /// the client or the queue is over its limit.
    pub async fn turn(&self, client: &str, method: &str) -> Result<Turn, ApiError> {
        let place = self.admit(client, method)?;
        let permit = self
            .running
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::failed("the manager is stopping"))?;
        Ok(Turn {
            _permit: permit,
            _place: place,
        })
    }

    fn admit(&self, client: &str, method: &str) -> Result<Place, ApiError> {
        let l = self.limits;
        let (iface, lists) = (self.kind.interface(), self.kind.lists());
        let mut counts = lock(&self.counts);
        let mine = counts.per_client.get(client).copied().unwrap_or(0);
        if mine >= l.per_client {
            return Err(ApiError::new(
                LIMITS_EXCEEDED,
                format!(
                    "{iface}.{method} refused: this connection already has {mine} {lists} under \
                     way, the most one connection may have; wait for their answers"
                ),
            ));
        }
        // Admitted calls beyond the running ones are waiting.
        if counts.admitted >= l.running.max(1) + l.waiting {
            tracing::warn!(
                "{iface}.{method} refused for {client}: {} {lists} are under way or waiting, \
                 the most the manager keeps",
                counts.admitted
            );
            let instead = match self.kind {
                ListKind::Fleet => format!(", or ask each node with Node.{method}"),
                ListKind::Node => String::new(),
            };
            return Err(ApiError::new(
                LIMITS_EXCEEDED,
                format!(
                    "{iface}.{method} refused: the manager is already busy with {} {lists}; try \
                     again later{instead}",
                    counts.admitted
                ),
            ));
        }
        counts.admitted += 1;
        *counts.per_client.entry(client.to_owned()).or_insert(0) += 1;
        Ok(Place {
            client: client.to_owned(),
            counts: self.counts.clone(),
        })
    }

    /// Calls admitted now (running or waiting), for tests and logs.
    pub fn admitted(&self) -> usize {
        lock(&self.counts).admitted
    }
}

fn lock(counts: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    // Every update leaves the counts consistent; a panic cannot half-write them.
    counts.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn calls(running: usize, waiting: usize, per_client: usize) -> FleetCalls {
        FleetCalls::new(
            ListKind::Fleet,
            FleetCallLimits {
                running,
                waiting,
                per_client,
            },
        )
    }

    fn refused(r: Result<Place, ApiError>) -> String {
        match r {
            Err(e) => {
                assert_eq!(e.name(), LIMITS_EXCEEDED);
                e.message().to_string()
            }
            Ok(_) => panic!("admitted"),
        }
    }

    #[test]
    fn one_client_gets_its_share_and_no_more() {
        let c = calls(1, 10, 2);
        let a = c.admit(":1.1", "ListUnits").unwrap();
        let _b = c.admit(":1.1", "ListUnits").unwrap();
        let why = refused(c.admit(":1.1", "ListUnits"));
        assert!(why.contains("this connection already has 2"), "{why}");
        // Another client is not held back by the first one's share.
        let _other = c.admit(":1.2", "ListUnits").unwrap();
        drop(a);
        assert!(c.admit(":1.1", "ListUnits").is_ok(), "a place freed");
    }

    #[test]
    fn the_queue_is_bounded_across_clients() {
        let c = calls(2, 3, 1);
        let held: Vec<_> = (0..5)
            .map(|i| c.admit(&format!(":1.{i}"), "ListUnitFiles").unwrap())
            .collect();
        assert_eq!(c.admitted(), 5);
        let why = refused(c.admit(":1.99", "ListUnitFiles"));
        assert!(why.contains("busy with 5"), "{why}");
        assert!(
            why.contains("ask each node with Node.ListUnitFiles"),
            "{why}"
        );
        drop(held);
        assert_eq!(c.admitted(), 0);
        assert!(
            lock(&c.counts).per_client.is_empty(),
            "nothing kept per client"
        );
    }

    #[test]
    fn node_lists_say_so_and_let_droverctl_ask_its_nodes_at_once() {
        let c = FleetCalls::new(ListKind::Node, FleetCallLimits::node_lists());
        let held: Vec<_> = (0..NODE_LISTS_PER_CLIENT)
            .map(|_| c.admit(":1.1", "ListUnits").unwrap())
            .collect();
        let why = refused(c.admit(":1.1", "ListUnits"));
        assert!(why.starts_with("Node.ListUnits refused"), "{why}");
        assert!(why.contains("16 node unit lists"), "{why}");
        drop(held);
        let l = FleetCallLimits::node_lists();
        let held: Vec<_> = (0..l.running + l.waiting)
            .map(|i| c.admit(&format!(":1.{i}"), "ListUnitFiles").unwrap())
            .collect();
        let why = refused(c.admit(":1.9999", "ListUnitFiles"));
        assert!(
            why.contains("busy with 256 node unit lists; try again later"),
            "{why}"
        );
        assert!(!why.contains("ask each node"), "{why}");
        drop(held);
        assert_eq!(c.admitted(), 0);
    }

    #[tokio::test]
    async fn turns_run_a_few_at_a_time_the_rest_wait() {
        let c = Arc::new(calls(1, 10, 4));
        let first = c.turn(":1.1", "ListUnits").await.unwrap();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.turn(":1.2", "ListUnits").await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one runs at a time");
        assert_eq!(c.admitted(), 2);
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(c.admitted(), 0);
    }
}
