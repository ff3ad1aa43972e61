//! The shipped D-Bus policy of `org.eclipse.bluechi` classifies every method
//! of the API, and a real dbus-daemon enforces it.
//!
//! * Every method the manager exports (the interface XML the packages install,
//!   `dist/usr/share/dbus-1/interfaces/`, which a test keeps equal to what a running
//!   manager serves, and the standard interfaces every object has) is either read-only — open to everyone
//!   (introspection, ping) or to the optional group `drover-readers` — or
//!   root-only, with the reason below; none is both or neither, so a method
//!   added to the API makes this test fail until someone decides.
//! * The readers' rules each name destination, interface and member (no
//!   blanket rule), and name only exported methods.
//! * `scripts/check-dbus-policy` (as root) loads the policy into a private
//!   dbus-daemon and makes calls as a reader and as another user.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

const POLICY: &str = "dist/usr/share/dbus-1/system.d/org.eclipse.bluechi.conf";

/// (interface, method)
type Method = (String, String);

/// Methods only root may call, and why.
const ROOT_ONLY: &[(&str, &str, &str)] = &[
    (
        "io.drover.Controller",
        "Reload",
        "reloads the manager's configuration (ExecReload=)",
    ),
    (
        "io.drover.Controller",
        "Drain",
        "takes nodes and units out of service (Where, DNS)",
    ),
    (
        "io.drover.Controller",
        "Undrain",
        "puts nodes and units back in service",
    ),
    (
        "org.eclipse.bluechi.Controller",
        "EnableMetrics",
        "changes what the manager emits",
    ),
    (
        "org.eclipse.bluechi.Controller",
        "DisableMetrics",
        "changes what the manager emits",
    ),
    (
        "org.eclipse.bluechi.Controller",
        "SetLogLevel",
        "changes the manager's logging",
    ),
    (
        "org.eclipse.bluechi.Node",
        "StartUnit",
        "runs a job on the node",
    ),
    (
        "org.eclipse.bluechi.Node",
        "StopUnit",
        "runs a job on the node",
    ),
    (
        "org.eclipse.bluechi.Node",
        "RestartUnit",
        "runs a job on the node",
    ),
    (
        "org.eclipse.bluechi.Node",
        "ReloadUnit",
        "runs a job on the node",
    ),
    (
        "org.eclipse.bluechi.Node",
        "Reload",
        "reloads the node's systemd",
    ),
    (
        "org.eclipse.bluechi.Node",
        "StartTransientUnit",
        "runs any command as root",
    ),
    (
        "org.eclipse.bluechi.Node",
        "FreezeUnit",
        "stops a unit's processes",
    ),
    (
        "org.eclipse.bluechi.Node",
        "ThawUnit",
        "resumes a unit's processes",
    ),
    (
        "org.eclipse.bluechi.Node",
        "KillUnit",
        "signals a unit's processes",
    ),
    (
        "org.eclipse.bluechi.Node",
        "SetUnitProperties",
        "changes a unit",
    ),
    (
        "org.eclipse.bluechi.Node",
        "EnableUnitFiles",
        "changes what boots",
    ),
    (
        "org.eclipse.bluechi.Node",
        "DisableUnitFiles",
        "changes what boots",
    ),
    (
        "org.eclipse.bluechi.Node",
        "ResetFailed",
        "clears failure state",
    ),
    (
        "org.eclipse.bluechi.Node",
        "ResetFailedUnit",
        "clears failure state",
    ),
    (
        "org.eclipse.bluechi.Node",
        "SetDefaultTarget",
        "changes what boots",
    ),
    (
        "org.eclipse.bluechi.Node",
        "SetLogLevel",
        "changes the agent's logging",
    ),
    (
        "org.eclipse.bluechi.Job",
        "Cancel",
        "cancels a job someone started",
    ),
    (
        "org.eclipse.bluechi.Monitor",
        "AddPeer",
        "makes the manager send a monitor's events to another client",
    ),
    (
        "org.eclipse.bluechi.Monitor",
        "RemovePeer",
        "cuts another client off a monitor",
    ),
    (
        "org.freedesktop.DBus.Properties",
        "Set",
        "writes a property",
    ),
];

/// Interfaces every local user may call (dbus's own conventions).
const EVERYONE: &[&str] = &[
    "org.freedesktop.DBus.Introspectable",
    "org.freedesktop.DBus.Peer",
];

/// The value of `attr="…"` inside one tag.
fn attr(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(tag[start..start + len].to_string())
}

/// The tags `<NAME …>` of an XML text, attributes and all.
fn tags<'a>(xml: &'a str, name: &str) -> Vec<(usize, &'a str)> {
    let open = format!("<{name}");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = xml[from..].find(&open) {
        let start = from + i;
        let end = start + xml[start..].find('>').expect("tag closes");
        let next = xml.as_bytes()[start + open.len()];
        if next == b' ' || next == b'\n' || next == b'>' || next == b'/' {
            out.push((start, &xml[start..=end]));
        }
        from = end;
    }
    out
}

/// The standard interfaces every object of the manager serves, with their methods.
const STANDARD: &[(&str, &str)] = &[
    ("org.freedesktop.DBus.Introspectable", "Introspect"),
    ("org.freedesktop.DBus.Peer", "Ping"),
    ("org.freedesktop.DBus.Peer", "GetMachineId"),
    ("org.freedesktop.DBus.Properties", "Get"),
    ("org.freedesktop.DBus.Properties", "Set"),
    ("org.freedesktop.DBus.Properties", "GetAll"),
];

/// Every (interface, method) the manager serves: the interface XML of
/// `dist/usr/share/dbus-1/interfaces/` but the agent's (`org.eclipse.bluechi.Agent`,
/// `io.drover.Agent`, with a policy of their own), and the standard ones.
fn exported() -> BTreeSet<Method> {
    let mut methods: BTreeSet<Method> = STANDARD
        .iter()
        .map(|(i, m)| (i.to_string(), m.to_string()))
        .collect();
    let dir = repo().join("dist/usr/share/dbus-1/interfaces");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .filter(|p| {
            !p.ends_with("org.eclipse.bluechi.Agent.xml") && !p.ends_with("io.drover.Agent.xml")
        })
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    for file in files {
        let xml = std::fs::read_to_string(&file).unwrap();
        let interfaces = tags(&xml, "interface");
        for (pos, tag) in tags(&xml, "method") {
            let iface = interfaces
                .iter()
                .rev()
                .find(|(start, _)| *start < pos)
                .and_then(|(_, t)| attr(t, "name"))
                .expect("a method inside an interface");
            methods.insert((iface, attr(tag, "name").unwrap()));
        }
    }
    methods
}

/// The `<allow …>` rules of the `drover-readers` policy.
fn reader_rules() -> Vec<String> {
    let policy = std::fs::read_to_string(repo().join(POLICY)).unwrap();
    let start = policy
        .find("<policy group=\"drover-readers\">")
        .expect("a drover-readers policy");
    let end = start + policy[start..].find("</policy>").unwrap();
    let block = &policy[start..end];
    assert!(!block.contains("<deny"), "the readers' policy only allows");
    tags(block, "allow")
        .into_iter()
        .map(|(_, t)| t.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn every_exported_method_is_classified_once() {
    let exported = exported();
    assert!(
        exported.contains(&("org.eclipse.bluechi.Node".into(), "StartUnit".into())),
        "the API scan found {exported:?}"
    );
    let mut readers: BTreeSet<Method> = BTreeSet::new();
    for rule in reader_rules() {
        assert_eq!(
            attr(&rule, "send_destination").as_deref(),
            Some("org.eclipse.bluechi"),
            "{rule}"
        );
        let iface = attr(&rule, "send_interface").unwrap_or_else(|| panic!("no interface: {rule}"));
        let member = attr(&rule, "send_member").unwrap_or_else(|| panic!("no member: {rule}"));
        let method = (iface, member);
        assert!(
            exported.contains(&method),
            "{method:?} is not exported: {rule}"
        );
        assert!(readers.insert(method.clone()), "{method:?} listed twice");
    }
    let root_only: BTreeSet<Method> = ROOT_ONLY
        .iter()
        .map(|(i, m, _)| (i.to_string(), m.to_string()))
        .collect();
    let everyone: BTreeSet<Method> = exported
        .iter()
        .filter(|(i, _)| EVERYONE.contains(&i.as_str()))
        .cloned()
        .collect();
    let both: Vec<_> = readers.intersection(&root_only).collect();
    assert!(both.is_empty(), "read-only and root-only: {both:?}");
    let neither: Vec<_> = exported
        .iter()
        .filter(|m| !readers.contains(m) && !root_only.contains(m) && !everyone.contains(m))
        .collect();
    assert!(
        neither.is_empty(),
        "exported methods the policy does not classify (add them to the drover-readers \
         policy or to ROOT_ONLY): {neither:?}"
    );
    let stale: Vec<_> = root_only.difference(&exported).collect();
    assert!(
        stale.is_empty(),
        "ROOT_ONLY names methods that are not exported: {stale:?}"
    );
}

#[test]
fn everyone_else_may_only_introspect_and_ping() {
    let policy = std::fs::read_to_string(repo().join(POLICY)).unwrap();
    let start = policy.find("<policy context=\"default\">").unwrap();
    let end = start + policy[start..].find("</policy>").unwrap();
    for (_, rule) in tags(&policy[start..end], "allow") {
        if let Some(iface) = attr(rule, "send_interface") {
            assert!(EVERYONE.contains(&iface.as_str()), "{rule}");
        } else {
            assert!(attr(rule, "send_destination").is_none(), "{rule}");
        }
    }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn a_real_dbus_daemon_enforces_the_readers_policy() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let tools = ["dbus-daemon", "busctl", "setpriv", "unshare"];
    let gi = Command::new("/usr/bin/python3")
        .args(["-c", "import gi"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !root || !gi || !tools.iter().all(|t| have(t)) {
        eprintln!("skipped: needs root, python3-gi and {tools:?} (scripts/host-deps test)");
        return;
    }
    let out = Command::new(repo().join("scripts/check-dbus-policy"))
        .arg(repo().join(POLICY))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 10, "{text}");
}
