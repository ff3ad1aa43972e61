//! A plain HTTP/1.1 client for tests of HTTP endpoints (the manager's
//! `/metrics`, a Prometheus server's API): one request per connection
//! (`Connection: close`), read to the end, bounded in time. Also raw byte
//! exchanges for the garbage tests, and the one lookup tests make in a
//! Prometheus text exposition ([`sample`]).

use anyhow::{Context, Result, bail};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one exchange may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// One answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// The head's header lines, as sent.
    pub headers: String,
    pub body: String,
}

impl Answer {
    /// The value of header `name` (case-insensitive), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Splits `http://HOST:PORT/PATH` into (`HOST:PORT`, `/PATH`).
pub fn split_url(url: &str) -> Result<(&str, &str)> {
    let rest = url.strip_prefix("http://").context("not an http:// URL")?;
    Ok(match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    })
}

/// `GET url`.
pub async fn get(url: &str) -> Result<Answer> {
    let (host, path) = split_url(url)?;
    request(
        host,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// Sends `head` (a whole request) to `host` and parses the answer.
pub async fn request(host: &str, head: &str) -> Result<Answer> {
    let bytes = exchange(host, head.as_bytes()).await?;
    let text = String::from_utf8(bytes).context("the answer is not UTF-8")?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("no complete answer head in {text:?}");
    };
    let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    Ok(Answer {
        status,
        headers: headers.to_owned(),
        body: body.to_owned(),
    })
}

/// Writes `bytes` to `host`, then reads until the server closes (within
/// [`TIMEOUT`]); what it sent back, maybe nothing.
pub async fn exchange(host: &str, bytes: &[u8]) -> Result<Vec<u8>> {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = TcpStream::connect(host)
            .await
            .with_context(|| format!("connecting to {host}"))?;
        // The server may close before reading everything (a refused head).
        let _ = s.write_all(bytes).await;
        let mut out = Vec::new();
        match s.read_to_end(&mut out).await {
            Ok(_) => Ok(out),
            // A reset after an answer still counts as the answer.
            Err(_) if !out.is_empty() => Ok(out),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(out),
            Err(e) => Err(e).context("reading the answer"),
        }
    })
    .await
    .with_context(|| format!("{host} did not answer and close within {TIMEOUT:?}"))?
}

/// The value of the series `series` (name and labels exactly as exposed,
/// `drover_nodes{status="online"}`) in a text exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}
