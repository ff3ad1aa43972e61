//! `HealthTCP=` and `HealthHTTP=`: one run, in the agent's own process.
//!
//! * **TCP**: a connect to `HOST:PORT` succeeds within the timeout (a name
//!   is resolved on every run; the first address that accepts wins).
//! * **HTTP**: `GET TARGET HTTP/1.1` with `Host:`, `Connection: close` and
//!   `User-Agent: drover-agent`; the answer's status line decides (2xx
//!   passes). Only the status line is read (at most [`STATUS_LINE_MAX`]
//!   bytes), never the body, and the whole exchange has the timeout.
//!
//! Why a hand-written GET and not an HTTP client crate: the check needs one
//! request and the first line of one answer, over plain http to a service
//! on the node. hyper (with hyper-util for a client) or reqwest would add a
//! dozen crates and a connection pool the agent does not want; ureq is
//! blocking. The ~50 lines below follow RFC 9112 for exactly that
//! exchange, and the tests run them against a real server (and garbage).

use super::machine::Outcome;
use drover_config::health::HttpUrl;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest status line read.
pub const STATUS_LINE_MAX: usize = 1024;

fn span(d: Duration) -> String {
    drover_config::timespan::format(d)
}

/// Connects to `host:port` within `timeout`.
async fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let address = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("connect to {address}: {e}")),
        Err(_) => Err(format!(
            "connect to {address}: no answer within {}",
            span(timeout)
        )),
    }
}

/// `HealthTCP=`.
pub async fn tcp(host: &str, port: u16, timeout: Duration) -> Outcome {
    match connect(host, port, timeout).await {
        Ok(_) => Outcome::Pass(String::new()),
        Err(why) => Outcome::Fail(why),
    }
}

/// `HealthHTTP=`.
pub async fn http(url: &HttpUrl, timeout: Duration) -> Outcome {
    let deadline = tokio::time::Instant::now() + timeout;
    let exchange = async {
        let mut stream = connect(&url.host, url.port, timeout).await?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: drover-agent\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            url.target, url.authority
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("sending the request to {}: {e}", url.authority))?;
        let line = status_line(&mut stream)
            .await
            .map_err(|e| format!("reading the answer of {}: {e}", url.authority))?;
        Ok::<String, String>(line)
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Err(_) => Outcome::Fail(format!(
            "GET http://{}{}: no answer within {}",
            url.authority,
            url.target,
            span(timeout)
        )),
        Ok(Err(why)) => Outcome::Fail(why),
        Ok(Ok(line)) => match status_code(&line) {
            Some(code) if (200..300).contains(&code) => Outcome::Pass(line),
            Some(_) => Outcome::Fail(format!(
                "GET http://{}{}: {line}",
                url.authority, url.target
            )),
            None => Outcome::Fail(format!(
                "GET http://{}{}: not an HTTP answer: {}",
                url.authority,
                url.target,
                line.escape_debug()
            )),
        },
    }
}

/// The answer's first line, without its CRLF.
async fn status_line(stream: &mut TcpStream) -> Result<String, String> {
    let mut line: Vec<u8> = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    loop {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            if line.is_empty() {
                return Err("the connection closed without an answer".into());
            }
            break;
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            line.truncate(end);
            break;
        }
        if line.len() > STATUS_LINE_MAX {
            line.truncate(STATUS_LINE_MAX);
            break;
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// The status code of `HTTP/1.x NNN reason`.
fn status_code(line: &str) -> Option<u16> {
    let rest = line.strip_prefix("HTTP/1.")?;
    let mut parts = rest.splitn(3, ' ');
    let minor = parts.next()?;
    if minor.len() != 1 || !minor.as_bytes()[0].is_ascii_digit() {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    code.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn url(port: u16, target: &str) -> HttpUrl {
        HttpUrl {
            host: "127.0.0.1".into(),
            port,
            authority: format!("127.0.0.1:{port}"),
            target: target.into(),
        }
    }

    /// A server that answers each connection with `answer` and returns the
    /// requests it read.
    async fn server(answer: &'static [u8]) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer).await.unwrap();
            vec![String::from_utf8(req).unwrap()]
        });
        (port, task)
    }

    #[tokio::test]
    async fn two_hundreds_pass_and_the_request_is_plain_http_1_1() {
        let (port, task) = server(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(
            http(&url(port, "/health?x=1"), Duration::from_secs(5)).await,
            Outcome::Pass("HTTP/1.1 204 No Content".into())
        );
        let req = task.await.unwrap().remove(0);
        assert_eq!(
            req,
            format!(
                "GET /health?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: drover-agent\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            )
        );
    }

    #[tokio::test]
    async fn other_codes_garbage_and_silence_fail_with_the_reason() {
        let (port, _t) = server(b"HTTP/1.1 503 Service Unavailable\r\n\r\nbusy").await;
        assert_eq!(
            http(&url(port, "/"), Duration::from_secs(5)).await,
            Outcome::Fail(format!(
                "GET http://127.0.0.1:{port}/: HTTP/1.1 503 Service Unavailable"
            ))
        );
        let (port, _t) = server(b"SSH-2.0-OpenSSH\r\n").await;
        let Outcome::Fail(why) = http(&url(port, "/"), Duration::from_secs(5)).await else {
            panic!("garbage passed")
        };
        assert!(
            why.ends_with("not an HTTP answer: SSH-2.0-OpenSSH"),
            "{why}"
        );
        let (port, _t) = server(b"").await;
        let Outcome::Fail(why) = http(&url(port, "/"), Duration::from_secs(5)).await else {
            panic!("an empty answer passed")
        };
        assert!(why.contains("closed without an answer"), "{why}");
        // Accepts, never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let t0 = std::time::Instant::now();
        let out = http(&url(port, "/"), Duration::from_millis(200)).await;
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(
            out,
            Outcome::Fail(format!(
                "GET http://127.0.0.1:{port}/: no answer within 200ms"
            ))
        );
        drop(listener);
    }

    #[tokio::test]
    async fn tcp_connects_or_says_why() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(
            tcp("127.0.0.1", port, Duration::from_secs(5))
                .await
                .passed()
        );
        assert!(
            tcp("localhost", port, Duration::from_secs(5))
                .await
                .passed()
        );
        drop(listener);
        let Outcome::Fail(why) = tcp("127.0.0.1", port, Duration::from_secs(5)).await else {
            panic!("a closed port passed")
        };
        assert!(
            why.starts_with(&format!("connect to 127.0.0.1:{port}: ")),
            "{why}"
        );
        assert!(why.contains("refused"), "{why}");
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_code("HTTP/1.0 302 Found"), Some(302));
        assert_eq!(status_code("HTTP/1.1 200"), Some(200));
        for bad in [
            "HTTP/2 200 OK",
            "HTTP/1.1 20 OK",
            "HTTP/1.1 2000 OK",
            "HTTP/1.x 200",
            "",
            "200 OK",
        ] {
            assert_eq!(status_code(bad), None, "{bad}");
        }
    }
}
