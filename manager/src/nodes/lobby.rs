//! Connections accepted but not let in yet, and the order they are let in:
//! round robin over source addresses, oldest first within an address.
//!
//! The accept loop takes every connection the kernel has as soon as it can
//! (up to [`Lobby::cap`]) and parks it here, unread; a connection leaves when
//! the gate has a place for it (`crate::nodes::gate`). The order is what
//! keeps a flood from many addresses from starving one agent: with the
//! lobby holding the flood instead of the kernel's listen backlog (which is
//! strictly first come, first served), an agent's connection waits for one
//! turn of every address that has connections waiting, not for every
//! connection that came before it. Within one address (agents behind a NAT,
//! or on the host that floods) it is first come, first served, with two
//! exceptions that [`Lobby::pop_with`] reads off each socket (a peek, one
//! system call): a connection its peer has closed already is dropped
//! without a turn, so a flood that stopped leaves nothing to wait behind;
//! and a connection that has sent nothing yet goes to the back of its
//! address's line, up to [`SKIP_SILENT`] of them a turn, so one whose first
//! bytes are there (a real agent speaks at once) passes silent ones from
//! its own address [`SKIP_SILENT`] at a time instead of one.
//!
//! A parked connection costs a descriptor and its kernel socket buffers (as
//! it did in the backlog), and a few dozen bytes here; the cap bounds both.
//! When the lobby is full the loop accepts nothing and the kernel queues the
//! rest, as before. Pure data: the loop owns the lobby, nothing else touches
//! it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

/// Silent connections sent to the back of their address's line in one turn,
/// at most (each costs a peek).
pub const SKIP_SILENT: usize = 32;

/// What a parked connection's socket says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// Bytes are waiting: its peer spoke.
    Spoke,
    /// Nothing yet.
    Silent,
    /// Its peer closed it or it failed: drop it.
    Gone,
}

/// Connections waiting to be let in, per source address (module docs).
#[derive(Debug)]
pub struct Lobby<T> {
    queues: HashMap<IpAddr, VecDeque<T>>,
    /// Addresses with connections waiting, in the order of their next turn.
    ring: VecDeque<IpAddr>,
    len: usize,
    cap: usize,
}

impl<T> Lobby<T> {
    /// A lobby for at most `cap` connections (at least one).
    pub fn new(cap: usize) -> Self {
        Lobby {
            queues: HashMap::new(),
            ring: VecDeque::new(),
            len: 0,
            cap: cap.max(1),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len >= self.cap
    }

    /// Parks a connection from `ip`; `false` (and nothing parked) when full.
    pub fn push(&mut self, ip: IpAddr, item: T) -> bool {
        if self.is_full() {
            return false;
        }
        let ip = ip.to_canonical();
        let queue = self.queues.entry(ip).or_default();
        if queue.is_empty() {
            self.ring.push_back(ip);
        }
        queue.push_back(item);
        self.len += 1;
        true
    }

    /// The next connection to let in: the oldest of the address whose turn
    /// it is; that address's next turn comes after every other address's.
    pub fn pop(&mut self) -> Option<(IpAddr, T)> {
        self.pop_with(|_| Peek::Spoke)
    }

    /// As [`Lobby::pop`], reading each candidate with `peek` (module docs):
    /// the gone are dropped (and the turn goes on), up to [`SKIP_SILENT`]
    /// silent ones go to the back of their line while others wait behind
    /// them.
    pub fn pop_with(&mut self, mut peek: impl FnMut(&T) -> Peek) -> Option<(IpAddr, T)> {
        loop {
            let ip = self.ring.pop_front()?;
            let Some(queue) = self.queues.get_mut(&ip) else {
                continue;
            };
            let mut skipped = 0;
            let mut found = None;
            while let Some(item) = queue.pop_front() {
                match peek(&item) {
                    Peek::Gone => self.len -= 1,
                    Peek::Silent if skipped < SKIP_SILENT && skipped < queue.len() => {
                        queue.push_back(item);
                        skipped += 1;
                    }
                    Peek::Spoke | Peek::Silent => {
                        found = Some(item);
                        break;
                    }
                }
            }
            if queue.is_empty() {
                self.queues.remove(&ip);
            } else {
                self.ring.push_back(ip);
            }
            if let Some(item) = found {
                self.len -= 1;
                return Some((ip, item));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_take_turns_and_each_keeps_its_order() {
        let mut l = Lobby::new(100);
        for n in 0..3 {
            assert!(l.push(ip("10.0.0.1"), format!("flood{n}")));
        }
        assert!(l.push(ip("10.0.0.2"), "other0".to_string()));
        assert!(l.push(ip("10.0.0.1"), "flood3".to_string()));
        assert!(l.push(ip("10.0.0.3"), "agent".to_string()));
        let order: Vec<String> = std::iter::from_fn(|| l.pop().map(|(_, s)| s)).collect();
        assert_eq!(
            order,
            ["flood0", "other0", "agent", "flood1", "flood2", "flood3"]
        );
        assert!(l.is_empty());
        assert_eq!(l.pop(), None);
    }

    #[test]
    fn one_agent_waits_one_turn_of_every_flooding_address() {
        // 125 addresses with 16 connections each came first; the agent is let
        // in after at most one connection of each.
        let mut l = Lobby::new(4096);
        for a in 0..125u8 {
            for _ in 0..16 {
                l.push(IpAddr::from([127, 2, 0, a]), false);
            }
        }
        l.push(ip("127.0.0.1"), true);
        let turn = std::iter::from_fn(|| l.pop())
            .position(|(_, agent)| agent)
            .unwrap();
        assert_eq!(turn, 125);
    }

    #[test]
    fn a_full_lobby_parks_nothing_more_and_frees_as_it_lets_in() {
        let mut l = Lobby::new(2);
        assert!(l.push(ip("10.0.0.1"), 1));
        assert!(l.push(ip("10.0.0.2"), 2));
        assert!(l.is_full());
        assert!(!l.push(ip("10.0.0.3"), 3));
        assert_eq!(l.len(), 2);
        assert_eq!(l.pop(), Some((ip("10.0.0.1"), 1)));
        assert!(l.push(ip("10.0.0.3"), 3));
    }

    #[test]
    fn closed_connections_are_dropped_without_a_turn() {
        // 1,000 connections of a flood that stopped, then an agent, all from
        // one address; another address waits too.
        let mut l = Lobby::new(4096);
        for _ in 0..1000 {
            l.push(ip("127.0.0.1"), "gone");
        }
        l.push(ip("127.0.0.1"), "agent");
        l.push(ip("10.0.0.2"), "other");
        let peek = |s: &&str| {
            if *s == "gone" {
                Peek::Gone
            } else {
                Peek::Spoke
            }
        };
        assert_eq!(l.pop_with(peek), Some((ip("127.0.0.1"), "agent")));
        assert_eq!(l.len(), 1);
        assert_eq!(l.pop_with(peek), Some((ip("10.0.0.2"), "other")));
        assert!(l.is_empty());
        assert_eq!(l.pop_with(peek), None);
    }

    #[test]
    fn one_that_spoke_passes_silent_ones_of_its_address_a_turn_at_a_time() {
        let mut l = Lobby::new(4096);
        for n in 0..100 {
            l.push(ip("127.0.0.1"), n);
        }
        l.push(ip("127.0.0.1"), 1000);
        let peek = |n: &i32| {
            if *n == 1000 {
                Peek::Spoke
            } else {
                Peek::Silent
            }
        };
        let turns = std::iter::from_fn(|| l.pop_with(peek))
            .position(|(_, n)| n == 1000)
            .unwrap();
        // Each turn sends SKIP_SILENT to the back and lets the next one in.
        assert_eq!(turns, 100 / (SKIP_SILENT + 1));
        // Silent ones still get in, none lost.
        let mut rest: Vec<i32> = std::iter::from_fn(|| l.pop_with(peek))
            .map(|(_, n)| n)
            .collect();
        rest.sort();
        assert_eq!(rest.len(), 100 - turns);
        assert!(l.is_empty());
    }

    #[test]
    fn a_lone_silent_connection_is_let_in() {
        let mut l = Lobby::new(10);
        l.push(ip("10.0.0.1"), 1);
        assert_eq!(l.pop_with(|_| Peek::Silent), Some((ip("10.0.0.1"), 1)));
    }

    #[test]
    fn mapped_addresses_are_one_address() {
        let mut l = Lobby::new(10);
        l.push(ip("10.0.0.1"), 1);
        l.push(ip("::ffff:10.0.0.1"), 2);
        l.push(ip("10.0.0.2"), 3);
        assert_eq!(l.pop().map(|(_, n)| n), Some(1));
        assert_eq!(l.pop().map(|(_, n)| n), Some(3));
        assert_eq!(l.pop().map(|(_, n)| n), Some(2));
    }
}
