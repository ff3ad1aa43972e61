//! The files a sandbox writes: its dbus-daemon config, the manager and agent configs, and
//! the `sandbox.env` shell snippet. Pure text generation, so it is tested without processes.

use std::path::{Path, PathBuf};

/// Settings that go into the manager and agent configs.
#[derive(Debug, Clone)]
pub struct DaemonSettings {
    pub port: u16,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_threshold_ms: u64,
    /// The cluster's PKI directory (`drover_tls::pki` layout) when the
    /// daemons speak mutual TLS; `None` for plaintext.
    pub pki: Option<PathBuf>,
    /// The manager's Prometheus port on 127.0.0.1 (`MetricsListenAddress`),
    /// if it serves one.
    pub metrics_port: Option<u16>,
    /// The manager's `StateDirectory` (drained nodes and units), inside the
    /// sandbox so each manager has its own and teardown removes it.
    pub state_dir: Option<PathBuf>,
    /// What the agents' `ControllerHost=` lists: `127.0.0.1`, or with
    /// several managers (`up --managers N`) each manager's own loopback
    /// address, all on `port`.
    pub controller_hosts: Vec<String>,
}

/// The four TLS keys for a daemon whose certificate and key are `cert`, `key`.
fn tls_keys(pki: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "TLSCertificate={}\n\
         TLSPrivateKey={}\n\
         TLSCertificateAuthority={}\n\
         TLSRevocationList={}\n",
        cert.display(),
        key.display(),
        pki.join("ca.pem").display(),
        pki.join("crl.pem").display(),
    )
}

/// A session-style bus that listens on `socket` and lets anyone own and send anything.
/// Only the daemon's own user (root, in tests) may connect: dbus-daemon's default.
pub fn bus_config(socket: &Path) -> String {
    bus_config_for(socket, false)
}

/// [`bus_config`], and with `any_user` every local user may connect too (for tests of
/// what a non-root caller may do; such a bus is still a throwaway in a test's directory).
pub fn bus_config_for(socket: &Path, any_user: bool) -> String {
    let users = if any_user {
        "\n    <allow user=\"*\"/>"
    } else {
        ""
    };
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">{users}
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
        xml_escape(&socket.display().to_string())
    )
}

/// drover's shipped D-Bus policies (`dist/usr/share/dbus-1/system.d/`), as the
/// packages install them: (file name, text).
pub const SHIPPED_POLICIES: [(&str, &str); 2] = [
    (
        "org.eclipse.bluechi.conf",
        include_str!("../../dist/usr/share/dbus-1/system.d/org.eclipse.bluechi.conf"),
    ),
    (
        "org.eclipse.bluechi.Agent.conf",
        include_str!("../../dist/usr/share/dbus-1/system.d/org.eclipse.bluechi.Agent.conf"),
    ),
];

/// systemd's own policy for `org.freedesktop.systemd1` (package systemd): only root owns
/// the name and calls what changes state.
pub const SYSTEMD_POLICY: &str = "/usr/share/dbus-1/system.d/org.freedesktop.systemd1.conf";

/// The system bus's configuration as the host's dbus package ships it.
pub const SYSTEM_CONF: &str = "/usr/share/dbus-1/system.conf";

/// The `<policy context="default">` element of the host's `system.conf` (dbus's
/// default system bus policy: every user may connect and send signals, method calls
/// only where a service's policy allows them).
pub fn system_default_policy(system_conf: &str) -> Result<String, String> {
    let start = system_conf
        .find("<policy context=\"default\">")
        .ok_or("no <policy context=\"default\"> in system.conf")?;
    let len = system_conf[start..]
        .find("</policy>")
        .ok_or("the default policy of system.conf does not end")?;
    Ok(system_conf[start..start + len + "</policy>".len()].to_owned())
}

/// A bus configured as a system bus: `<type>system</type>`, the host's default system
/// policy (`default_policy`, from [`system_default_policy`]), then each file of
/// `includes` (service policies). `listen`: the socket it listens on; `None` for a
/// socket-activated daemon (`<listen>systemd:</listen>`).
pub fn system_bus_config(
    listen: Option<&Path>,
    default_policy: &str,
    includes: &[PathBuf],
) -> String {
    let listen = match listen {
        Some(p) => format!("unix:path={}", xml_escape(&p.display().to_string())),
        None => "systemd:".to_owned(),
    };
    let includes: String = includes
        .iter()
        .map(|p| {
            format!(
                "  <include>{}</include>\n",
                xml_escape(&p.display().to_string())
            )
        })
        .collect();
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- Written by drover-sandbox: a bus with the system bus's policy. -->
<busconfig>
  <type>system</type>
  <listen>{listen}</listen>
  <auth>EXTERNAL</auth>
  {default_policy}
{includes}</busconfig>
"#
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The manager config: the `allowed` nodes may register; with `allow_all_proxies` every
/// node may depend on every node (`AllowDependenciesOn`), without it no proxy is allowed
/// unless `extra` says so (the product's default: deny).
pub fn manager_config(
    settings: &DaemonSettings,
    nodes: &[String],
    allowed: &[String],
    allow_all_proxies: bool,
    extra: &str,
) -> String {
    let mut text = format!(
        "[drover-manager]\n\
         ControllerPort={}\n\
         AllowedNodeNames={}\n\
         NodeHeartbeatThreshold={}\n\
         LogLevel=DEBUG\n\
         LogTarget=stderr\n",
        settings.port,
        allowed.join(","),
        settings.heartbeat_threshold_ms,
    );
    if let Some(port) = settings.metrics_port {
        text.push_str(&format!("MetricsListenAddress=127.0.0.1:{port}\n"));
    }
    if let Some(dir) = &settings.state_dir {
        text.push_str(&format!("StateDirectory={}\n", dir.display()));
    }
    if let Some(pki) = &settings.pki {
        text.push_str(&tls_keys(
            pki,
            &pki.join("manager.pem"),
            &pki.join("manager.key"),
        ));
    }
    for node in nodes.iter().filter(|_| allow_all_proxies) {
        text.push_str(&format!(
            "\n[node {node}]\nAllowDependenciesOn={}\n",
            nodes.join(",")
        ));
    }
    if !extra.is_empty() {
        text.push('\n');
        text.push_str(extra);
        if !extra.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

/// The user-mode proxy template as shipped in `dist/usr/lib/systemd/user/`; the sandbox points its
/// `ExecStart=`/`ExecStop=` at the `drover-proxy` it found.
const PROXY_USER_TEMPLATE: &str =
    include_str!("../../dist/usr/lib/systemd/user/drover-proxy@.service");
/// The user-mode dep template as shipped in `dist/usr/lib/systemd/user/`.
const DEP_TEMPLATE: &str = include_str!("../../dist/usr/lib/systemd/user/drover-dep@.service");
/// BlueChi's names, from drover's optional BlueChi compatibility set (user mode).
const BLUECHI_PROXY_USER_TEMPLATE: &str =
    include_str!("../../dist/usr/lib/systemd/user/bluechi-proxy@.service");
const BLUECHI_DEP_TEMPLATE: &str =
    include_str!("../../dist/usr/lib/systemd/user/bluechi-dep@.service");
/// Where the shipped templates expect the helper.
const SHIPPED_PROXY_PATH: &str = "/usr/libexec/drover-proxy";

/// The unit templates every node gets, as (file name, contents): `drover-proxy@.service`
/// (user mode: the helper finds the agent on the node's session bus) running `proxy_bin`,
/// and `drover-dep@.service`; with `bluechi_compat` also the compatibility set's
/// `bluechi-proxy@.service` (the same helper, run as `bluechi-proxy`) and
/// `bluechi-dep@.service`, as `make install-bluechi-compat` installs them. Nodes have no
/// journal, so the proxy units' output (the helper's one-line reasons) goes to
/// `log_dir/<unit name>.log` instead.
pub fn proxy_units(
    proxy_bin: &Path,
    log_dir: &Path,
    bluechi_compat: bool,
) -> Result<Vec<(&'static str, String)>, String> {
    let path = proxy_bin
        .to_str()
        .ok_or_else(|| format!("{} is not valid UTF-8", proxy_bin.display()))?;
    // An ExecStart= word: no quoting games, and '%' would be a specifier.
    if !proxy_bin.is_absolute()
        || path
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "\"'\\;".contains(c))
    {
        return Err(format!(
            "{path} cannot be used in a unit file's ExecStart= (it must be absolute, without \
             spaces, quotes, backslashes or ';')"
        ));
    }
    let escaped = path.replace('%', "%%");
    let logs = log_dir.display().to_string().replace('%', "%%");
    let output = format!(
        "[Service]\n# drover-sandbox: nodes have no journal; the helper's lines go here.\n\
         StandardOutput=append:{logs}/%n.log\nStandardError=inherit\n"
    );
    let proxy = |template: &str| {
        template
            .replace(SHIPPED_PROXY_PATH, &escaped)
            .replacen("[Service]\n", &output, 1)
    };
    let mut units = vec![
        ("drover-proxy@.service", proxy(PROXY_USER_TEMPLATE)),
        ("drover-dep@.service", DEP_TEMPLATE.to_string()),
    ];
    if bluechi_compat {
        units.push(("bluechi-proxy@.service", proxy(BLUECHI_PROXY_USER_TEMPLATE)));
        units.push(("bluechi-dep@.service", BLUECHI_DEP_TEMPLATE.to_string()));
    }
    Ok(units)
}

/// An agent config for the node called `name`.
pub fn agent_config(settings: &DaemonSettings, name: &str) -> String {
    let mut text = format!(
        "[drover-agent]\n\
         NodeName={name}\n\
         ControllerHost={}\n\
         ControllerPort={}\n\
         HeartbeatInterval={}\n\
         ControllerHeartbeatThreshold={}\n\
         LogTarget=stderr\n",
        settings.controller_hosts.join(","),
        settings.port,
        settings.heartbeat_interval_ms,
        settings.heartbeat_threshold_ms,
    );
    if let Some(pki) = &settings.pki {
        let nodes = pki.join("nodes");
        text.push_str(&tls_keys(
            pki,
            &nodes.join(format!("{name}.pem")),
            &nodes.join(format!("{name}.key")),
        ));
    }
    text
}

/// Shell `export` lines for a sandbox's bus and directory, and the URL of
/// its manager's metrics when it serves them.
pub fn env_lines(bus_address: &str, dir: &Path, metrics_url: Option<&str>) -> String {
    let mut text = format!(
        "export DROVER_BUS={}\nexport DROVER_SANDBOX_DIR={}\n",
        shell_quote(bus_address),
        shell_quote(&dir.display().to_string())
    );
    if let Some(url) = metrics_url {
        text.push_str(&format!("export DROVER_METRICS_URL={}\n", shell_quote(url)));
    }
    text
}

/// The `sandbox.env` lines of a sandbox with several managers (`up --managers N`):
/// `DROVER_BUS_K` and `DROVER_MANAGER_PID_K` for each manager K (1-based, in the order
/// given), and `DROVER_ETCD`, the etcd client URL they elect their leader on.
pub fn managers_lines(managers: &[(String, Option<u32>)], etcd_url: &str) -> String {
    let mut text = String::new();
    for (i, (bus, pid)) in managers.iter().enumerate() {
        let k = i + 1;
        text.push_str(&format!("export DROVER_BUS_{k}={}\n", shell_quote(bus)));
        if let Some(pid) = pid {
            text.push_str(&format!("export DROVER_MANAGER_PID_{k}={pid}\n"));
        }
    }
    text.push_str(&format!("export DROVER_ETCD={}\n", shell_quote(etcd_url)));
    text
}

/// The `sandbox.env` line naming where drover-dns answers (`HOST:PORT`, as
/// `dig @HOST -p PORT` takes it apart).
pub fn dns_line(address: std::net::SocketAddr) -> String {
    format!("export DROVER_DNS={}\n", shell_quote(&address.to_string()))
}

/// Single-quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> DaemonSettings {
        DaemonSettings {
            port: 4242,
            heartbeat_interval_ms: 500,
            heartbeat_threshold_ms: 2000,
            pki: None,
            metrics_port: None,
            state_dir: Some(PathBuf::from("/tmp/s/manager-state")),
            controller_hosts: vec!["127.0.0.1".into()],
        }
    }

    #[test]
    fn manager_config_allows_all_dependencies_and_appends_extra() {
        let nodes = vec!["node1".to_string(), "node2".to_string()];
        let text = manager_config(
            &settings(),
            &nodes,
            &nodes,
            true,
            "[node node9]\nAllowed=true",
        );
        assert!(
            text.starts_with("[drover-manager]\nControllerPort=4242\n"),
            "{text}"
        );
        assert!(text.contains("AllowedNodeNames=node1,node2\n"), "{text}");
        assert!(
            text.contains("AllowedNodeNames=node1,node2\nNodeHeartbeatThreshold=2000\n"),
            "{text}"
        );
        assert!(
            !text.contains("HeartbeatInterval"),
            "the manager sends heartbeats as shipped (none): {text}"
        );
        assert!(
            text.contains("LogLevel=DEBUG\nLogTarget=stderr\n"),
            "{text}"
        );
        assert!(
            text.contains("[node node2]\nAllowDependenciesOn=node1,node2\n"),
            "{text}"
        );
        assert!(
            text.contains("StateDirectory=/tmp/s/manager-state\n"),
            "{text}"
        );
        assert!(text.ends_with("[node node9]\nAllowed=true\n"), "{text}");
    }

    #[test]
    fn without_allow_all_proxies_no_dependency_is_allowed() {
        let nodes = vec!["node1".to_string(), "node2".to_string()];
        let text = manager_config(&settings(), &nodes, &nodes, false, "");
        assert!(!text.contains("AllowDependenciesOn"), "{text}");
        assert!(!text.contains("[node "), "{text}");
        assert!(text.contains("AllowedNodeNames=node1,node2\n"), "{text}");
    }

    #[test]
    fn the_bluechi_compat_set_runs_the_same_helper_as_bluechi_proxy() {
        let units = proxy_units(
            Path::new("/opt/x%y/drover-proxy"),
            Path::new("/sb/n1/logs"),
            true,
        )
        .unwrap();
        let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "drover-proxy@.service",
                "drover-dep@.service",
                "bluechi-proxy@.service",
                "bluechi-dep@.service"
            ]
        );
        let proxy = &units[2].1;
        for line in [
            "ExecStart=@/opt/x%%y/drover-proxy bluechi-proxy create --user %i.service",
            "ExecStop=@/opt/x%%y/drover-proxy bluechi-proxy remove --user %i.service",
            "StopWhenUnneeded=yes",
            "StandardOutput=append:/sb/n1/logs/%n.log",
        ] {
            assert!(proxy.lines().any(|l| l == line), "missing {line}: {proxy}");
        }
        let dep = &units[3].1;
        for line in ["BindsTo=%i.service", "After=%i.service"] {
            assert!(dep.lines().any(|l| l == line), "missing {line}: {dep}");
        }
    }

    #[test]
    fn proxy_units_run_the_found_helper_in_user_mode() {
        let units = proxy_units(
            Path::new("/opt/x%y/drover-proxy"),
            Path::new("/sb/n1/logs"),
            false,
        )
        .unwrap();
        let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["drover-proxy@.service", "drover-dep@.service"]);
        let proxy = &units[0].1;
        for line in [
            "ExecStart=/opt/x%%y/drover-proxy create --user %i",
            "ExecStop=/opt/x%%y/drover-proxy remove --user %i",
            "Type=oneshot",
            "RemainAfterExit=yes",
            "StopWhenUnneeded=yes",
            "StandardOutput=append:/sb/n1/logs/%n.log",
        ] {
            assert!(proxy.lines().any(|l| l == line), "missing {line}: {proxy}");
        }
        assert!(!proxy.contains("/usr/libexec"), "{proxy}");
        let dep = &units[1].1;
        for line in ["BindsTo=%i", "After=%i", "ExecStop=/bin/true"] {
            assert!(dep.lines().any(|l| l == line), "missing {line}: {dep}");
        }
        for bad in [
            "relative/drover-proxy",
            "/has space/drover-proxy",
            "/a\"b/x",
        ] {
            assert!(
                proxy_units(Path::new(bad), Path::new("/l"), true).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn agent_config_has_the_contract_keys() {
        let text = agent_config(&settings(), "node3");
        for line in [
            "[drover-agent]",
            "NodeName=node3",
            "ControllerHost=127.0.0.1",
            "ControllerPort=4242",
            "HeartbeatInterval=500",
            "ControllerHeartbeatThreshold=2000",
            "LogTarget=stderr",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}: {text}");
        }
    }

    #[test]
    fn agents_list_every_manager_and_the_env_names_each() {
        let mut s = settings();
        s.controller_hosts = vec!["127.0.0.1".into(), "127.0.0.2".into()];
        let text = agent_config(&s, "node1");
        assert!(
            text.lines()
                .any(|l| l == "ControllerHost=127.0.0.1,127.0.0.2"),
            "{text}"
        );
        assert_eq!(
            managers_lines(
                &[
                    ("unix:path=/sb/bus".into(), Some(10)),
                    ("unix:path=/sb/bus-2".into(), Some(11))
                ],
                "http://127.0.0.1:2379"
            ),
            "export DROVER_BUS_1='unix:path=/sb/bus'\nexport DROVER_MANAGER_PID_1=10\n\
             export DROVER_BUS_2='unix:path=/sb/bus-2'\nexport DROVER_MANAGER_PID_2=11\n\
             export DROVER_ETCD='http://127.0.0.1:2379'\n"
        );
    }

    #[test]
    fn env_lines_are_quoted_for_the_shell() {
        let text = env_lines("unix:path=/tmp/it's/bus", Path::new("/tmp/it's"), None);
        assert_eq!(
            text,
            "export DROVER_BUS='unix:path=/tmp/it'\\''s/bus'\nexport DROVER_SANDBOX_DIR='/tmp/it'\\''s'\n"
        );
    }

    #[test]
    fn only_an_open_bus_lets_other_users_connect() {
        let closed = bus_config(Path::new("/tmp/sb/bus"));
        assert!(!closed.contains("user="), "{closed}");
        let open = bus_config_for(Path::new("/tmp/sb/bus"), true);
        assert!(open.contains("<allow user=\"*\"/>"), "{open}");
    }

    #[test]
    fn bus_config_listens_on_the_socket() {
        let text = bus_config(Path::new("/tmp/sb/bus"));
        assert!(
            text.contains("<listen>unix:path=/tmp/sb/bus</listen>"),
            "{text}"
        );
        assert!(text.contains("<allow own=\"*\"/>"), "{text}");
    }
}
