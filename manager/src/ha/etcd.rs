//! [`Etcd`]: the few calls of etcd's v3 JSON gateway the election makes
//! (lease grant, keepalive, time-to-live and revoke, the campaign
//! transaction, a read of the leader key, a watch),
//! as HTTP/1.1 `POST`s over hyper's client connection, one connection per
//! call (a few calls per lease period; no pool to go stale across an etcd
//! restart).
//!
//! Why the gateway and not the `etcd-client` crate (gRPC): that crate needs
//! `protoc` to build and brings about 75 crates; the gateway needs hyper
//! (already linked for the metrics endpoint, plus its client half),
//! serde_json and base64, and speaks the same API (docs/dev/ha.md).
//!
//! TLS: `https://` endpoints are dialled with etcd's mutual TLS (rustls,
//! the manager's client certificate from `EtcdTLS…`, etcd's certificate
//! checked against that CA bundle and the endpoint's host). An `http://`
//! endpoint that answers with TLS's "HTTP request to an HTTPS server" is
//! reported as such, not as garbage.
//!
//! Bounds: every call has a deadline (the caller's), an answer body is
//! read up to [`MAX_BODY`] bytes, a watch message up to [`MAX_BODY`] too;
//! more is an error, never a growing buffer. Endpoints are tried in turn
//! from the last one that answered.

use crate::ha::wire::{self, Campaign, Lease, Watched, WireError};
use bytes::{Buf, Bytes, BytesMut};
use drover_config::ha::EtcdEndpoint;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The most bytes one answer (or one watch message) may take.
pub const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("{endpoint}: {detail}")]
    Transport { endpoint: String, detail: String },
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("no etcd endpoint answered within {0:?}")]
    Timeout(Duration),
}

/// See the module docs.
pub struct Etcd {
    endpoints: Vec<EtcdEndpoint>,
    /// For `https://` endpoints (`drover_tls::settings::service_client_config`).
    tls: Option<TlsConnector>,
    /// Where the next call starts.
    current: AtomicUsize,
}

impl Etcd {
    /// `tls` is etcd's mutual TLS, loaded from the `EtcdTLS…` keys: needed by
    /// `https://` endpoints (the config allows them only with it).
    pub fn new(endpoints: Vec<EtcdEndpoint>, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self {
            endpoints,
            tls: tls.map(TlsConnector::from),
            current: AtomicUsize::new(0),
        }
    }

    pub async fn grant(&self, ttl_s: u64, limit: Duration) -> Result<Lease, EtcdError> {
        let v = self
            .call("/v3/lease/grant", wire::grant_body(ttl_s), limit)
            .await?;
        Ok(wire::parse_grant(v)?)
    }

    /// The lease's TTL from now in seconds; 0 when etcd no longer knows it.
    pub async fn keepalive(&self, id: i64, limit: Duration) -> Result<i64, EtcdError> {
        let v = self
            .call("/v3/lease/keepalive", wire::lease_body(id), limit)
            .await?;
        Ok(wire::parse_keepalive(v)?)
    }

    /// Revokes the lease, and with it the keys it holds. A lease etcd does
    /// not know (expired) counts as revoked.
    pub async fn revoke(&self, id: i64, limit: Duration) -> Result<(), EtcdError> {
        match self
            .call("/v3/lease/revoke", wire::lease_body(id), limit)
            .await
        {
            Ok(_) => Ok(()),
            Err(EtcdError::Wire(WireError::Etcd(m))) if m.contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether the lease lives: its granted TTL in seconds, or `None` when
    /// etcd no longer knows it.
    pub async fn time_to_live(&self, id: i64, limit: Duration) -> Result<Option<u64>, EtcdError> {
        let v = self
            .call("/v3/lease/timetolive", wire::lease_body(id), limit)
            .await?;
        Ok(wire::parse_time_to_live(v)?)
    }

    /// The key now (`None`: absent) and the store's revision.
    pub async fn get(
        &self,
        key: &[u8],
        limit: Duration,
    ) -> Result<(Option<wire::KeyValue>, i64), EtcdError> {
        let v = self
            .call("/v3/kv/range", wire::range_body(key), limit)
            .await?;
        Ok(wire::parse_range(v)?)
    }

    pub async fn campaign(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        limit: Duration,
    ) -> Result<Campaign, EtcdError> {
        let v = self
            .call("/v3/kv/txn", wire::campaign_body(key, value, lease), limit)
            .await?;
        Ok(wire::parse_campaign(v)?)
    }

    /// Watches `key` from `revision` and returns at the first message that
    /// matters (the key deleted, the watch ended by etcd) or when the
    /// stream breaks. Connecting is bounded by `limit`; the watch itself
    /// is not (the caller bounds it).
    pub async fn watch(
        &self,
        key: &[u8],
        revision: i64,
        limit: Duration,
    ) -> Result<Watched, EtcdError> {
        let (endpoint, response) = tokio::time::timeout(
            limit,
            self.open("/v3/watch", wire::watch_body(key, revision)),
        )
        .await
        .map_err(|_| EtcdError::Timeout(limit))??;
        let transport = |detail: String| EtcdError::Transport {
            endpoint: endpoint.clone(),
            detail,
        };
        let mut body = response.into_body();
        let mut buf = BytesMut::new();
        loop {
            while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line = buf.split_to(end + 1);
                let text = &line[..end];
                if text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let v: Value = serde_json::from_slice(text)
                    .map_err(|e| EtcdError::Wire(WireError::Garbage(e.to_string())))?;
                match wire::parse_watch(v)? {
                    Watched::Nothing => {}
                    other => return Ok(other),
                }
            }
            if buf.len() > MAX_BODY {
                return Err(transport(format!("a watch message over {MAX_BODY} bytes")));
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
                Some(Err(e)) => return Err(transport(format!("the watch broke: {e}"))),
                None => return Err(transport("etcd ended the watch stream".into())),
            }
        }
    }

    /// One call: the answer's JSON, whatever its HTTP status (the gateway
    /// puts etcd's error in the body).
    async fn call(&self, path: &str, body: Value, limit: Duration) -> Result<Value, EtcdError> {
        tokio::time::timeout(limit, async {
            let (endpoint, response) = self.open(path, body).await?;
            let status = response.status();
            let bytes = read_bounded(response.into_body()).await.map_err(|detail| {
                EtcdError::Transport {
                    endpoint: endpoint.clone(),
                    detail,
                }
            })?;
            if status == hyper::StatusCode::BAD_REQUEST && speaks_tls(&bytes) {
                return Err(EtcdError::Transport {
                    endpoint,
                    detail: "etcd answered that it speaks TLS: list it as https:// and set \
                             EtcdTLSCertificate, EtcdTLSPrivateKey and \
                             EtcdTLSCertificateAuthority (docs/ha.md)"
                        .into(),
                });
            }
            serde_json::from_slice::<Value>(&bytes).map_err(|_| {
                EtcdError::Wire(WireError::Garbage(format!(
                    "{endpoint} answered HTTP {status} without JSON"
                )))
            })
        })
        .await
        .map_err(|_| EtcdError::Timeout(limit))?
    }

    /// Sends `body` to `path` at the first endpoint that takes it, starting
    /// from the last good one.
    async fn open(
        &self,
        path: &str,
        body: Value,
    ) -> Result<(String, hyper::Response<Incoming>), EtcdError> {
        let body = Bytes::from(body.to_string());
        let start = self.current.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            match self.post(endpoint, path, body.clone()).await {
                Ok(r) => {
                    self.current.store(at, Ordering::Relaxed);
                    return Ok((endpoint.to_string(), r));
                }
                Err(detail) => {
                    last = Some(EtcdError::Transport {
                        endpoint: endpoint.to_string(),
                        detail,
                    })
                }
            }
        }
        Err(last.unwrap_or_else(|| EtcdError::Transport {
            endpoint: "(none)".into(),
            detail: "no etcd endpoint is configured".into(),
        }))
    }
}

impl Etcd {
    /// One request on a new connection to `endpoint` (TLS for `https://`).
    async fn post(
        &self,
        endpoint: &EtcdEndpoint,
        path: &str,
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, String> {
        let authority = endpoint.authority();
        let stream = TcpStream::connect(&authority)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        if !endpoint.tls {
            return send(stream, &authority, path, body).await.map_err(|e| {
                if e.contains("connection closed before message completed") {
                    format!(
                        "{e}: etcd closed the connection without an answer, as an etcd that \
                         serves TLS does to plaintext; if it does, list it as https:// and set \
                         EtcdTLSCertificate, EtcdTLSPrivateKey and EtcdTLSCertificateAuthority \
                         (docs/ha.md)"
                    )
                } else {
                    e
                }
            });
        }
        let Some(tls) = &self.tls else {
            return Err("an https:// endpoint without etcd's TLS keys".into());
        };
        let name = ServerName::try_from(endpoint.host.clone())
            .map_err(|e| format!("'{}' cannot be checked as TLS: {e}", endpoint.host))?;
        let stream = tls
            .connect(name, stream)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(stream, &authority, path, body).await
    }
}

/// `POST path` with `body` over `io` (HTTP/1.1, one request).
async fn send<IO>(
    io: IO,
    authority: &str,
    path: &str,
    body: Bytes,
) -> Result<hyper::Response<Incoming>, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    // Ends when the response is read (or dropped) and the sender is gone.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("etcd connection: {e}");
        }
    });
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("HTTP: {e}"))
}

/// Whether an answer is a TLS server's to a plaintext request (Go's
/// `Client sent an HTTP request to an HTTPS server.`).
fn speaks_tls(body: &[u8]) -> bool {
    body.windows(b"HTTPS server".len())
        .any(|w| w == b"HTTPS server")
}

async fn read_bounded(mut body: Incoming) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > MAX_BODY {
                return Err(format!("an answer over {MAX_BODY} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}
