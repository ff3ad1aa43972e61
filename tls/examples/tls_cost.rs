//! What mutual TLS costs the manager, measured on loopback (not a test):
//!
//! 1. CPU per full mutual handshake: manager and agent each on their own
//!    thread and current-thread runtime, thread CPU time around the
//!    handshake (the manager's includes verifying the client certificate and
//!    reading its identity), sequential handshakes, median and p90.
//! 2. Memory one established connection holds on the manager: heap bytes
//!    live (a counting allocator) and RSS, before and after accepting N
//!    connections whose clients live in a child process; the same for plain
//!    TCP, so the TLS share shows on its own.
//!
//! `cargo run --release -p drover-tls --example tls_cost [HANDSHAKES [CONNECTIONS]]`

// A counting global allocator and a per-thread CPU clock need `unsafe`; this is a
// measuring tool, not shipped code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use drover_protocol::NodeName;
use drover_tls::pki::{Options, Pki, Validity};
use drover_tls::{Acceptor, ClientSettings, Connector, ServerSettings, peer_identity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above, that is from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: `ptr` came from the system allocator, as for `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn rss_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: i64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn node() -> NodeName {
    NodeName::new("node1").unwrap()
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1e6
}

fn main() {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some("clients") {
        return clients(args.collect());
    }
    let handshakes: usize = first.map_or(2000, |a| a.parse().unwrap());
    let connections: usize = args.next().map_or(1000, |a| a.parse().unwrap());

    let dir = std::env::temp_dir().join(format!("drover-tls-cost-{}", std::process::id()));
    let pki = Pki::new(&dir);
    let options = Options {
        validity: Validity::days(1).unwrap(),
        force: true,
    };
    pki.create_ca(&options).unwrap();
    pki.issue_manager(&["localhost"], &options).unwrap();
    pki.issue_node(&node(), &options).unwrap();

    cpu_per_handshake(&pki, handshakes);
    // Plain first: RSS only grows once, so the second run would reuse pages.
    memory_per_connection(&pki, connections, false);
    memory_per_connection(&pki, connections, true);
    let _ = std::fs::remove_dir_all(&dir);
}

fn cpu_per_handshake(pki: &Pki, n: usize) {
    let acceptor = Acceptor::new(ServerSettings::load(&pki.manager_files()).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let server = std::thread::spawn(move || {
        runtime().block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            let mut cpu = Vec::with_capacity(n);
            for _ in 0..n {
                let (tcp, _) = listener.accept().await.unwrap();
                tcp.set_nodelay(true).unwrap();
                let start = thread_cpu();
                let mut tls = acceptor.accept(tcp).await.unwrap();
                let id = peer_identity(&tls).unwrap();
                cpu.push(thread_cpu() - start);
                assert_eq!(id.node().as_str(), "node1");
                tls.write_all(b"k").await.unwrap();
                tls.flush().await.unwrap();
            }
            cpu
        })
    });
    let connector = Connector::new(
        ClientSettings::load(&pki.node_files(&node())).unwrap(),
        "localhost",
    )
    .unwrap();
    let (client_cpu, wall) = runtime().block_on(async move {
        let mut cpu = Vec::with_capacity(n);
        let mut wall = Vec::with_capacity(n);
        for _ in 0..n {
            let started = Instant::now();
            let tcp = TcpStream::connect(addr).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let start = thread_cpu();
            let mut tls = connector.connect(tcp).await.unwrap();
            let mut byte = [0u8];
            tls.read_exact(&mut byte).await.unwrap();
            cpu.push(thread_cpu() - start);
            wall.push(started.elapsed());
        }
        (cpu, wall)
    });
    let mut server_cpu = server.join().unwrap();
    let (mut client_cpu, mut wall) = (client_cpu, wall);
    for v in [&mut server_cpu, &mut client_cpu, &mut wall] {
        v.sort();
    }
    println!("full mutual TLS 1.3 handshakes on loopback, ECDSA P-256, n = {n}");
    for (what, v) in [
        ("manager CPU", &server_cpu),
        ("agent CPU", &client_cpu),
        ("wall, connect to first byte", &wall),
    ] {
        println!(
            "  {what:<28} median {:>7.0} µs   p90 {:>7.0} µs",
            percentile(v, 50),
            percentile(v, 90)
        );
    }
}

/// Accepts `n` connections from a child process and reports what holding
/// them costs the accepting process.
fn memory_per_connection(pki: &Pki, n: usize, tls: bool) {
    let acceptor = Acceptor::new(ServerSettings::load(&pki.manager_files()).unwrap());
    let rt = runtime();
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "clients",
            &addr.to_string(),
            &n.to_string(),
            if tls { "tls" } else { "plain" },
            pki.dir().to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();

    // Warm up allocator and runtime with one connection held, then measure.
    let (heap0, rss0) = (LIVE.load(Ordering::Relaxed), rss_bytes());
    let mut tls_conns = Vec::with_capacity(n);
    let mut tcp_conns = Vec::with_capacity(n);
    rt.block_on(async {
        for _ in 0..n {
            let (tcp, _) = listener.accept().await.unwrap();
            if tls {
                let mut s = acceptor.accept(tcp).await.unwrap();
                let id = peer_identity(&s).unwrap();
                s.write_all(b"k").await.unwrap();
                s.flush().await.unwrap();
                tls_conns.push((s, id));
            } else {
                let mut tcp = tcp;
                tcp.write_all(b"k").await.unwrap();
                tcp_conns.push(tcp);
            }
        }
    });
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let (heap1, rss1) = (LIVE.load(Ordering::Relaxed), rss_bytes());
    drop(tls_conns);
    drop(tcp_conns);
    let (heap2, rss2) = (LIVE.load(Ordering::Relaxed), rss_bytes());
    drop(child.stdin.take());
    child.wait().unwrap();
    let per = |a: i64, b: i64| (b - a) as f64 / n as f64 / 1024.0;
    println!(
        "{n} established {} connections held by the accepting process:",
        if tls {
            "TLS (drover_tls::ServerStream + NodeIdentity)"
        } else {
            "plain TCP (tokio TcpStream)"
        }
    );
    println!(
        "  heap  {:>6.2} KiB per connection (after closing all: {:+.2} KiB per connection left)",
        per(heap0 as i64, heap1 as i64),
        per(heap0 as i64, heap2 as i64)
    );
    println!(
        "  RSS   {:>6.2} KiB per connection (after closing all: {:+.2} KiB per connection left)",
        per(rss0, rss1),
        per(rss0, rss2)
    );
}

/// Child: opens `n` connections, completes each (TLS or plain), holds them
/// until stdin closes.
fn clients(args: Vec<String>) {
    let [addr, n, mode, dir] = <[String; 4]>::try_from(args).unwrap();
    let n: usize = n.parse().unwrap();
    let pki = Pki::new(dir);
    let connector = Connector::new(
        ClientSettings::load(&pki.node_files(&node())).unwrap(),
        "localhost",
    )
    .unwrap();
    let rt = runtime();
    let held = rt.block_on(async {
        let mut held_tls = Vec::new();
        let mut held_tcp = Vec::new();
        for _ in 0..n {
            let tcp = TcpStream::connect(&addr).await.unwrap();
            let mut byte = [0u8];
            if mode == "tls" {
                let mut tls = connector.connect(tcp).await.unwrap();
                tls.read_exact(&mut byte).await.unwrap();
                held_tls.push(tls);
            } else {
                let mut tcp = tcp;
                tcp.read_exact(&mut byte).await.unwrap();
                held_tcp.push(tcp);
            }
        }
        (held_tls, held_tcp)
    });
    println!("ready");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(held);
}
