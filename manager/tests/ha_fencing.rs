//! High availability where the leader could be fooled into leading beside
//! another (docs/ha.md, "Fencing"): its key deleted by hand while its lease
//! lives, its own path to etcd cut while the standby still reaches etcd,
//! one member of a 3-member etcd killed. And what a client sees on the
//! bus: `PropertiesChanged` of `Leading`, `Epoch` and `Leader`.
//!
//! Real parts: Debian's etcd (`drover_testkit::etcd`), real
//! `drover-manager` processes each on its own bus
//! (`drover_testkit::ha::HaManager`), a TCP relay between one manager and
//! etcd (`drover_testkit::relay`). "Never two leaders" is checked by reading
//! both managers' `Leading` together, every few milliseconds, for the whole
//! test ([`Overlap`]). Everything goes in `Drop`.

mod common;

use base64::Engine;
use common::*;
use drover_protocol::handshake::Hello;
use drover_protocol::link::{Answer, agent_handshake, agent_hello};
use drover_testkit::api::{Api, CONTROLLER_PATH};
use drover_testkit::etcd::Etcd;
use drover_testkit::etcd_cluster::EtcdCluster;
use drover_testkit::ha::{HaManager, LOOK, fence, leading, takeover};
use drover_testkit::relay::Relay;
use drover_testkit::wait::poll;
use futures::StreamExt;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use zbus::OwnedVariant;

const BIN: &str = env!("CARGO_BIN_EXE_drover-manager");
const TTL: Duration = Duration::from_secs(2);
/// How often [`Overlap`] reads both managers' `Leading`.
const SAMPLE: Duration = Duration::from_millis(5);

/// What a leading manager calls itself in the leader key (its address,
/// or its host name, and its agent port): its own `Leader`.
async fn own_name(m: &HaManager) -> String {
    let name: String = m
        .api
        .get_property(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "Leader")
        .await;
    assert!(name.ends_with(&format!(":{}", m.port)), "{name}");
    name
}

/// A manager of group `prefix` whose `EtcdEndpoints` is `url`.
async fn manager(url: &str, prefix: &str) -> HaManager {
    HaManager::start(Path::new(BIN), |_| {
        format!(
            "[drover-manager]\nAllowedNodeNames=node1,node2\nLogTarget=stderr\nLogLevel=DEBUG\n\
             EtcdEndpoints={url}\nEtcdKeyPrefix={prefix}\nEtcdLeaseTTL={}\n",
            TTL.as_secs()
        )
    })
    .await
}

/// Waits until `m` knows `epoch` (a standby that campaigned and lost).
async fn until_epoch(m: &HaManager, epoch: u64) {
    poll(WAIT, LOOK, &format!("epoch {epoch} known"), || async move {
        m.epoch().await == epoch
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", m.logged()));
}

/// Reads two managers' `Leading` together every [`SAMPLE`] until dropped
/// or [`Overlap::finish`]ed; counts the samples where both said true.
struct Overlap {
    stop: Arc<AtomicBool>,
    task: Option<JoinHandle<(u64, Vec<Duration>)>>,
    start: Instant,
}

impl Overlap {
    fn watch(a: &HaManager, b: &HaManager) -> Overlap {
        let (a, b) = (a.api.clone(), b.api.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let (mut samples, mut both) = (0, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    let (x, y) = tokio::join!(leading(&a), leading(&b));
                    if x.is_ok_and(|l| l) && y.is_ok_and(|l| l) {
                        both.push(start.elapsed());
                    }
                    samples += 1;
                    tokio::time::sleep(SAMPLE).await;
                }
                (samples, both)
            }
        });
        Overlap {
            stop,
            task: Some(task),
            start,
        }
    }

    /// Stops and asserts that no sample saw two leaders.
    async fn finish(mut self, what: &str) {
        self.stop.store(true, Ordering::SeqCst);
        let (samples, both) = self
            .task
            .take()
            .expect("running")
            .await
            .expect("the sampler");
        eprintln!(
            "{what}: {samples} samples of both managers' Leading over {:?}",
            self.start.elapsed()
        );
        assert!(samples > 50, "too few samples ({samples}) to say anything");
        assert!(
            both.is_empty(),
            "{what}: both managers said Leading at {both:?} after the start"
        );
    }
}

impl Drop for Overlap {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// `etcdctl del KEY` through etcd's JSON gateway.
async fn delete_by_hand(etcd: &Etcd, key: &str) {
    let body = format!(
        r#"{{"key":"{}"}}"#,
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let url = etcd.url();
    let (host, _) = drover_testkit::http::split_url(&url).expect("etcd's URL");
    let answer = drover_testkit::http::request(
        host,
        &format!(
            "POST /v3/kv/deleterange HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
    .expect("deleterange");
    assert!(
        answer.status == 200 && answer.body.contains(r#""deleted":"1""#),
        "{answer:?}"
    );
}

/// Which of the two leads once exactly one of them does with an epoch
/// above `above`, and the other knows it; panics after `limit`.
async fn one_leader<'a>(
    a: &'a HaManager,
    b: &'a HaManager,
    above: u64,
    limit: Duration,
) -> (&'a HaManager, &'a HaManager) {
    poll(
        limit,
        LOOK,
        "one leader above the old epoch",
        || async move {
            let (la, lb) = (a.leading().await, b.leading().await);
            let (ea, eb) = (a.epoch().await, b.epoch().await);
            la != lb && ea == eb && ea > above
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nA:\n{}\nB:\n{}", a.logged(), b.logged()));
    if a.leading().await { (a, b) } else { (b, a) }
}

#[tokio::test]
async fn a_leader_whose_key_is_deleted_by_hand_stops_before_another_leads() {
    let etcd = Etcd::start().await;
    let prefix = "/drover-test/deleted";
    let a = manager(&etcd.url(), prefix).await;
    a.until_leading(true, TTL * 3).await;
    let b = manager(&etcd.url(), prefix).await;
    let old = a.epoch().await;
    until_epoch(&b, old).await;
    let overlap = Overlap::watch(&a, &b);
    // Let the sampler see the steady state first.
    tokio::time::sleep(TTL / 4).await;

    delete_by_hand(&etcd, &format!("{prefix}/leader")).await;
    let deleted = Instant::now();
    let (ra, rb) = (&a, &b);
    poll(
        TTL * 3,
        Duration::from_millis(2),
        "a leader at a new epoch",
        || async move {
            (ra.leading().await && ra.epoch().await > old)
                || (rb.leading().await && rb.epoch().await > old)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nA:\n{}\nB:\n{}", a.logged(), b.logged()));
    eprintln!(
        "a leader at a new epoch {:?} after the deletion",
        deleted.elapsed()
    );
    let (leader, standby) = one_leader(&a, &b, old, TTL * 3).await;
    eprintln!(
        "after the deletion: {} leads at epoch {} ({:?} later)",
        if std::ptr::eq(leader, &a) { "A" } else { "B" },
        leader.epoch().await,
        deleted.elapsed()
    );
    assert!(
        a.logged().contains("the leader key was deleted in etcd"),
        "A did not notice its key went:\n{}",
        a.logged()
    );
    // Steady again for two leases: no second change, never two leaders.
    let epoch = leader.epoch().await;
    tokio::time::sleep(TTL * 2).await;
    assert!(leader.leading().await && !standby.leading().await);
    assert_eq!(
        (leader.epoch().await, standby.epoch().await),
        (epoch, epoch)
    );
    if std::env::var_os("HA_LOGS").is_some() {
        eprintln!("A:\n{}\nB:\n{}", a.logged(), b.logged());
    }
    overlap.finish("key deleted by hand").await;
}

#[tokio::test]
async fn a_leader_cut_from_etcd_stops_within_its_lease_and_the_standby_takes_over() {
    let etcd = Etcd::start().await;
    let prefix = "/drover-test/partition";
    let target = etcd.url().replacen("http://", "", 1);
    let relay = Relay::start(&target).await;
    let a = manager(&relay.url(), prefix).await;
    a.until_leading(true, TTL * 3).await;
    let b = manager(&etcd.url(), prefix).await;
    let old = a.epoch().await;
    until_epoch(&b, old).await;
    // node1 has a session on A and a link parked on B, as an agent listing
    // both managers has.
    let connect = |port: u16| async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to an agent port")
    };
    let (mut session, accepted) =
        agent_handshake(connect(a.port).await, &Hello::new("node1", "ha-test"), WAIT)
            .await
            .expect("A admits node1");
    assert_eq!(accepted.epoch, old);
    let parked =
        match agent_hello(connect(b.port).await, &Hello::new("node1", "ha-test"), WAIT).await {
            Ok(Answer::Parked(link, _)) => link,
            Ok(Answer::Accepted(..)) => panic!("the standby admitted an agent"),
            Err(e) => panic!("the standby refused: {e}"),
        };
    let welcomed = tokio::spawn(async move { (parked.verdict().await, Instant::now()) });
    let overlap = Overlap::watch(&a, &b);
    tokio::time::sleep(TTL / 4).await;

    relay.cut();
    // A's last renewal that can succeed was sent before this instant: a
    // renewal opens a connection after reading its send time, and the
    // relay accepts none from now on.
    let cut = Instant::now();
    let stopped = a.until_stopped(cut, fence(TTL), WAIT).await;
    eprintln!(
        "A stopped leading {:?} after its path to etcd was cut (last read saying it led sent \
         {:?} after; fence {:?})",
        stopped.answered,
        stopped.last_leading_sent,
        fence(TTL)
    );
    // Its agent's session is dropped: the agent goes to the leader.
    let ended = tokio::time::timeout(WAIT, async {
        while let Some(Ok(_)) = session.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "A kept its agent's session");
    b.until_leading(true, takeover(TTL).saturating_sub(cut.elapsed()))
        .await;
    eprintln!("B led {:?} after the cut", cut.elapsed());
    let new = b.epoch().await;
    assert!(new > old, "epoch {new} after {old}");
    let (verdict, at) = tokio::time::timeout(WAIT, welcomed)
        .await
        .expect("a verdict on the parked link")
        .expect("join");
    match verdict {
        Ok(Answer::Accepted(_, accepted)) => assert_eq!(accepted.epoch, new),
        Ok(Answer::Parked(_, message)) => panic!("parked again: {message}"),
        Err(e) => panic!("B refused the parked agent: {e}\n{}", b.logged()),
    }
    eprintln!(
        "the parked agent was welcomed by B {:?} after the cut",
        at - cut
    );

    // The path comes back: A learns B leads and stays a standby.
    relay.restore();
    until_epoch(&a, new).await;
    tokio::time::sleep(TTL * 2).await;
    assert!(!a.leading().await && b.leading().await);
    assert_eq!(b.epoch().await, new, "leadership changed after the restore");
    overlap.finish("leader cut from etcd").await;
}

/// The `io.drover.Controller` properties a `PropertiesChanged` carries.
fn changed(msg: &zbus::message::Message) -> HashMap<String, OwnedVariant> {
    let (iface, changed, _): (String, HashMap<String, OwnedVariant>, Vec<String>) =
        msg.body().deserialize().expect("PropertiesChanged's body");
    assert_eq!(iface, DROVER_CONTROLLER_IFACE);
    changed
}

/// Reads `PropertiesChanged` of `io.drover.Controller` until one says
/// what `done` wants; returns it.
async fn until_signalled(
    stream: &mut zbus::MessageStream,
    what: &str,
    done: impl Fn(&HashMap<String, OwnedVariant>) -> bool,
) -> HashMap<String, OwnedVariant> {
    tokio::time::timeout(TTL * 3, async {
        loop {
            let (member, msg) = next_signal(stream).await;
            if member != "PropertiesChanged" {
                continue;
            }
            let props = changed(&msg);
            if done(&props) {
                return props;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no PropertiesChanged saying {what}"))
}

fn prop<T: TryFrom<OwnedVariant>>(props: &HashMap<String, OwnedVariant>, name: &str) -> Option<T> {
    props.get(name).and_then(|v| T::try_from(v.clone()).ok())
}

async fn properties_of(api: &Api) -> zbus::MessageStream {
    api.signals(CONTROLLER_PATH, PROPERTIES_IFACE).await
}

#[tokio::test]
async fn standbys_signal_leading_epoch_and_leader_when_the_leader_dies() {
    let etcd = Etcd::start().await;
    let prefix = "/drover-test/signals";
    let mut a = manager(&etcd.url(), prefix).await;
    a.until_leading(true, TTL * 3).await;
    let old = a.epoch().await;
    let b = manager(&etcd.url(), prefix).await;
    let c = manager(&etcd.url(), prefix).await;
    until_epoch(&b, old).await;
    until_epoch(&c, old).await;
    let leader_a = own_name(&a).await;
    assert_eq!(
        b.api
            .get_property::<String>(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "Leader")
            .await,
        leader_a
    );
    let mut on_b = properties_of(&b.api).await;
    let mut on_c = properties_of(&c.api).await;

    a.kill();
    let (winner, loser, mut on_winner, mut on_loser) = match tokio::time::timeout(TTL * 3, async {
        loop {
            if b.leading().await {
                return true;
            }
            if c.leading().await {
                return false;
            }
            tokio::time::sleep(LOOK).await;
        }
    })
    .await
    .expect("B or C leads after A's death")
    {
        true => (&b, &c, on_b, on_c),
        false => {
            std::mem::swap(&mut on_b, &mut on_c);
            (&c, &b, on_b, on_c)
        }
    };
    let new = winner.epoch().await;
    assert!(new > old);
    let name = own_name(winner).await;
    // The winner: Leading true, the new epoch, itself as the leader.
    let props = until_signalled(&mut on_winner, "the winner leads", |p| {
        prop::<bool>(p, "Leading") == Some(true)
    })
    .await;
    assert_eq!(prop::<u64>(&props, "Epoch"), Some(new), "{props:?}");
    assert_eq!(prop::<String>(&props, "Leader"), Some(name.clone()));
    // The other standby: still not leading, the new epoch and leader.
    let props = until_signalled(&mut on_loser, "the new leader", |p| {
        prop::<u64>(p, "Epoch") == Some(new)
    })
    .await;
    assert_eq!(prop::<bool>(&props, "Leading"), Some(false), "{props:?}");
    assert_eq!(prop::<String>(&props, "Leader"), Some(name), "{props:?}");
    assert!(!loser.leading().await);
}

/// A 3-member etcd, each member killed in turn (the first is the one both
/// managers talk to: they try endpoints in order from the last that
/// answered) and started again: leadership stays, or changes once, and
/// the two managers never lead together.
#[tokio::test]
async fn killing_one_of_three_etcd_members_never_makes_two_leaders() {
    let mut etcd = EtcdCluster::start(3).await;
    let prefix = "/drover-test/members";
    let a = manager(&etcd.urls(), prefix).await;
    a.until_leading(true, TTL * 3).await;
    let b = manager(&etcd.urls(), prefix).await;
    until_epoch(&b, a.epoch().await).await;
    let overlap = Overlap::watch(&a, &b);
    for i in 0..etcd.len() {
        let raft_leader = etcd.raft_leader().await;
        let (leader, _) = one_leader(&a, &b, 0, WAIT).await;
        let before = leader.epoch().await;
        etcd.kill(i);
        let killed = Instant::now();
        // Three leases: every epoch a leader shows meanwhile.
        let mut epochs = vec![before];
        while killed.elapsed() < TTL * 3 {
            for m in [&a, &b] {
                if m.leading().await {
                    let e = m.epoch().await;
                    if !epochs.contains(&e) {
                        epochs.push(e);
                        eprintln!(
                            "  epoch {e} led {:?} after member {i} died",
                            killed.elapsed()
                        );
                    }
                }
            }
            tokio::time::sleep(LOOK).await;
        }
        let (leader, _) = one_leader(&a, &b, before - 1, WAIT).await;
        let after = leader.epoch().await;
        eprintln!(
            "member {i} killed (raft leader: {raft_leader:?}): epochs led {epochs:?}, {} leads \
             at epoch {after}",
            if std::ptr::eq(leader, &a) { "A" } else { "B" },
        );
        assert!(
            epochs.len() <= 2,
            "leadership changed more than once when member {i} died: {epochs:?}\nA:\n{}\nB:\n{}",
            a.logged(),
            b.logged()
        );
        etcd.resume(i).await;
    }
    overlap.finish("one etcd member killed in turn").await;
}
