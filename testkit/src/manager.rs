//! [`FakeManager`]: the manager's end of drover's wire protocol, for tests of a real agent.
//! It listens on loopback; each [`FakeManager::accept`] takes the agent's next connection,
//! checks the node name in its `Hello` and accepts it with a chosen session id. The
//! [`ManagerSession`] then reads what the agent sends and sends it requests and notices.

use drover_protocol::handshake::Accepted;
use drover_protocol::link::{ManagerFramed, manager_read_hello};
use drover_protocol::{ToAgent, ToManager};
use futures::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// See the module docs.
pub struct FakeManager {
    listener: TcpListener,
}

impl FakeManager {
    /// Listens on 127.0.0.1 on a free port.
    pub async fn bind() -> FakeManager {
        FakeManager {
            listener: TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind the fake manager"),
        }
    }

    /// The port agents connect to.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().expect("local address").port()
    }

    /// Accepts the agent's next connection as node `node` with session id `session_id`
    /// (heartbeats every second expected from the agent, none required from us).
    pub async fn accept(&self, node: &str, session_id: u64, timeout: Duration) -> ManagerSession {
        let accepted = Accepted {
            session_id,
            heartbeat_interval_ms: 1000,
            heartbeat_threshold_ms: 0,
            manager_version: "fake".into(),
            resync_interval_ms: 0,
            epoch: 0,
        };
        self.accept_with(node, accepted, timeout).await
    }

    pub async fn accept_with(
        &self,
        node: &str,
        accepted: Accepted,
        timeout: Duration,
    ) -> ManagerSession {
        let (sock, _) = tokio::time::timeout(timeout, self.listener.accept())
            .await
            .unwrap_or_else(|_| panic!("no agent connected within {timeout:?}"))
            .expect("accept");
        let (pending, hello) = manager_read_hello(sock, timeout)
            .await
            .expect("the agent's hello");
        assert_eq!(hello.node, node, "the agent's node name");
        let framed = pending
            .accept(accepted, timeout)
            .await
            .expect("accept the agent");
        ManagerSession { framed }
    }
}

/// One accepted agent connection. Dropping it closes the connection.
pub struct ManagerSession {
    framed: ManagerFramed<TcpStream>,
}

impl ManagerSession {
    /// The next message within `timeout`: `None` on timeout, `Some(None)` once the agent
    /// closed the session (or broke the framing).
    pub async fn recv(&mut self, timeout: Duration) -> Option<Option<ToManager>> {
        match tokio::time::timeout(timeout, self.framed.next()).await {
            Err(_) => None,
            Ok(Some(Ok(m))) => Some(Some(m)),
            Ok(None | Some(Err(_))) => Some(None),
        }
    }

    /// The next message for which `pred` holds (others, heartbeats included, skipped).
    pub async fn expect(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&ToManager) -> bool,
    ) -> ToManager {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Some(Some(m)) if pred(&m) => return m,
                Some(Some(_)) => continue,
                Some(None) => panic!("the agent's session ended before {what}"),
                None => panic!("no {what} from the agent within {timeout:?}"),
            }
        }
    }

    /// A message for which `pred` holds within `within`, if one comes (others skipped);
    /// panics if the session ends.
    pub async fn maybe(
        &mut self,
        within: Duration,
        pred: impl Fn(&ToManager) -> bool,
    ) -> Option<ToManager> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Some(Some(m)) if pred(&m) => return Some(m),
                Some(Some(_)) => continue,
                Some(None) => panic!("the agent's session broke"),
                None => return None,
            }
        }
    }

    /// Reads until the agent closes the session (within `timeout`); panics on a message
    /// for which `forbidden` holds.
    pub async fn until_closed(
        &mut self,
        timeout: Duration,
        forbidden: impl Fn(&ToManager) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Some(Some(m)) if forbidden(&m) => panic!("the agent sent {m:?}"),
                Some(Some(_)) => continue,
                Some(None) => return,
                None => panic!("the agent's session did not end within {timeout:?}"),
            }
        }
    }

    /// Sends `msg` to the agent.
    pub async fn send(&mut self, msg: ToAgent) {
        self.framed.send(msg).await.expect("send to the agent");
    }
}
