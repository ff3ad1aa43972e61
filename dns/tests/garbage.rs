//! drover-dns against hostile clients, the real binary beside a real
//! manager of a sandbox of `systemd --user` nodes: raw UDP garbage, headers
//! that promise what never comes, names of every shape, every query type,
//! TCP garbage and idle connections. After each barrage `dig` (a real DNS
//! client) still gets the zone's SOA, and the process still runs.

use drover_testkit::prelude::*;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

mod common;
use common::{Dig, dig};

/// A query as a stub resolver sends it: id, RD, one question.
fn query(id: u16, name: &[u8], qtype: u16, qclass: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(name);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&qclass.to_be_bytes());
    q
}

/// `labels` in wire form, ending with the root.
fn wire(labels: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in labels {
        out.push(u8::try_from(l.len()).unwrap());
        out.extend_from_slice(l);
    }
    out.push(0);
    out
}

/// The server answers again (a backlog of garbage may take it a moment to
/// work through: bounded), with the zone's SOA, authoritatively.
async fn still_answers(dns: SocketAddr, after: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut soa = dig(dns, &["drover", "SOA"]).await;
    while soa.status.is_empty() && std::time::Instant::now() < deadline {
        soa = dig(dns, &["drover", "SOA"]).await;
    }
    assert_eq!(soa.status, "NOERROR", "after {after}: {soa:?}");
    assert!(
        soa.flags.contains(&"aa".to_string()),
        "after {after}: {soa:?}"
    );
    assert_eq!(soa.answer.len(), 1, "after {after}: {soa:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_errors_or_nothing_and_never_takes_it_down() {
    let mut c = TestCluster::start(1).await;
    let dns = c.start_dns("TTL=1s\nWhereRate=50").await.unwrap();
    still_answers(dns, "start").await;

    // Raw UDP garbage: empty, short, header only, lying counts, compression loops.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(dns).unwrap();
    let mut garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 11],
        vec![0; 12],
        vec![0x12, 0x34, 0x01, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0],
        vec![0x12, 0x34, 0x01, 0, 0, 1, 0, 0, 0, 0, 0xff, 0xff],
        // A name that points at itself.
        [
            &[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0][..],
            &[0xc0, 12, 0, 1, 0, 1],
        ]
        .concat(),
        // A label that runs past the end.
        [
            &[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0][..],
            &[63, b'a', b'b'],
        ]
        .concat(),
        // A response, not a query (reflection).
        query(7, &wire(&[b"drover"]), 6, 1)
            .into_iter()
            .enumerate()
            .map(|(i, b)| if i == 2 { b | 0x80 } else { b })
            .collect(),
        vec![0xa5; 65_000],
    ];
    // Deterministic noise of every length up to 600 bytes.
    let mut x: u32 = 0x2545_f491;
    for len in 0..600usize {
        garbage.push(
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x.to_le_bytes()[0]
                })
                .collect(),
        );
    }
    for g in &garbage {
        let _ = sock.send(g);
    }
    still_answers(dns, "raw UDP garbage").await;

    // Names of every shape: the longest there is, odd bytes, an upper-case
    // escape, a unit type alone, deep nesting, outside the zone.
    let long: Vec<Vec<u8>> = (0..4).map(|_| vec![b'a'; 61]).collect();
    let mut long_refs: Vec<&[u8]> = long.iter().map(Vec::as_slice).collect();
    long_refs.push(b"drover");
    let odd: [&[&[u8]]; 7] = [
        &[b"web\x00\xff", b"service", b"drover"],
        &[b"_57EB", b"service", b"drover"],
        &[b"service", b"drover"],
        &[
            b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"service", b"drover",
        ],
        &[b"_http", b"_tcp", b"_tcp", b"service", b"drover"],
        &[b"web", b"service", b"example"],
        &[b"@", b"drover"],
    ];
    let mut names: Vec<Vec<u8>> = odd.iter().map(|l| wire(l)).collect();
    names.push(wire(&long_refs));
    for (i, name) in names.iter().enumerate() {
        for qtype in [1u16, 28, 33, 6, 255, 252, 251, 16, 0, 65535] {
            let _ = sock.send(&query(u16::try_from(i).unwrap(), name, qtype, 1));
        }
    }
    // Every query type, once, on a name of the zone.
    let zone_name = wire(&[b"web", b"service", b"drover"]);
    for qtype in 0..=u16::MAX {
        let _ = sock.send(&query(qtype, &zone_name, qtype, 1));
        if qtype % 256 == 0 {
            // Paced so that every query reaches the server instead of
            // overflowing its socket buffer (what is tested is each type).
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    // Every class on the apex.
    for class in [0u16, 2, 3, 4, 254, 255, 65535] {
        let _ = sock.send(&query(class, &wire(&[b"drover"]), 6, class));
    }
    still_answers(dns, "names of every shape and every type").await;

    // What dig says about them.
    let refused = dig(dns, &["web.service.example", "A"]).await;
    assert_eq!(refused.status, "REFUSED", "{refused:?}");
    let chaos = dig(dns, &["-c", "CH", "drover", "SOA"]).await;
    assert_eq!(chaos.status, "REFUSED", "{chaos:?}");
    let axfr = dig(dns, &["drover", "AXFR"]).await;
    assert!(
        axfr.raw.contains("Transfer failed") || axfr.status == "REFUSED",
        "{axfr:?}"
    );
    for name in [
        "web@1.service.drover",
        "_61.service.drover",
        "web.service._.drover",
        "service.drover",
        "x.drover",
    ] {
        let r = dig(dns, &[name, "A"]).await;
        assert_eq!(r.status, "NXDOMAIN", "{name}: {r:?}");
        assert_eq!(r.authority_types(), ["SOA"], "{name}: {r:?}");
    }

    // TCP: garbage, a length that promises more than comes, idle clients.
    {
        use tokio::io::AsyncWriteExt;
        let mut idle = Vec::new();
        for _ in 0..50 {
            idle.push(tokio::net::TcpStream::connect(dns).await.unwrap());
        }
        let mut liar = tokio::net::TcpStream::connect(dns).await.unwrap();
        liar.write_all(&[0xff, 0xff, 1, 2, 3]).await.unwrap();
        let mut noise = tokio::net::TcpStream::connect(dns).await.unwrap();
        let _ = noise
            .write_all(&[0x00, 0x05, 1, 2, 3, 4, 5, 0xde, 0xad])
            .await;
        still_answers(dns, "TCP garbage (UDP)").await;
        let tcp = dig(dns, &["+tcp", "drover", "SOA"]).await;
        assert_eq!(tcp.status, "NOERROR", "{tcp:?}");
    }

    let Dig { status, .. } = dig(dns, &["drover", "SOA"]).await;
    assert_eq!(status, "NOERROR");
    c.down().await;
}
