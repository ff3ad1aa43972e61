//! BlueChi's API (and drover's `io.drover.*` additions) as one artifact: every
//! interface a drover object serves — the manager's controller, node, job, monitor and
//! metrics objects, the agent's object on its node's bus — equals the interface XML the
//! packages install (`dist/usr/share/dbus-1/interfaces/` holds `<interface>.xml`, where
//! D-Bus tools and code generators look), exactly: every method, signal and property, each argument's
//! name, type and direction, each property's type and access, every annotation, in
//! order. Every file there is served, and nothing is served without its file.
//!
//! `DROVER_BLESS_API_XML=1` writes what is served into those files instead of
//! comparing (then review the diff: the files are the API users rely on).

use drover_bus::bluechi::{
    AGENT_BUS_NAME, AGENT_PATH, CONTROLLER_PATH, JOB_IFACE, METRICS_PATH, MONITOR_IFACE,
};
use drover_testkit::api::INTROSPECTABLE_IFACE;
use drover_testkit::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use zbus::OwnedObjectPath;

const SLOW: &str = "slow.service";

fn interfaces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../dist/usr/share/dbus-1/interfaces")
        .canonicalize()
        .expect("dist/usr/share/dbus-1/interfaces exists")
}

/// The `<interface>` elements of an introspection document that are not the standard
/// `org.freedesktop.DBus.*` ones, by name, each as its lines without indentation.
fn interfaces(xml: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<interface name=\"") {
        let after = &rest[start..];
        let end = after
            .find("</interface>")
            .unwrap_or_else(|| panic!("an unterminated <interface> in:\n{xml}"));
        let block = &after[..end + "</interface>".len()];
        let name = block["<interface name=\"".len()..]
            .split('"')
            .next()
            .unwrap_or_default()
            .to_owned();
        if !name.starts_with("org.freedesktop.DBus.") {
            let lines = block
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect();
            assert!(
                out.insert(name.clone(), lines).is_none(),
                "{name} twice in:\n{xml}"
            );
        }
        rest = &after[end..];
    }
    out
}

/// The file of one interface, as the packages install it.
fn file_text(lines: &[String]) -> String {
    let mut text = String::from(
        "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \
         \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n",
    );
    let mut depth = 1;
    for line in lines {
        if line.starts_with("</") {
            depth -= 1;
        }
        text.push_str(&"  ".repeat(depth));
        text.push_str(line);
        text.push('\n');
        let opens = line.starts_with('<') && !line.starts_with("</") && !line.ends_with("/>");
        if opens {
            depth += 1;
        }
    }
    text.push_str("</node>\n");
    text
}

async fn introspect(conn: &zbus::Connection, dest: &str, path: &str) -> String {
    let reply = conn
        .call_method(
            Some(dest),
            path,
            Some(INTROSPECTABLE_IFACE),
            "Introspect",
            &(),
        )
        .await
        .unwrap_or_else(|e| panic!("Introspect {path} on {dest}: {e}"));
    reply.body().deserialize().expect("Introspect returns s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_interface_equals_its_installed_xml() {
    let c = TestCluster::with_units(1, &[("node1", SLOW, SLOW_START)]).await;
    let api = c.api().await;
    let mut served: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut take = |what: &str, xml: String| {
        let found = interfaces(&xml);
        assert!(
            !found.is_empty(),
            "{what} serves no interface of its own:\n{xml}"
        );
        for (name, lines) in found {
            if let Some((first, before)) = served.get(&name) {
                assert_eq!(before, &lines, "{name} differs between {first} and {what}");
            }
            served.insert(name, (what.to_owned(), lines));
        }
    };

    take("the controller", api.introspect(CONTROLLER_PATH).await);
    let node = api.get_node("node1").await.expect("GetNode");
    take("a node", api.introspect(node.as_str()).await);

    // A job exists while it runs: a oneshot that sleeps.
    let job: OwnedObjectPath = api
        .call(node.as_str(), NODE_IFACE, "StartUnit", &(SLOW, "replace"))
        .await
        .expect("StartUnit");
    take("a job", api.introspect(job.as_str()).await);
    let () = api
        .call(job.as_str(), JOB_IFACE, "Cancel", &())
        .await
        .expect("Cancel");

    let monitor: OwnedObjectPath = api
        .call(CONTROLLER_PATH, CONTROLLER_IFACE, "CreateMonitor", &())
        .await
        .expect("CreateMonitor");
    take("a monitor", api.introspect(monitor.as_str()).await);
    let () = api
        .call(monitor.as_str(), MONITOR_IFACE, "Close", &())
        .await
        .expect("Close");

    let () = api
        .call(CONTROLLER_PATH, CONTROLLER_IFACE, "EnableMetrics", &())
        .await
        .expect("EnableMetrics");
    take("the metrics object", api.introspect(METRICS_PATH).await);
    let () = api
        .call(CONTROLLER_PATH, CONTROLLER_IFACE, "DisableMetrics", &())
        .await
        .expect("DisableMetrics");

    let agent_bus = drover_testkit::api::connect(&c.node_bus_address("node1")).await;
    take(
        "the agent",
        introspect(&agent_bus, AGENT_BUS_NAME, AGENT_PATH).await,
    );
    c.down().await;

    let dir = interfaces_dir();
    if std::env::var_os("DROVER_BLESS_API_XML").is_some() {
        for (name, (_, lines)) in &served {
            std::fs::write(dir.join(format!("{name}.xml")), file_text(lines)).unwrap();
        }
    }
    let mut installed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = entry.path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let name = file
            .strip_suffix(".xml")
            .unwrap_or_else(|| panic!("{file}: only NAME.xml files belong here"));
        let text = std::fs::read_to_string(&path).unwrap();
        let found = interfaces(&text);
        assert_eq!(
            found.keys().collect::<Vec<_>>(),
            [name],
            "{file} must describe exactly the interface it is named after"
        );
        assert_eq!(
            text,
            file_text(&found[name]),
            "{file} is not in its one layout"
        );
        installed.extend(found);
    }
    assert_eq!(
        served.keys().collect::<Vec<_>>(),
        installed.keys().collect::<Vec<_>>(),
        "interfaces served vs files in {}",
        dir.display()
    );
    for (name, (what, lines)) in &served {
        let want = &installed[name];
        if lines != want {
            let diff: Vec<String> = diff_lines(want, lines);
            panic!(
                "{what} serves {name} otherwise than {name}.xml says (- file, + served):\n{}",
                diff.join("\n")
            );
        }
    }
}

/// A plain line diff: the lines only one side has, in order.
fn diff_lines(want: &[String], got: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < want.len() || j < got.len() {
        match (want.get(i), got.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) => {
                if got[j..].contains(a) {
                    out.push(format!("+ {b}"));
                    j += 1;
                } else {
                    out.push(format!("- {a}"));
                    i += 1;
                }
            }
            (Some(a), None) => {
                out.push(format!("- {a}"));
                i += 1;
            }
            (None, Some(b)) => {
                out.push(format!("+ {b}"));
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

#[test]
fn the_reader_finds_interfaces_and_the_layout_round_trips() {
    let xml = "<node>\n  <interface name=\"a.B\">\n    <method name=\"M\">\n      \
               <arg name=\"x\" type=\"s\" direction=\"in\"/>\n    </method>\n    \
               <property name=\"P\" type=\"s\" access=\"read\">\n      \
               <annotation name=\"k\" value=\"v\"/>\n    </property>\n  </interface>\n  \
               <interface name=\"org.freedesktop.DBus.Peer\">\n  </interface>\n</node>\n";
    let found = interfaces(xml);
    assert_eq!(found.keys().collect::<Vec<_>>(), ["a.B"]);
    let text = file_text(&found["a.B"]);
    assert!(text.contains("\n  <interface name=\"a.B\">\n    <method name=\"M\">\n      <arg"));
    assert!(
        text.contains("\n    <property name=\"P\" type=\"s\" access=\"read\">\n      <annotation")
    );
    assert_eq!(interfaces(&text), found);
    let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        diff_lines(&a(&["x", "y", "z"]), &a(&["x", "w", "z"])),
        ["- y", "+ w"]
    );
}
