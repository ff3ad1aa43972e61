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
//! or on the host that floods) it is first come, first served.
//!
//! A parked connection costs a descriptor and its kernel socket buffers (as
//! it did in the backlog), and a few dozen bytes here; the cap bounds both.
//! When the lobby is full the loop accepts nothing and the kernel queues the
//! rest, as before. Pure data: the loop owns the lobby, nothing else touches
//! it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

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
        let ip = self.ring.pop_front()?;
        let queue = self.queues.get_mut(&ip)?;
        let item = queue.pop_front()?;
        if queue.is_empty() {
            self.queues.remove(&ip);
        } else {
            self.ring.push_back(ip);
        }
        self.len -= 1;
        Some((ip, item))
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
