//! The gate's caps, its choice of whom to evict, the accounting of waits on
//! the peer, and the log limiter.

use super::*;
use std::os::unix::net::UnixStream;

const MS: Duration = Duration::from_millis(1);

fn gate(handshakes: usize) -> Gate {
    Gate::new(Limits {
        handshakes,
        ripe_after: 100 * MS,
    })
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A ticket from `from` with a socket of its own; the peer end is returned
/// to keep the socket open.
fn enter(g: &Gate, from: &str) -> (Ticket, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let t = g.enter(g.try_slot().expect("a free place"), ip(from), Some(&ours));
    (t, theirs)
}

#[test]
fn caps_total_and_frees_on_drop() {
    let g = gate(3);
    let (t1, _p1) = enter(&g, "10.0.0.1");
    let (_t2, _p2) = enter(&g, "10.0.0.1");
    let (_t3, _p3) = enter(&g, "10.0.0.2");
    assert!(g.try_slot().is_none(), "the total cap is full");
    assert_eq!(g.in_flight(), 3);
    drop(t1);
    assert_eq!(g.in_flight(), 2);
    assert!(g.try_slot().is_some());
}

#[test]
fn no_address_is_refused_for_its_address() {
    // Sixty-four places, all from one address: the address is no reason.
    let g = gate(64);
    let held: Vec<_> = (0..64).map(|_| enter(&g, "10.0.0.1")).collect();
    assert_eq!(held.len(), 64);
    assert!(g.try_slot().is_none());
}

/// `d` is `want`, give or take the microsecond the clock rounds to.
fn about(d: Duration, want: Duration) -> bool {
    d.abs_diff(want) < MS
}

#[test]
fn only_ripe_connections_blocked_on_their_peer_are_evicted() {
    let g = gate(4);
    let t0 = Instant::now();
    let (a, _pa) = enter(&g, "10.0.0.1");
    let (b, _pb) = enter(&g, "10.0.0.2");
    let (c, _pc) = enter(&g, "10.0.0.3");
    // a waits on its peer from t0; b is being worked on (not waiting); c
    // waited 90 ms, got bytes, and waits again from t0 + 105 ms.
    a.wait.waiting(t0);
    c.wait.waiting(t0 + 10 * MS);
    c.wait.progressed(t0 + 100 * MS);
    let never = |_: &OwnedFd| false;
    match g.evict_ripest_with(t0 + 50 * MS, never) {
        Eviction::NotYet(Some(left)) => assert!(about(left, 50 * MS), "{left:?}"),
        other => panic!("nobody is ripe, a ripens first: {other:?}"),
    }
    c.wait.waiting(t0 + 105 * MS);
    match g.evict_ripest_with(t0 + 120 * MS, never) {
        Eviction::Evicted { ip: from, waited } => {
            assert_eq!(from, ip("10.0.0.1"));
            assert!(about(waited, 120 * MS), "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(a.wait.evicted());
    assert!(!b.wait.evicted() && !c.wait.evicted());
    assert_eq!(g.evictions(), 1, "counted for the metrics endpoint");
    assert_eq!(
        g.evict_ripest_with(t0 + 500 * MS, never),
        Eviction::Pending,
        "one eviction at a time"
    );
    drop(a);
    // c has waited 90 + 395 ms now; b, not waiting, is never chosen.
    match g.evict_ripest_with(t0 + 500 * MS, never) {
        Eviction::Evicted { waited, .. } => assert!(about(waited, 485 * MS), "{waited:?}"),
        other => panic!("{other:?}"),
    }
    assert!(c.wait.evicted() && !b.wait.evicted());
    drop(c);
    assert_eq!(
        g.evict_ripest_with(t0 + 10_000 * MS, never),
        Eviction::NotYet(None)
    );
    assert_eq!(g.evictions(), 2, "neither Pending nor NotYet counts");
    drop(b);
}

#[test]
fn the_address_with_most_places_gives_way_first_then_the_longest_waiter() {
    let g = gate(8);
    let t0 = Instant::now();
    let flood: Vec<_> = (0..3).map(|_| enter(&g, "10.9.9.9")).collect();
    let (agent, _pa) = enter(&g, "10.0.0.1");
    // The lone connection has waited longest, but its address holds one place.
    agent.wait.waiting(t0);
    for (i, (t, _)) in flood.iter().enumerate() {
        t.wait.waiting(t0 + (i as u32 + 1) * 10 * MS);
    }
    let never = |_: &OwnedFd| false;
    match g.evict_ripest_with(t0 + 200 * MS, never) {
        Eviction::Evicted { ip: from, waited } => {
            assert_eq!(from, ip("10.9.9.9"));
            assert!(about(waited, 190 * MS), "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        flood[0].0.wait.evicted(),
        "the longest waiter of that address"
    );
    assert!(!agent.wait.evicted());
}

#[test]
fn a_connection_with_unread_bytes_waits_on_the_manager_and_stays() {
    let g = gate(2);
    let t0 = Instant::now();
    let (a, _pa) = enter(&g, "10.0.0.1");
    a.wait.waiting(t0);
    let always = |_: &OwnedFd| true;
    assert_eq!(
        g.evict_ripest_with(t0 + 10_000 * MS, always),
        Eviction::NotYet(None)
    );
    assert!(!a.wait.evicted());
}

#[test]
fn without_a_socket_a_connection_is_never_evicted() {
    let g = gate(1);
    let t0 = Instant::now();
    let t = g.enter(g.try_slot().unwrap(), ip("10.0.0.1"), None::<&UnixStream>);
    t.wait.waiting(t0);
    assert_eq!(
        g.evict_ripest_with(t0 + 10_000 * MS, |_| false),
        Eviction::NotYet(None)
    );
}

#[tokio::test]
async fn watched_counts_reads_that_find_nothing_and_fails_once_evicted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = gate(2);
    let (client, server) = tokio::io::duplex(64);
    let t = g.enter(g.try_slot().unwrap(), ip("10.0.0.1"), None::<&UnixStream>);
    let mut watched = Watched::new(server, t.peer_wait());
    let mut client = client;
    // Nothing to read: the read blocks, a wait on the peer.
    let mut buf = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_millis(30), watched.read(&mut buf)).await;
    assert!(read.is_err(), "nothing was sent");
    let (waited, waiting) = t.wait.waited(Instant::now()).unwrap();
    assert!(waiting && waited >= Duration::from_millis(30), "{waited:?}");
    client.write_all(b"hi").await.unwrap();
    assert_eq!(watched.read(&mut buf).await.unwrap(), 2);
    let (_, waiting) = t.wait.waited(Instant::now()).unwrap();
    assert!(!waiting, "bytes came: the wait ended");
    // Evicted: the next read fails and says why.
    t.wait.evict();
    let err = watched.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
    assert!(err.to_string().contains("evicted"), "{err}");
    // After the verdict (ticket dropped) the stream only passes bytes through.
    drop(t);
    client.write_all(b"ok").await.unwrap();
    assert_eq!(watched.read(&mut buf).await.unwrap(), 2);
}

#[tokio::test]
async fn a_full_gate_makes_the_next_wait_until_a_place_frees() {
    let gate = Arc::new(gate(1));
    let held = gate.slot().await.unwrap();
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.slot().await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "no place is free yet");
    drop(held);
    assert_eq!(waiter.await.unwrap(), Some(()));
}

#[test]
fn log_limiter_bursts_then_trickles_and_counts() {
    let l = LogLimiter::default();
    let t0 = Instant::now();
    for _ in 0..LOG_BURST as usize {
        assert_eq!(l.allow_at("x", t0), Some(0));
    }
    assert_eq!(l.allow_at("x", t0), None);
    assert_eq!(l.allow_at("x", t0), None);
    assert_eq!(l.allow_at("other", t0), Some(0), "buckets are per reason");
    assert_eq!(l.allow_at("x", t0 + Duration::from_secs(1)), Some(2));
    assert_eq!(l.allow_at("x", t0 + Duration::from_secs(1)), None);
}
