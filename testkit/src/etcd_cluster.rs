//! [`EtcdCluster`]: a real etcd cluster of several members (Debian's
//! `etcd-server`) on free loopback ports, each with its data in a temp dir
//! of its own: what a production HA group runs for etcd's own
//! availability. A member can be killed and started again on the same
//! ports and data (it rejoins). Every member is killed and every directory
//! removed on drop, also when a test fails or the start does.

use crate::process::{ChildGuard, TempDir, free_port};
use crate::wait::eventually;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the cluster may take to serve after its members start.
pub const UP: Duration = Duration::from_secs(30);

struct Member {
    // Before `dir`: the process goes before its data.
    child: Option<ChildGuard>,
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: TempDir,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// See the module docs.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
}

impl EtcdCluster {
    /// Starts `n` members as one new cluster and waits until every one
    /// answers `/health` as healthy (a leader elected, the member in it).
    pub async fn start(n: usize) -> EtcdCluster {
        assert!(n >= 1, "a cluster of no member");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                child: None,
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                dir: TempDir::new("drover-etcd-member"),
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            token: format!("drover-test-{}", std::process::id()),
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.until_healthy(i).await;
        }
        cluster
    }

    /// Every member's client URL, as `EtcdEndpoints=` takes them.
    pub fn urls(&self) -> String {
        self.members
            .iter()
            .map(Member::client_url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        self.members[i].client_url()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// SIGKILL member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            child.kill();
        }
    }

    /// Starts member `i` again on its ports and data; waits until it is
    /// healthy in the cluster.
    pub async fn resume(&mut self, i: usize) {
        self.spawn(i);
        self.until_healthy(i).await;
    }

    /// Which member leads etcd's own raft now, by each live member's
    /// `/v3/maintenance/status` (its `leader` is its own `member_id`);
    /// `None` while none says so.
    pub async fn raft_leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let host = format!("127.0.0.1:{}", m.client_port);
            let head = format!(
                "POST /v3/maintenance/status HTTP/1.1\r\nHost: {host}\r\n\
                 Content-Type: application/json\r\nContent-Length: 2\r\n\
                 Connection: close\r\n\r\n{{}}"
            );
            let Ok(answer) = crate::http::request(&host, &head).await else {
                continue;
            };
            let field = |name: &str| {
                let at = answer.body.find(&format!("\"{name}\":\""))? + name.len() + 4;
                let rest = &answer.body[at..];
                Some(rest[..rest.find('"')?].to_string())
            };
            if field("leader").is_some() && field("leader") == field("member_id") {
                return Some(i);
            }
        }
        None
    }

    /// What member `i` logged so far.
    pub fn log(&self, i: usize) -> String {
        self.members[i].dir.read("etcd.log")
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        assert!(m.child.is_none(), "member {i} is running already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.join("etcd.log"))
            .expect("etcd log file");
        let child = Command::new("etcd")
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", m.dir.join("data").display()))
            .arg(format!("--listen-client-urls={}", m.client_url()))
            .arg(format!("--advertise-client-urls={}", m.client_url()))
            .arg(format!("--listen-peer-urls={}", m.peer_url()))
            .arg(format!("--initial-advertise-peer-urls={}", m.peer_url()))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg("--initial-cluster-state=new")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run etcd (Debian package etcd-server, scripts/host-deps)");
        self.members[i].child = Some(ChildGuard::new(child));
    }

    async fn until_healthy(&self, i: usize) {
        let health = format!("{}/health", self.members[i].client_url());
        eventually(UP, &format!("etcd member {i} is healthy"), || async {
            crate::http::get(&health)
                .await
                .is_ok_and(|a| a.status == 200 && a.body.contains("true"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\netcd member {i}'s log:\n{}", self.log(i)));
    }
}
