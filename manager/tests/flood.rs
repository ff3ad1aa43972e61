//! Bounded work before authentication, on the real `drover-manager` binary
//! with TLS: 2,000 connections that each announce and send a 1 MiB first
//! frame, and 2,000 that start a TLS record and never finish the handshake,
//! from 8 loopback addresses. The manager's peak RSS stays within
//! `RSS_BOUND` of its idle RSS, it settles back after the flood, and an
//! agent from another address registers over TLS while the flood is on
//! (trying again after a failed attempt, as the real agent does).

mod common;

use common::*;
use drover_testkit::agent::AgentOptions;
use drover_testkit::process::ChildGuard;
use drover_tls::pki::{Options, Pki, Validity};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const BIN: &str = env!("CARGO_BIN_EXE_drover-manager");
/// Growth of the manager's peak RSS over idle that the flood may cause.
const RSS_BOUND_KIB: u64 = 40 * 1024;
const JUNK: usize = 2000;
const STALLED: usize = 2000;
/// "During the flood" on a loaded 2-core test machine (about a second when idle:
/// every place is taken by stalled handshakes until they ripen).
const REGISTER_WITHIN: Duration = Duration::from_secs(15);

fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("status field")
}

async fn from(i: usize, addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::from((
        [127, 0, 0, 2 + (i % 8) as u8],
        0,
    )))?;
    socket.connect(addr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_and_stalled_handshakes_cost_bounded_memory_and_agents_still_register() {
    let setup = BinarySetup::new("");
    let pki = Pki::new(setup.tmp.join("pki"));
    let opts = Options {
        validity: Validity::days(1).unwrap(),
        force: false,
    };
    pki.create_ca(&opts).unwrap();
    pki.issue_manager(&["127.0.0.1"], &opts).unwrap();
    pki.issue_node(&node_name("node1"), &opts).unwrap();
    let conf = setup.tmp.file(
        "tls.conf",
        &format!(
            "[drover-manager]\nAllowedNodeNames=node1\nLogTarget=stderr\nListenAddress=127.0.0.1\n\
             TLSCertificate={}\nTLSPrivateKey={}\nTLSCertificateAuthority={}\nTLSRevocationList={}\n",
            pki.manager_certificate().display(),
            pki.manager_key().display(),
            pki.ca_certificate().display(),
            pki.crl().display()
        ),
    );
    let child = Command::new(BIN)
        .args(["--no-default-config", "--bus", setup.bus.address()])
        .args(["-p", &setup.port.to_string(), "-c"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::from(setup.log()))
        .spawn()
        .expect("spawn drover-manager");
    let pid = child.id();
    let _proc = ChildGuard::new(child);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", setup.port).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "manager up:\n{}", setup.logged());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle = status_kib(pid, "VmRSS:");

    // Stalled: a TLS record header announcing a ClientHello, then nothing.
    let mut stalled = Vec::new();
    for i in 0..STALLED {
        if let Ok(mut s) = from(i, addr).await {
            let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
            stalled.push(s);
        }
    }
    // Junk: a drover frame header announcing 1 MiB, then the MiB.
    let junk: Vec<_> = (0..JUNK)
        .map(|i| {
            tokio::spawn(async move {
                if let Ok(mut s) = from(i + 1, addr).await {
                    let mut frame = (1u32 << 20).to_be_bytes().to_vec();
                    frame.resize(4 + (1 << 20), 0xab);
                    let _ = s.write_all(&frame).await;
                }
            })
        })
        .collect();

    // Meanwhile an agent, from its own address, registers over TLS. Like the
    // real agent it tries again when an attempt fails: an attempt can time
    // out in the lobby (5 s, as the agent's) or be evicted if the agent waits
    // more than the gate's 1 s to answer (`nodes/gate.rs`) on a loaded host.
    let started = Instant::now();
    let files = pki.node_files(&node_name("node1"));
    let mut failed = Vec::new();
    let agent = loop {
        let attempt = FakeAgent::connect_with(
            addr,
            "node1",
            reply_empty(),
            AgentOptions {
                tls: Some(
                    drover_tls::Connector::new(
                        drover_tls::ClientSettings::load(&files).unwrap(),
                        "127.0.0.1",
                    )
                    .unwrap(),
                ),
                ..AgentOptions::default()
            },
        )
        .await;
        match attempt {
            Ok(agent) => break agent,
            Err(e) => failed.push(format!("{:?}: {e}", started.elapsed())),
        }
        assert!(
            started.elapsed() < REGISTER_WITHIN,
            "the agent never registered during the flood: {failed:?}\n{}",
            setup.logged()
        );
    };
    let registered_in = started.elapsed();
    for j in junk {
        j.await.unwrap();
    }
    let peak = status_kib(pid, "VmHWM:");
    drop(stalled);
    drop(agent);
    // Settled: the stalled ones are closed, the manager's tickets freed. The
    // manager notices the closes when its tasks next run, so poll (bounded).
    let settle_by = Instant::now() + Duration::from_secs(10);
    let mut after = status_kib(pid, "VmRSS:");
    while after >= idle + RSS_BOUND_KIB / 2 && Instant::now() < settle_by {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = status_kib(pid, "VmRSS:");
    }
    eprintln!(
        "idle RSS {idle} KiB, peak {peak} KiB (+{} KiB), after {after} KiB; agent registered in \
         {registered_in:?}, failed attempts before: {failed:?}",
        peak.saturating_sub(idle)
    );
    assert!(
        peak.saturating_sub(idle) < RSS_BOUND_KIB,
        "peak RSS {peak} KiB vs idle {idle} KiB"
    );
    assert!(
        after < idle + RSS_BOUND_KIB / 2,
        "RSS after the flood {after} KiB vs idle {idle} KiB"
    );
    let log = setup.logged();
    assert!(
        log.contains("suppressed") || log.lines().count() < 200,
        "refusal logs are rate-limited: {} lines",
        log.lines().count()
    );
}
