//! Bad input at every entry point gets a clear error and changes nothing:
//! the agent TCP port, the public D-Bus API, droverctl's arguments.

use drover_testkit::api::job_call;
use drover_testkit::prelude::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn all_online(c: &TestCluster) -> bool {
    let nodes = c.api().await.list_nodes().await;
    nodes.iter().all(|(_, s, _)| s == "online")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_agent_port_leaves_the_manager_serving() {
    let mut c = TestCluster::start(2).await;
    let addr = ("127.0.0.1", c.manager_port());

    // An HTTP request, random bytes, a huge length header, half a frame and silence,
    // a frame that claims to be a handshake from another protocol version.
    let mut inputs: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect(),
        vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3],
        vec![0, 0, 0, 100, b'D', b'R'],
    ];
    let mut other_version = b"DRVR".to_vec();
    other_version.push(77); // postcard varint u32 = 77
    inputs.push(
        [
            &(other_version.len() as u32).to_be_bytes()[..],
            &other_version,
        ]
        .concat(),
    );

    for input in &inputs {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(input).await;
        // The manager answers (a refusal) or closes; it never hangs forever.
        let mut buf = vec![0u8; 4096];
        let res = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(
            res.is_ok(),
            "manager closed the connection after {:?}",
            &input[..input.len().min(8)]
        );
    }
    // Many idle connections that never speak don't stop registration of others.
    // They come from another address than the agents (127.0.0.1): one address
    // may hold only 16 unauthenticated connections, so a silent flood from one
    // peer never locks out the others (from the agents' own address it would
    // delay them by up to one handshake timeout).
    let idle: Vec<TcpStream> = futures::future::join_all((0..50).map(|_| async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::from(([127, 0, 0, 2], 0)))?;
        socket
            .connect(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                c.manager_port(),
            )))
            .await
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();

    assert!(all_online(&c).await);
    c.stop_agent("node2").await.unwrap();
    c.start_agent("node2").await.unwrap();
    c.wait_status("node2", "online", Duration::from_secs(10))
        .await;
    drop(idle);
    c.ctl_ok(&["list-units", "node1"]).await;
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_dbus_arguments_get_errors_and_change_nothing() {
    let c = TestCluster::start(1).await;
    let (api, n, mut jobs) = c.jobs_on("node1").await;

    for bad in [
        "",
        "no-suffix",
        "a b.service",
        "../../etc/passwd.service",
        "x.nope",
        &"y".repeat(300),
    ] {
        let err = job_call(&n, "StartUnit", bad).await.unwrap_err();
        assert!(err.to_string().contains("InvalidArgs"), "{bad:?}: {err}");
    }
    // Wrong signature: zbus/the bus rejects it before our code runs.
    let err = n
        .call::<_, _, zbus::OwnedObjectPath>("StartUnit", &(1u32,))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("InvalidArgs") || err.to_string().contains("signature"),
        "{err}"
    );
    let err = api.get_node("no_such node").await.unwrap_err();
    assert!(err.to_string().contains("ServiceUnknown"), "{err}");

    // No job was created by any of that, and the node is fine.
    jobs.no_more_removed("/org/eclipse/bluechi/job/1", Duration::from_millis(300))
        .await
        .unwrap();
    c.install("node1", "quick.service", ONESHOT_OK).await;
    let path = job_call(&n, "StartUnit", "quick.service").await.unwrap();
    assert_eq!(
        path, "/org/eclipse/bluechi/job/1",
        "bad calls consumed no job id"
    );
    assert_eq!(
        jobs.removed(&path, Duration::from_secs(10))
            .await
            .unwrap()
            .result,
        "done"
    );
    c.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn droverctl_rejects_bad_arguments_clearly() {
    let c = TestCluster::start(1).await;
    let cases: &[(&[&str], i32)] = &[
        (&[], 2),
        (&["frobnicate"], 2),
        (&["start", "node1"], 2),
        (&["start", "node1", "a.service", "extra"], 2),
        (&["start", "bad_node", "a.service"], 2),
        (&["start", "node1", "a b.service"], 2),
        (&["list-units", "--nope"], 2),
        (&["status", "ghost"], 1),
        (&["start", "ghost", "a.service"], 1),
    ];
    for (args, code) in cases {
        let out = c.run(args).await;
        assert_eq!(out.code, *code, "droverctl {args:?}: {}", out.stderr);
        assert!(!out.stderr.is_empty(), "droverctl {args:?} explains itself");
    }
    // An unreachable manager is one clear line, exit 1.
    let out = Ctl::env("unix:path=/nonexistent/drover-bus")
        .run(&["status"])
        .await;
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("drover-manager"), "{}", out.stderr);
    assert!(all_online(&c).await);
    c.down().await;
}
