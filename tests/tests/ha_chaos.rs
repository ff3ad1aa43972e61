//! A chaos run of high availability (issue 31, "Done means"): two real
//! managers on a real etcd with a 2 s lease, real `systemd --user` nodes,
//! cross-node dependencies in use, and [`FAILOVERS`] failovers of three
//! kinds in turn, each on whichever manager leads:
//!
//! * **kill**: SIGKILL, then the manager is started again and stands by;
//! * **term**: SIGTERM (it resigns: its lease is revoked), then started again;
//! * **stop**: SIGSTOP until the other manager leads (past the lease), then
//!   SIGCONT: the resumed manager must stand by and no agent may obey it.
//!
//! Meanwhile jobs (`StartUnit`/`StopUnit`) go to whichever manager the test
//! last saw leading, one after another, and one more is issued on the leader
//! just before each failover, so jobs are in flight when it happens. What a
//! user checks, and what this test asserts at the end:
//!
//! * **no unit stopped**: the units of the dependencies in use (requesters
//!   with `Wants=` and `Requires=` on `drover-proxy@…`, the proxies, the
//!   `drover-dep@` units, the targets) keep the `InvocationID` and
//!   `ActiveEnterTimestampMonotonic` systemd gave them before the first
//!   failover, and never left `active` (`ActiveExitTimestampMonotonic` 0);
//! * **no dep unit leaked**: once the churned requesters are stopped, the
//!   `drover-dep@` units and proxies running on the nodes are exactly those
//!   the requesters still running want;
//! * **every job ends once**: a job a manager accepted (it returned a job
//!   path) ends with exactly one `JobRemoved` from that manager, unless that
//!   manager was SIGKILLed before it could say (then none); a job removed
//!   `done` left its unit in the state it asked for;
//! * **no agent obeyed a lower epoch**: in every agent's log, the epochs of
//!   the managers it registered with never fall, and each is the epoch the
//!   test saw that manager lead with; every new leader's epoch is higher
//!   than the last;
//! * every failover: the other manager leads, every node is online on it
//!   within [`FOLLOW_LIMIT`] of the signal.
//!
//! Manager A is the sandbox's (socket-activated: its port stays open while
//! it is down); manager B runs on its own bus like another host and binds
//! its port itself. The timings are printed at the end.

use drover_testkit::api::DROVER_CONTROLLER_IFACE;
use drover_testkit::etcd::Etcd;
use drover_testkit::ha::{HaManager, LOOK, TwoManagers, two_managers};
use drover_testkit::prelude::*;
use drover_testkit::wait::poll;
use futures::StreamExt;
use nix::sys::signal::Signal;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const NODES: [&str; 2] = ["node1", "node2"];
const TTL_S: u64 = 2;
/// The issue's count: at least 100 failovers.
const FAILOVERS: usize = 100;
const T: Duration = Duration::from_secs(20);
/// The issue's target: every agent registered with the new leader within
/// this long of the signal that ended the old one.
const FOLLOW_LIMIT: Duration = Duration::from_secs(5);
/// How long a job accepted by a manager that was not SIGKILLed may take to
/// end (a stopped manager resumes within a lease or two).
const JOB_LIMIT: Duration = Duration::from_secs(30);
/// How long the nodes may take to stop what no requester wants any more
/// (the new leader's warm-up and orphan sweep).
const SETTLE: Duration = Duration::from_secs(60);

/// The dependencies in use for the whole run, as (node, unit): requesters
/// with `Wants=` and `Requires=` on proxies both ways, their proxies,
/// the dependency units and the targets.
const STEADY: [(&str, &str); 12] = [
    ("node1", "need-db.service"),
    ("node1", "need-cache.service"),
    ("node1", "drover-proxy@node2_db.service"),
    ("node1", "drover-proxy@node2_cache.service"),
    ("node1", "web.service"),
    ("node1", "drover-dep@web.service.service"),
    ("node2", "need-web.service"),
    ("node2", "drover-proxy@node1_web.service"),
    ("node2", "db.service"),
    ("node2", "cache.service"),
    ("node2", "drover-dep@db.service.service"),
    ("node2", "drover-dep@cache.service.service"),
];

/// The requesters the jobs start and stop (each wants a proxy of a unit
/// on the other node, so every job creates or releases a dependency).
const CHURN: [(&str, &str); 2] = [("node1", "churn.service"), ("node2", "churn2.service")];
/// The unit the job issued just before each failover starts or stops.
const FLIP: (&str, &str) = ("node1", "flip.service");

const SLEEPER: &str = "[Service]\nExecStart=/bin/sleep 3600\n";

fn requester(dep: &str, proxy: &str) -> String {
    format!("[Unit]\n{dep}={proxy}\nAfter={proxy}\n[Service]\nExecStart=/bin/sleep 3600\n")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Kill,
    Term,
    Stop,
}

const KINDS: [Kind; 3] = [Kind::Kill, Kind::Term, Kind::Stop];

/// A manager incarnation: (which manager, its unique name on its bus).
type Issuer = (usize, String);

/// A `JobRemoved` heard on a manager's bus.
#[derive(Debug, Clone)]
struct Removed {
    issuer: Issuer,
    path: String,
    result: String,
}

/// A job a manager accepted.
#[derive(Debug, Clone)]
struct Issued {
    issuer: Issuer,
    path: String,
    node: String,
    unit: String,
    method: &'static str,
}

impl std::fmt::Display for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}({}) on {}: job {} of manager {} ({})",
            self.method,
            self.unit,
            self.node,
            self.path,
            ["A", "B"][self.issuer.0],
            self.issuer.1
        )
    }
}

/// What the test shares with its job tasks.
struct Book {
    removed: Mutex<Vec<Removed>>,
    issued: Mutex<Vec<Issued>>,
    /// Incarnations the test SIGKILLed.
    killed: Mutex<BTreeSet<Issuer>>,
    /// Calls that were refused or unanswered, by error name.
    refused: Mutex<BTreeMap<String, usize>>,
    /// What went wrong in a job task (asserted empty at the end).
    failures: Mutex<Vec<String>>,
    /// Jobs removed, by result.
    results: Mutex<BTreeMap<String, usize>>,
}

impl Book {
    fn new() -> Arc<Book> {
        Arc::new(Book {
            removed: Mutex::default(),
            issued: Mutex::default(),
            killed: Mutex::default(),
            refused: Mutex::default(),
            failures: Mutex::default(),
            results: Mutex::default(),
        })
    }

    fn removals(&self, issuer: &Issuer, path: &str) -> Vec<Removed> {
        lock(&self.removed)
            .iter()
            .filter(|r| &r.issuer == issuer && r.path == path)
            .cloned()
            .collect()
    }

    fn fail(&self, what: String) {
        lock(&self.failures).push(what);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records every `JobRemoved` on manager `which`'s bus, from whichever
/// process owns the manager's name there.
async fn hear_removals(which: usize, api: Api, book: Arc<Book>) {
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface(CONTROLLER_IFACE)
        .member("JobRemoved")
        .build()
        .expect("match rule")
        .to_owned();
    let mut stream = zbus::MessageStream::for_match_rule(rule, &api.conn, None)
        .await
        .expect("subscribe to JobRemoved");
    while let Some(Ok(msg)) = stream.next().await {
        let sender = msg
            .header()
            .sender()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let body: zbus::Result<(u32, zbus::OwnedObjectPath, String, String, String)> =
            msg.body().deserialize();
        match body {
            Ok((_, path, _, _, result)) => lock(&book.removed).push(Removed {
                issuer: (which, sender),
                path: path.to_string(),
                result,
            }),
            Err(e) => book.fail(format!("a JobRemoved that does not parse: {e}")),
        }
    }
}

/// The D-Bus error name of a failed call, or what else went wrong.
fn error_name(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, _, _) => name.to_string(),
        zbus::Error::FDO(e) => format!("{e}")
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned(),
        other => format!("{other}"),
    }
}

/// `Node.<method>(unit, "replace")` on `node` through manager `which`:
/// the job it accepted, or `None` (the refusal is counted).
async fn issue(
    which: usize,
    api: &Api,
    book: &Book,
    (node, unit): (&str, &str),
    method: &'static str,
) -> Option<Issued> {
    let refused = |e: &zbus::Error| {
        *lock(&book.refused).entry(error_name(e)).or_default() += 1;
    };
    let node_path: zbus::OwnedObjectPath = match api
        .call(CONTROLLER_PATH, CONTROLLER_IFACE, "GetNode", &(node,))
        .await
    {
        Ok(p) => p,
        Err(e) => {
            refused(&e);
            return None;
        }
    };
    let reply = api
        .conn
        .call_method(
            Some(BUS_NAME),
            node_path.as_str(),
            Some(NODE_IFACE),
            method,
            &(unit, "replace"),
        )
        .await;
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            refused(&e);
            return None;
        }
    };
    let sender = reply
        .header()
        .sender()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let path: zbus::OwnedObjectPath = match reply.body().deserialize() {
        Ok(p) => p,
        Err(e) => {
            book.fail(format!("{method}({unit}) answered something else: {e}"));
            return None;
        }
    };
    let job = Issued {
        issuer: (which, sender),
        path: path.to_string(),
        node: node.into(),
        unit: unit.into(),
        method,
    };
    lock(&book.issued).push(job.clone());
    Some(job)
}

/// Waits until `job` ends; returns its result, or `None` when its manager
/// was SIGKILLed first. A job that does neither within [`JOB_LIMIT`] is a
/// failure.
async fn judge(book: &Book, job: &Issued) -> Option<String> {
    let start = Instant::now();
    loop {
        if let Some(r) = book.removals(&job.issuer, &job.path).first() {
            *lock(&book.results).entry(r.result.clone()).or_default() += 1;
            return Some(r.result.clone());
        }
        if lock(&book.killed).contains(&job.issuer) {
            *lock(&book.results)
                .entry("(its manager was SIGKILLed)".into())
                .or_default() += 1;
            return None;
        }
        if start.elapsed() > JOB_LIMIT {
            book.fail(format!(
                "{job}: no JobRemoved within {JOB_LIMIT:?}, and its manager was not killed"
            ));
            return None;
        }
        tokio::time::sleep(LOOK).await;
    }
}

/// `ActiveState` of `unit` as the node's systemd says it.
async fn active_state(systemd: &zbus::Proxy<'static>, unit: &str) -> String {
    let path: zbus::Result<zbus::OwnedObjectPath> = systemd.call("LoadUnit", &(unit,)).await;
    let Ok(path) = path else {
        return "unknown".into();
    };
    let conn = systemd.connection();
    let v: zbus::Result<zbus::Message> = conn
        .call_method(
            Some("org.freedesktop.systemd1"),
            path.as_str(),
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &("org.freedesktop.systemd1.Unit", "ActiveState"),
        )
        .await;
    v.ok()
        .and_then(|m| m.body().deserialize::<zbus::OwnedVariant>().ok())
        .and_then(|v| String::try_from(v).ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Jobs one after another on whichever manager `leader` names, until
/// `stop`: start and stop of each [`CHURN`] requester in turn. A job
/// removed `done` must have left its unit started or stopped.
async fn jobber(
    apis: [Api; 2],
    systemd: [zbus::Proxy<'static>; 2],
    leader: watch::Receiver<usize>,
    book: Arc<Book>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(150));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0usize.. {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let (node, unit) = CHURN[n % 2];
        let (method, want) = if (n / 2) % 2 == 0 {
            ("StartUnit", "active")
        } else {
            ("StopUnit", "inactive")
        };
        let which = *leader.borrow();
        let Some(job) = issue(which, &apis[which], &book, (node, unit), method).await else {
            continue;
        };
        if judge(&book, &job).await.as_deref() == Some("done") {
            let node_index = usize::from(node == "node2");
            let now = active_state(&systemd[node_index], unit).await;
            if now != want {
                book.fail(format!("{job} removed done, but {unit} is {now}"));
            }
        }
    }
}

/// The two managers: A (the sandbox's, index 0) and B (index 1).
struct Pair {
    c: TestCluster,
    b: HaManager,
    apis: [Api; 2],
    ports: [u16; 2],
    agent_logs: Vec<PathBuf>,
}

impl Pair {
    fn signal(&self, which: usize, sig: Signal) {
        if which == 0 {
            self.c.signal_manager(sig).expect("signal manager A");
        } else {
            self.b.signal(sig);
        }
    }

    async fn kill(&mut self, which: usize) {
        if which == 0 {
            self.c.signal_manager(Signal::SIGKILL).expect("SIGKILL A");
            self.c.wait_manager_exit(T).await.expect("A reaped");
        } else {
            self.b.kill();
        }
    }

    async fn exited(&mut self, which: usize) -> std::process::ExitStatus {
        if which == 0 {
            self.c.wait_manager_exit(T).await.expect("A exits")
        } else {
            self.b.exited(T).await
        }
    }

    async fn start_again(&mut self, which: usize) {
        if which == 0 {
            self.c.start_manager().await.expect("A starts again");
        } else {
            self.b.start_again().await;
        }
    }

    /// The unique bus name of the process that owns the manager's name on
    /// manager `which`'s bus.
    async fn owner(&self, which: usize) -> String {
        let owner: zbus::Result<String> = self.apis[which]
            .conn
            .call_method(
                Some("org.freedesktop.DBus"),
                "/org/freedesktop/DBus",
                Some("org.freedesktop.DBus"),
                "GetNameOwner",
                &(BUS_NAME,),
            )
            .await
            .and_then(|m| m.body().deserialize());
        owner.unwrap_or_else(|e| panic!("GetNameOwner on manager {which}'s bus: {e}"))
    }

    async fn leading(&self, which: usize) -> Option<bool> {
        drover_testkit::ha::leading(&self.apis[which]).await.ok()
    }

    async fn epoch(&self, which: usize) -> u64 {
        self.apis[which]
            .get_property(CONTROLLER_PATH, DROVER_CONTROLLER_IFACE, "Epoch")
            .await
    }

    async fn until_leading(&self, which: usize, want: bool, what: &str) {
        poll(T, LOOK, what, || async {
            self.leading(which).await == Some(want)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()));
    }

    /// Whether every node is online in manager `which`'s `ListNodes`.
    async fn all_online(&self, which: usize) -> bool {
        drover_testkit::ha::all_online(&self.apis[which], &NODES).await
    }

    async fn until_all_online(&self, which: usize, limit: Duration, what: &str) {
        poll(limit, LOOK, what, || self.all_online(which))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()));
    }

    /// How many times each agent was parked on manager `which` so far.
    fn parked_counts(&self, which: usize) -> Vec<usize> {
        let needle = format!(
            "the manager at 127.0.0.1:{} stands by (parked: ",
            self.ports[which]
        );
        self.agent_logs
            .iter()
            .map(|l| {
                std::fs::read_to_string(l)
                    .unwrap_or_default()
                    .matches(&needle)
                    .count()
            })
            .collect()
    }

    /// The last lines of every log, for a failure's message.
    fn logs(&self) -> String {
        let tail = |text: String| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        let mut text = format!(
            "manager A:\n{}\nmanager B:\n{}\n",
            tail(std::fs::read_to_string(self.c.log_path("manager")).unwrap_or_default()),
            tail(self.b.logged())
        );
        for l in &self.agent_logs {
            text.push_str(&format!(
                "{}:\n{}\n",
                l.display(),
                tail(std::fs::read_to_string(l).unwrap_or_default())
            ));
        }
        text
    }
}

/// What systemd says of a unit that must never stop: its invocation, when
/// it became active, when it last left active (0: never).
async fn identity(c: &TestCluster, node: &str, unit: &str) -> [String; 4] {
    let mut v = [String::new(), String::new(), String::new(), String::new()];
    for (slot, prop) in v.iter_mut().zip([
        "ActiveState",
        "InvocationID",
        "ActiveEnterTimestampMonotonic",
        "ActiveExitTimestampMonotonic",
    ]) {
        *slot = c.prop(node, unit, prop).await;
    }
    v
}

/// The `drover-dep@` and `drover-proxy@` units active or on their way on
/// `node`, sorted.
async fn drover_units(c: &TestCluster, node: &str) -> Vec<String> {
    let out = c
        .systemctl(
            node,
            &[
                "list-units",
                "--plain",
                "--no-legend",
                "--state=active,activating,deactivating,reloading",
                "drover-dep@*",
                "drover-proxy@*",
            ],
        )
        .await;
    let mut units: Vec<String> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    units.sort();
    units
}

/// Each agent's registrations, from its log: (manager port, epoch).
fn registrations(log: &str) -> Vec<(u16, u64)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("connected to the manager at 127.0.0.1:").nth(1)?;
            let port = rest.split(' ').next()?.parse().ok()?;
            let epoch = rest
                .split("(leadership epoch ")
                .nth(1)?
                .split(')')
                .next()?
                .parse()
                .ok()?;
            Some((port, epoch))
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_failovers_stop_nothing_and_lose_no_job() {
    let run_start = Instant::now();
    let etcd = Etcd::start().await;
    let TwoManagers { c, b, agent_logs } = two_managers(&etcd, "/drover-test/chaos", TTL_S).await;
    let a_api = c.api().await;
    let ports = [c.manager_port(), b.port];
    let apis = [a_api, b.api.clone()];
    let mut p = Pair {
        c,
        b,
        apis,
        ports,
        agent_logs,
    };
    p.until_leading(1, false, "B stands by").await;
    p.until_all_online(0, T, "every node online on A").await;
    poll(T, LOOK, "the agents parked on B", || {
        let ok = p.parked_counts(1).iter().all(|&n| n > 0);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));

    // The dependencies in use, both ways, with Wants= and Requires=.
    for (node, unit) in [
        ("node2", "db.service"),
        ("node2", "cache.service"),
        ("node1", "web.service"),
        ("node2", "churn-db.service"),
        ("node1", "churn-web.service"),
        FLIP,
    ] {
        p.c.install(node, unit, SLEEPER).await;
    }
    let units = [
        (
            "node1",
            "need-db.service",
            requester("Wants", "drover-proxy@node2_db.service"),
        ),
        (
            "node1",
            "need-cache.service",
            requester("Requires", "drover-proxy@node2_cache.service"),
        ),
        (
            "node2",
            "need-web.service",
            requester("Wants", "drover-proxy@node1_web.service"),
        ),
        // No After=: the job ends when the requester runs, its proxy follows.
        (
            "node1",
            "churn.service",
            "[Unit]\nWants=drover-proxy@node2_churn-db.service\n[Service]\nExecStart=/bin/sleep 3600\n"
                .into(),
        ),
        (
            "node2",
            "churn2.service",
            "[Unit]\nWants=drover-proxy@node1_churn-web.service\n[Service]\nExecStart=/bin/sleep 3600\n"
                .into(),
        ),
    ];
    for (node, unit, text) in &units {
        p.c.install(node, unit, text).await;
    }
    for (node, unit) in [
        ("node1", "need-db.service"),
        ("node1", "need-cache.service"),
        ("node2", "need-web.service"),
    ] {
        p.c.systemctl_ok(node, &["start", unit]).await;
    }
    for (node, unit) in STEADY {
        p.c.wait_state(node, unit, "active", T).await;
    }
    let mut before = Vec::new();
    for (node, unit) in STEADY {
        let id = identity(&p.c, node, unit).await;
        assert_eq!(id[0], "active", "{unit} on {node}");
        assert_eq!(id[3], "0", "{unit} on {node} left active before the run");
        before.push(id);
    }

    // Jobs on whichever manager leads, for the whole run.
    let book = Book::new();
    let mut hearers = Vec::new();
    for (which, api) in p.apis.iter().enumerate() {
        hearers.push(tokio::spawn(hear_removals(
            which,
            api.clone(),
            book.clone(),
        )));
    }
    // Subscribed before any job: a first job's removal is heard.
    for api in &p.apis {
        let _: zbus::Result<String> = api
            .conn
            .call_method(
                Some("org.freedesktop.DBus"),
                "/org/freedesktop/DBus",
                Some("org.freedesktop.DBus"),
                "GetId",
                &(),
            )
            .await
            .and_then(|m| m.body().deserialize());
    }
    let (leader_tx, leader_rx) = watch::channel(0usize);
    let (stop_jobs, stop_rx) = watch::channel(false);
    let systemd = [p.c.systemd("node1").await, p.c.systemd("node2").await];
    let jobs = tokio::spawn(jobber(
        p.apis.clone(),
        systemd,
        leader_rx,
        book.clone(),
        stop_rx,
    ));

    let mut leader = 0usize;
    let mut epochs = vec![(p.epoch(0).await, ports[0])];
    let mut led_after: BTreeMap<Kind, Vec<Duration>> = BTreeMap::new();
    let mut followed_after: BTreeMap<Kind, Vec<Duration>> = BTreeMap::new();
    let mut flip_jobs = Vec::new();
    for n in 0..FAILOVERS {
        let kind = KINDS[n % KINDS.len()];
        let other = 1 - leader;
        let parked_before = p.parked_counts(leader);
        let victim = (leader, p.owner(leader).await);
        // A job in flight as the failover happens.
        let method = if n % 2 == 0 { "StartUnit" } else { "StopUnit" };
        if let Some(job) = issue(leader, &p.apis[leader], &book, FLIP, method).await {
            flip_jobs.push(job);
        }
        let signalled = Instant::now();
        match kind {
            Kind::Kill => {
                lock(&book.killed).insert(victim);
                p.kill(leader).await;
            }
            Kind::Term => p.signal(leader, Signal::SIGTERM),
            Kind::Stop => p.signal(leader, Signal::SIGSTOP),
        }
        p.until_leading(
            other,
            true,
            &format!("failover {n} ({kind:?}): the other leads"),
        )
        .await;
        let led = signalled.elapsed();
        leader_tx.send_replace(other);
        p.until_all_online(
            other,
            FOLLOW_LIMIT.saturating_sub(led),
            &format!("failover {n} ({kind:?}): every node online on the new leader"),
        )
        .await;
        let followed = signalled.elapsed();
        assert!(followed <= FOLLOW_LIMIT, "failover {n}: {followed:?}");
        led_after.entry(kind).or_default().push(led);
        followed_after.entry(kind).or_default().push(followed);
        let epoch = p.epoch(other).await;
        let (last, _) = *epochs.last().expect("a first epoch");
        assert!(epoch > last, "failover {n}: epoch {epoch} after {last}");
        epochs.push((epoch, ports[other]));

        // The old leader comes back and stands by.
        match kind {
            Kind::Kill => p.start_again(leader).await,
            Kind::Term => {
                let status = p.exited(leader).await;
                assert!(status.success(), "failover {n}: SIGTERM ended it {status}");
                p.start_again(leader).await;
            }
            Kind::Stop => p.signal(leader, Signal::SIGCONT),
        }
        p.until_leading(
            leader,
            false,
            &format!("failover {n}: the old leader stands by"),
        )
        .await;
        poll(
            T,
            LOOK,
            &format!("failover {n}: the agents parked on the old leader"),
            || {
                let ok = p
                    .parked_counts(leader)
                    .iter()
                    .zip(&parked_before)
                    .all(|(now, was)| now > was);
                async move { ok }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", p.logs()));
        leader = other;
    }
    let failovers_took = run_start.elapsed();
    stop_jobs.send_replace(true);
    jobs.await.expect("the job task");
    for job in &flip_jobs {
        judge(&book, job).await;
    }

    // No unit of the dependencies in use stopped, ever.
    for ((node, unit), was) in STEADY.iter().zip(&before) {
        let now = identity(&p.c, node, unit).await;
        assert_eq!(
            &now,
            was,
            "{unit} on {node} was stopped or restarted by a failover (ActiveState, \
             InvocationID, ActiveEnter, ActiveExit)\n{}",
            p.logs()
        );
    }

    // No dependency unit leaked: with the churned requesters stopped, the
    // nodes run the proxies and dep units of the steady requesters only.
    for (node, unit) in CHURN {
        p.c.systemctl_ok(node, &["stop", unit]).await;
    }
    let want: BTreeMap<&str, Vec<String>> = NODES
        .iter()
        .map(|node| {
            let mut units: Vec<String> = STEADY
                .iter()
                .filter(|(n, u)| n == node && u.starts_with("drover-"))
                .map(|(_, u)| (*u).to_owned())
                .collect();
            units.sort();
            (*node, units)
        })
        .collect();
    let settle = Instant::now();
    let settled = poll(
        SETTLE,
        Duration::from_millis(200),
        "no dep unit leaked",
        || async {
            let mut all = true;
            for node in NODES {
                all &= drover_units(&p.c, node).await == want[node];
            }
            all
        },
    )
    .await;
    if let Err(e) = settled {
        let mut now = String::new();
        for node in NODES {
            now.push_str(&format!("{node}: {:?}\n", drover_units(&p.c, node).await));
        }
        panic!("{e}\nwanted {want:?}\nrunning:\n{now}{}", p.logs());
    }
    let settled_after = settle.elapsed();

    // Every job a manager accepted ended once (or went with its SIGKILLed manager).
    let issued = lock(&book.issued).clone();
    let killed = lock(&book.killed).clone();
    for job in &issued {
        let removals = book.removals(&job.issuer, &job.path);
        let ok = removals.len() == 1 || (removals.is_empty() && killed.contains(&job.issuer));
        assert!(
            ok,
            "{job}: {} JobRemoved ({removals:?}); its manager was {}killed",
            removals.len(),
            if killed.contains(&job.issuer) {
                ""
            } else {
                "not "
            }
        );
    }
    let failures = lock(&book.failures).clone();
    assert!(failures.is_empty(), "{failures:#?}\n{}", p.logs());

    // No agent obeyed a lower epoch; each registration names a leader's epoch.
    let leaders: BTreeMap<u64, u16> = epochs.iter().copied().collect();
    for log in &p.agent_logs {
        let text = std::fs::read_to_string(log).expect("agent log");
        let regs = registrations(&text);
        assert!(
            regs.len() > FAILOVERS,
            "{}: {} registrations",
            log.display(),
            regs.len()
        );
        for pair in regs.windows(2) {
            assert!(
                pair[1].1 >= pair[0].1,
                "{}: registered with epoch {} after {}",
                log.display(),
                pair[1].1,
                pair[0].1
            );
        }
        for (port, epoch) in &regs {
            assert_eq!(
                leaders.get(epoch),
                Some(port),
                "{}: registered with 127.0.0.1:{port} at epoch {epoch}, which no manager led \
                 with there",
                log.display()
            );
        }
    }

    let summary = |m: &BTreeMap<Kind, Vec<Duration>>| {
        m.iter()
            .map(|(k, v)| {
                format!(
                    "{k:?} ×{}: median {:?}, max {:?}",
                    v.len(),
                    median(v.clone()),
                    v.iter().max().copied().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let refusing: usize = p
        .agent_logs
        .iter()
        .map(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .matches("refusing the manager at")
                .count()
        })
        .sum();
    eprintln!(
        "{FAILOVERS} failovers in {failovers_took:?} (with setup)\n\
         new leader after: {}\n\
         every node online on it after: {}\n\
         jobs accepted: {} ({:?}); refused or unanswered: {:?}\n\
         leftover deps and proxies gone {settled_after:?} after the churned requesters stopped\n\
         epochs {} → {}; agents refused a lower epoch {refusing} times",
        summary(&led_after),
        summary(&followed_after),
        issued.len(),
        lock(&book.results).clone(),
        lock(&book.refused).clone(),
        epochs.first().map(|e| e.0).unwrap_or_default(),
        epochs.last().map(|e| e.0).unwrap_or_default(),
    );
    for h in hearers {
        h.abort();
    }
    let Pair { c, b, .. } = p;
    drop(b);
    c.down().await;
    drop(etcd);
}
