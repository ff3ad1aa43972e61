//! A plain HTTP/1.1 client for tests of HTTP endpoints (the manager's and
//! the agent's `/metrics`, a Prometheus server's API): one request per
//! connection (`Connection: close`), read to the end, bounded in time. Also
//! raw byte exchanges for the garbage tests (and the garbage both daemons'
//! endpoints get, [`garbage_is_bounded`]), the one lookup tests make in a
//! Prometheus text exposition ([`sample`]), scraping until a series shows
//! what a test waits for ([`scrape_until`]) and the real `promtool check
//! metrics` ([`promtool_check`]).

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

/// Garbage for a `/metrics` endpoint of drover (`drover_metrics::http`), with the
/// answers and bounds its module docs promise: a wrong method is 405, another path
/// 404, `HEAD` and a query string are served; a head too long or with too many
/// headers is refused unbuffered, bytes that are no HTTP get 400; a head that never
/// ends is closed within the head timeout (5 s, well before [`TIMEOUT`]); of 40 idle
/// connections, at least 24 are closed at once (16 served at a time). Panics
/// otherwise. The caller checks that the endpoint still serves afterwards.
pub async fn garbage_is_bounded(url: &str) {
    let (host, _) = split_url(url).expect("an http:// URL");

    let post = request(
        host,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    )
    .await
    .expect("the endpoint answers");
    assert_eq!(post.status, 405, "{post:?}");
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    let other = request(
        host,
        "GET /../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("the endpoint answers");
    assert_eq!(other.status, 404, "{other:?}");
    let head = request(
        host,
        "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("the endpoint answers");
    assert_eq!((head.status, head.body.as_str()), (200, ""), "{head:?}");
    let query = get(&format!("{url}?x=%00"))
        .await
        .expect("the endpoint answers");
    assert_eq!(query.status, 200);

    // Heads too long or with too many headers: refused, never buffered.
    // (1 MiB: the server may close while the client still writes, and the
    // client's socket may then be reset before the answer is read.)
    let long = format!(
        "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let answer = exchange(host, long.as_bytes())
        .await
        .expect("the endpoint answers");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    let many: String = (0..200).map(|i| format!("X-{i}: y\r\n")).collect();
    let answer = exchange(
        host,
        format!("GET /metrics HTTP/1.1\r\n{many}\r\n").as_bytes(),
    )
    .await
    .expect("the endpoint answers");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // Bytes that are no HTTP at all.
    let answer = exchange(host, &[0, 159, 146, 150, 13, 10, 13, 10])
        .await
        .expect("the endpoint answers");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // A head that never ends: closed unanswered by the server within its head timeout
    // (5 s), well before the client's own (`http::TIMEOUT`, which would fail here).
    let answer = exchange(host, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("the endpoint answers");
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));

    // More idle connections than the endpoint serves at once: the extra ones are
    // closed at once, the others when their head times out; then it serves again.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(
            tokio::net::TcpStream::connect(host)
                .await
                .expect("connecting to the endpoint"),
        );
    }
    let mut closed_at_once = 0;
    for s in &mut idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::io::AsyncReadExt::read(s, &mut b),
        )
        .await
        {
            closed_at_once += 1;
        }
    }
    assert!(
        closed_at_once >= 40 - 16,
        "{closed_at_once} of 40 closed at once"
    );
    drop(idle);
}

/// `promtool check metrics` on `text`: (exit success, what it printed).
pub async fn promtool_check(text: &str) -> (bool, String) {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("promtool (Debian package prometheus) is installed");
    let mut stdin = child.stdin.take().expect("promtool's stdin");
    stdin
        .write_all(text.as_bytes())
        .await
        .expect("writing to promtool");
    drop(stdin);
    let out = child.wait_with_output().await.expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Scrapes `url` until `series` shows a value `ok` accepts, within
/// `within`; returns that scrape, or panics with the last one. A
/// connection closed unanswered (an endpoint that is full) is retried; an
/// answer other than 200 panics.
pub async fn scrape_until(
    within: Duration,
    url: &str,
    series: &str,
    ok: impl Fn(f64) -> bool,
) -> String {
    let last = std::sync::Mutex::new(String::new());
    let seen = crate::wait::eventually(within, series, || {
        let (url, last, ok) = (url.to_owned(), &last, &ok);
        async move {
            let text = match get(&url).await {
                Ok(a) if a.status == 200 => a.body,
                Ok(a) => panic!("{a:?}"),
                Err(e) => format!("{e:#}"),
            };
            let hit = sample(&text, series).is_some_and(ok);
            *last.lock().unwrap_or_else(|p| p.into_inner()) = text;
            hit
        }
    })
    .await;
    let last = last.into_inner().unwrap_or_else(|p| p.into_inner());
    assert!(
        seen.is_ok(),
        "{series} never became as wanted; last scrape:\n{last}"
    );
    last
}

/// The value of the series `series` (name and labels exactly as exposed,
/// `drover_nodes{status="online"}`) in a text exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}
