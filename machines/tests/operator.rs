//! The operator's suite: three booted Debian 12 machines (systemd as PID 1,
//! a real system bus) with the release packages, driven the way the README
//! and `docs/` tell an operator to, and checked the way an operator checks:
//! `systemctl`, `journalctl`, `droverctl`, `busctl`.
//!
//! `make test-machines` builds the packages (`make deb`) and runs it; it is
//! not part of `make test` (minutes, and it needs debootstrap and
//! systemd-nspawn). The machines are `manager` (192.0.2.10), `web1` and
//! `db1`, as in the README's example. The steps run in order on one fleet,
//! each building on the last (the README's path is one story); a failed step
//! ends the run, the later ones are reported as not run. Whatever happens,
//! the fleet is torn down and the last step checks that nothing is left
//! (bridge, veths, cgroups, mounts, processes, directories).
//!
//! Own harness (`harness = false`): one libtest line per step, and libtest's
//! `test result:` line, which `.ci/run` counts. `cargo test ... -- NAME`
//! runs the steps whose name contains NAME (and the setup they need: the
//! earlier steps).

use anyhow::{Context, Result, bail, ensure};
use drover_machines::fleet::{self, State};
use drover_machines::operator::{self, CA_DIR, TLS_DIR};
use drover_machines::{Fleet, FleetOptions, Machine};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

struct Suite {
    fleet: Fleet,
    debs: PathBuf,
    /// Figures worth reporting, printed at the end.
    notes: std::cell::RefCell<Vec<String>>,
}

type Step = (&'static str, fn(&mut Suite) -> Result<()>);

const STEPS: &[Step] = &[
    ("lintian_finds_no_error_in_any_package", lintian),
    ("installing_enables_the_daemons_and_starts_nothing", install),
    ("the_readme_makes_a_fleet_over_mutual_tls", readme_fleet),
    (
        "the_shipped_conffiles_name_the_files_the_docs_put_in_place",
        conffiles,
    ),
    (
        "the_seed_example_runs_across_machines_in_the_shipped_sandbox",
        seed_example,
    ),
    (
        "a_failing_or_missing_target_fails_its_proxy_and_says_why",
        failing_targets,
    ),
    (
        "a_target_that_exits_at_once_never_keeps_a_requires_dependent",
        exiting_target,
    ),
    ("bluechi_names_work_in_the_shipped_sandbox", bluechi_names),
    (
        "revocation_by_manager_reload_drops_the_node_and_names_it",
        revocation,
    ),
    (
        "rotation_by_agent_reload_brings_the_node_back_and_drops_nothing",
        rotation,
    ),
    (
        "a_manager_reboot_changes_no_unit_on_the_nodes",
        manager_reboot,
    ),
    (
        "socket_activation_starts_the_manager_on_the_first_agent",
        socket_activation,
    ),
    ("the_dbus_policy_holds_on_the_system_bus", dbus_policy),
    (
        "the_shipped_units_keep_their_sandbox_in_a_machine",
        unit_scores,
    ),
];

const T: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter: Option<&String> = args.iter().find(|a| !a.starts_with('-'));
    if args.iter().any(|a| a == "--list") {
        for (name, _) in STEPS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    // The last step a filter asks for; every earlier one is its setup.
    let last = match filter {
        Some(f) => match STEPS.iter().rposition(|(n, _)| n.contains(f.as_str())) {
            Some(i) => i,
            None => {
                println!(
                    "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {} filtered out; finished in 0.00s\n",
                    STEPS.len() + 2
                );
                return ExitCode::SUCCESS;
            }
        },
        None => STEPS.len() - 1,
    };
    let started = Instant::now();
    println!("\nrunning {} tests", last + 3);
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut failures = Vec::new();
    let debs = std::env::var_os("DROVER_DEB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/debian"));
    let boot_started = Instant::now();
    let booted = Fleet::boot(&FleetOptions::default());
    let mut state: Option<State> = None;
    match booted {
        Err(e) => {
            println!("test fleet_boots ... FAILED");
            failures.push(("fleet_boots".to_string(), format!("{e:#}")));
            failed += 1 + last + 1;
        }
        Ok(fleet) => {
            println!(
                "test fleet_boots ... ok ({:.1} s)",
                boot_started.elapsed().as_secs_f64()
            );
            passed += 1;
            state = Some(fleet.state().clone());
            let mut suite = Suite {
                fleet,
                debs,
                notes: Default::default(),
            };
            let mut broken = false;
            for (name, step) in &STEPS[..=last] {
                if broken {
                    println!("test {name} ... FAILED (not run: an earlier step failed)");
                    failed += 1;
                    continue;
                }
                let t = Instant::now();
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&mut suite)))
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("the step panicked")));
                match outcome {
                    Ok(()) => {
                        println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
                        passed += 1;
                    }
                    Err(e) => {
                        println!(
                            "test {name} ... FAILED ({:.1} s)",
                            t.elapsed().as_secs_f64()
                        );
                        failures.push((name.to_string(), format!("{e:#}")));
                        failed += 1;
                        broken = true;
                    }
                }
            }
            for note in suite.notes.borrow().iter() {
                println!("note: {note}");
            }
            let t = Instant::now();
            if let Err(e) = suite.fleet.down() {
                failures.push(("teardown".to_string(), format!("{e:#}")));
            }
            println!("note: teardown took {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    // Nothing of the fleet is left on the host.
    match state.map(|s| fleet::leftovers(&s)) {
        Some(left) if left.is_empty() => {
            println!("test nothing_is_left_behind ... ok");
            passed += 1;
        }
        Some(left) => {
            println!("test nothing_is_left_behind ... FAILED");
            failures.push(("nothing_is_left_behind".to_string(), left.join("\n")));
            failed += 1;
        }
        None => {}
    }
    if !failures.is_empty() {
        println!("\nfailures:");
        for (name, why) in &failures {
            println!("\n---- {name} ----\n{why}");
        }
    }
    let result = if failed == 0 && failures.is_empty() {
        "ok"
    } else {
        "FAILED"
    };
    println!(
        "\ntest result: {result}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        STEPS.len() - 1 - last,
        started.elapsed().as_secs_f64()
    );
    if result == "ok" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// ---- helpers ---------------------------------------------------------------

impl Suite {
    fn m(&self, name: &str) -> Result<&Machine> {
        self.fleet.machine(name)
    }

    fn note(&self, note: String) {
        self.notes.borrow_mut().push(note);
    }
}

/// Polls `probe` every 100 ms until it gives `Some`, or fails after `within`
/// with the last thing it saw.
fn eventually<T>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Result<(Option<T>, String)>,
) -> Result<T> {
    let deadline = Instant::now() + within;
    loop {
        let (found, seen) = probe()?;
        if let Some(found) = found {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            bail!("{what}: not within {within:?}; last seen:\n{seen}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The journal's position now, for [`journal_since`].
fn journal_mark(m: &Machine) -> Result<String> {
    let out = m.must("journalctl -n 0 --show-cursor -q")?;
    out.lines()
        .find_map(|l| l.strip_prefix("-- cursor: "))
        .map(str::to_string)
        .context("journalctl printed no cursor")
}

/// The messages of `unit` since `mark`.
fn journal_since(m: &Machine, unit: &str, mark: &str) -> Result<String> {
    m.must(&format!(
        "journalctl -q --no-pager -o cat -u '{unit}' --after-cursor='{mark}'"
    ))
}

fn prop(m: &Machine, unit: &str, property: &str) -> Result<String> {
    Ok(
        m.must(&format!("systemctl show -p {property} --value '{unit}'"))?
            .trim()
            .to_string(),
    )
}

fn wait_online(s: &Suite, nodes: &[&str]) -> Result<()> {
    let manager = s.m("manager")?;
    eventually("droverctl status shows every node online", T, || {
        let out = manager.sh("droverctl status")?;
        let all = nodes.iter().all(|n| {
            out.stdout
                .lines()
                .any(|l| l.starts_with(n) && l.contains("| online"))
        });
        Ok((all.then_some(()), out.text()))
    })
}

fn wait_active(m: &Machine, unit: &str, state: &str) -> Result<()> {
    eventually(&format!("{unit} on {} is {state}", m.name), T, || {
        let now = prop(m, unit, "ActiveState")?;
        Ok(((now == state).then_some(()), now))
    })
}

fn write_unit(m: &Machine, name: &str, text: &str) -> Result<()> {
    m.write(&format!("/etc/systemd/system/{name}"), text)?;
    m.must("systemctl daemon-reload").map(drop)
}

// ---- the steps ---------------------------------------------------------------

/// `lintian` on every package: no error (warnings are printed for the record).
fn lintian(s: &mut Suite) -> Result<()> {
    let debs: Vec<PathBuf> = std::fs::read_dir(&s.debs)
        .with_context(|| format!("{} (run make deb first)", s.debs.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    // drover-manager, drover-agent, droverctl, drover-common,
    // drover-bluechi-compat and drover-dns.
    ensure!(
        debs.len() == 6,
        "expected the 6 packages in {}, found {debs:?}",
        s.debs.display()
    );
    let out = drover_machines::run::run(
        Command::new("lintian")
            .arg("--fail-on")
            .arg("error")
            .args(&debs),
        Duration::from_secs(1200),
    )?;
    let errors: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("E: "))
        .collect();
    let warnings = out.stdout.lines().filter(|l| l.starts_with("W: ")).count();
    s.note(format!(
        "lintian: {} errors, {warnings} warnings over 6 packages",
        errors.len()
    ));
    ensure!(errors.is_empty() && out.ok(), "lintian:\n{}", out.text());
    Ok(())
}

/// The README's `apt install ./…deb`: the daemons are enabled, nothing runs.
fn install(s: &mut Suite) -> Result<()> {
    let manager = operator::debs(&s.debs, operator::MANAGER_PACKAGES)?;
    let node = operator::debs(&s.debs, operator::NODE_PACKAGES)?;
    let compat = operator::debs(&s.debs, &["drover-bluechi-compat"])?;
    let t = Instant::now();
    operator::install(s.m("manager")?, &manager)?.into_result("apt install on manager")?;
    let web1: Vec<PathBuf> = node.iter().chain(&compat).cloned().collect();
    operator::install(s.m("web1")?, &web1)?.into_result("apt install on web1")?;
    operator::install(s.m("db1")?, &node)?.into_result("apt install on db1")?;
    s.note(format!(
        "apt install on three machines: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    for (machine, unit) in [
        ("manager", "drover-manager.service"),
        ("web1", "drover-agent.service"),
        ("db1", "drover-agent.service"),
    ] {
        let m = s.m(machine)?;
        ensure!(
            prop(m, unit, "UnitFileState")? == "enabled",
            "{unit} on {machine} is not enabled"
        );
        ensure!(
            prop(m, unit, "ActiveState")? == "inactive",
            "{unit} on {machine} was started by the package"
        );
        // The preset says the same as what the package did.
        let preset = m.must(&format!("systemctl preset --dry-run {unit} 2>&1 || true"))?;
        ensure!(
            !preset.contains("Removed"),
            "{unit}: the preset would disable it: {preset}"
        );
    }
    let m = s.m("manager")?;
    ensure!(
        prop(m, "drover-manager.socket", "UnitFileState")? == "disabled",
        "the socket unit is enabled by the package"
    );
    Ok(())
}

/// The README's "A fleet of several hosts", command by command.
fn readme_fleet(s: &mut Suite) -> Result<()> {
    let manager = s.m("manager")?;
    operator::make_certificates(manager)?;
    for file in [
        "ca.pem",
        "ca.key",
        "crl.pem",
        "manager.pem",
        "manager.key",
        "nodes/web1.pem",
        "nodes/db1.key",
    ] {
        ensure!(
            manager.path(&format!("{CA_DIR}/{file}")).is_file(),
            "drover-pki made no {file}"
        );
    }
    operator::distribute_certificates(&s.fleet, "manager", &["web1", "db1"])?;
    operator::configure_manager(manager)?;
    let checked = operator::start_manager(manager)?;
    ensure!(
        checked.contains("agents: mutual TLS on every address port 842")
            && checked.contains("nodes allowed: web1, db1")
            && checked.ends_with("the configuration is valid\n"),
        "drover-manager --check said:\n{checked}"
    );
    let t = Instant::now();
    for node in ["web1", "db1"] {
        let m = s.m(node)?;
        operator::configure_agent(m)?;
        let checked = operator::start_agent(m)?;
        ensure!(
            checked.contains(&format!(
                "node {node} connects to the manager at 192.0.2.10:842, mutual TLS"
            )),
            "drover-agent --check on {node} said:\n{checked}"
        );
    }
    wait_online(s, &["web1", "db1"])?;
    s.note(format!(
        "agents online after their start: {:.2} s",
        t.elapsed().as_secs_f64()
    ));
    let manager = s.m("manager")?;
    eventually("the manager's status", T, || {
        let status = prop(manager, "drover-manager", "StatusText")?;
        Ok(((status == "2 of 2 nodes online").then_some(()), status))
    })?;
    for node in ["web1", "db1"] {
        let status = prop(s.m(node)?, "drover-agent", "StatusText")?;
        ensure!(
            status == format!("connected to 192.0.2.10:842 as {node}"),
            "{node}: {status}"
        );
    }
    let log = manager.must("journalctl -q --no-pager -o cat -u drover-manager")?;
    for node in ["web1", "db1"] {
        ensure!(
            log.lines().any(
                |l| l.starts_with(&format!("node {node} (certificate serial "))
                    && l.contains(&"registered over TLS from 192.0.2.".to_string()),
            ),
            "the manager's journal does not name {node} in its registration:\n{log}"
        );
    }
    Ok(())
}

/// The commented TLS lines of the shipped `/etc/drover` files, uncommented,
/// name exactly the files the docs put in place, and their `drover-pki`
/// commands use the docs' CA directory.
fn conffiles(s: &mut Suite) -> Result<()> {
    let manager = s.m("manager")?;
    let shipped = manager.read("/etc/drover/manager.conf")?;
    let tls: String = shipped
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| l.starts_with("TLS"))
        .map(|l| format!("{l}\n"))
        .collect();
    ensure!(tls.lines().count() == 4, "manager.conf's TLS lines: {tls}");
    manager.write(
        "/root/conffile-manager.conf",
        &format!("[drover-manager]\nAllowedNodeNames=web1\n{tls}"),
    )?;
    manager.must(
        "/usr/libexec/drover-manager --check --no-default-config -c /root/conffile-manager.conf",
    )?;
    for line in shipped.lines().filter(|l| l.contains("drover-pki ")) {
        ensure!(
            line.contains(&"drover-pki ".to_string()) && line.contains(CA_DIR),
            "manager.conf: {line}"
        );
    }
    let web1 = s.m("web1")?;
    let shipped = web1.read("/etc/drover/agent.conf")?;
    let tls: String = shipped
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| l.starts_with("TLSCertificate") || l.starts_with("TLSPrivateKey"))
        .map(|l| format!("{}\n", l.replace("node1", "web1")))
        .collect();
    ensure!(tls.lines().count() == 3, "agent.conf's TLS lines: {tls}");
    web1.write(
        "/root/conffile-agent.conf",
        &format!("[drover-agent]\nNodeName=web1\nControllerHost=192.0.2.10\n{tls}"),
    )?;
    web1.must(
        "/usr/libexec/drover-agent --check --no-default-config -c /root/conffile-agent.conf",
    )?;
    ensure!(
        shipped.contains(CA_DIR),
        "agent.conf does not name {CA_DIR}"
    );
    Ok(())
}

/// `docs/examples/need-db.service` on web1, `db.service` on db1.
fn seed_example(s: &mut Suite) -> Result<()> {
    let example = std::fs::read_to_string(repo().join("docs/examples/need-db.service"))?;
    let path = example
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .context("need-db's path")?;
    let unit = example
        .replace("bar_db", "db1_db")
        .replace("/usr/bin/db-user", "/bin/sleep infinity");
    let (web1, db1) = (s.m("web1")?, s.m("db1")?);
    write_unit(
        db1,
        "db.service",
        "[Service]\nExecStart=/bin/sleep infinity\n",
    )?;
    web1.write(path, &unit)?;
    web1.must("systemctl daemon-reload")?;
    let t = Instant::now();
    web1.must("systemctl start need-db.service")?;
    s.note(format!(
        "need-db on web1 → db on db1: systemctl start returned after {:.0} ms",
        t.elapsed().as_secs_f64() * 1000.0
    ));
    ensure!(
        prop(db1, "db.service", "ActiveState")? == "active",
        "db is not active on db1"
    );
    ensure!(
        prop(db1, "drover-dep@db.service.service", "ActiveState")? == "active",
        "no dep on db1"
    );
    ensure!(
        prop(web1, "drover-proxy@db1_db.service", "ActiveState")? == "active",
        "the proxy is not active"
    );
    // The proxy ran in the shipped sandbox: no network, no capability, and
    // the dep's process as a dynamic user.
    ensure!(
        prop(web1, "drover-proxy@db1_db.service", "PrivateNetwork")? == "yes",
        "proxy not sandboxed"
    );
    ensure!(
        prop(db1, "drover-dep@db.service.service", "DynamicUser")? == "yes",
        "dep not sandboxed"
    );
    let journal = web1.must("journalctl -q --no-pager -o cat -u drover-proxy@db1_db.service")?;
    ensure!(
        journal.contains("drover-proxy: db.service on node db1 is active"),
        "{journal}"
    );
    let proxies = s.m("manager")?.must("droverctl proxies")?;
    ensure!(
        proxies.lines().any(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            cells == ["web1", "db1", "db.service", "active", "active", "1"]
        }),
        "droverctl proxies:\n{proxies}"
    );
    Ok(())
}

/// A target that fails and one that does not exist: the proxy fails, the
/// requester does not start, the proxy's journal says why, droverctl names
/// the failed dependency.
fn failing_targets(s: &mut Suite) -> Result<()> {
    let (web1, db1) = (s.m("web1")?, s.m("db1")?);
    write_unit(db1, "bad.service", "[Service]\nExecStart=/bin/false\n")?;
    for target in ["bad", "nosuch"] {
        write_unit(
            web1,
            &format!("need-{target}.service"),
            &format!(
                "[Unit]\nRequires=drover-proxy@db1_{target}.service\nAfter=drover-proxy@db1_{target}.service\n\
                 [Service]\nExecStart=/bin/sleep infinity\n"
            ),
        )?;
    }
    let out = s
        .m("manager")?
        .sh("droverctl start web1 need-bad.service")?;
    ensure!(
        out.code == Some(1),
        "droverctl start need-bad: {}",
        out.text()
    );
    ensure!(
        out.text().contains("dependency") && out.text().contains("drover-proxy@db1_bad.service"),
        "droverctl does not say which dependency failed:\n{}",
        out.text()
    );
    let said = web1.must("journalctl -q --no-pager -o cat -u drover-proxy@db1_bad.service")?;
    ensure!(
        said.contains(
            "drover-proxy: cannot start bad.service on node db1: bad.service on node db1 is failed"
        ),
        "{said}"
    );
    ensure!(
        prop(web1, "need-bad.service", "ActiveState")? != "active",
        "need-bad runs"
    );
    let out = web1.sh("systemctl start need-nosuch.service")?;
    ensure!(!out.ok(), "need-nosuch started");
    let said = web1.must("journalctl -q --no-pager -o cat -u drover-proxy@db1_nosuch.service")?;
    ensure!(
        said.contains("cannot start nosuch.service on node db1: unit nosuch.service on node db1 cannot be started: not found"),
        "{said}"
    );
    Ok(())
}

/// `Requires=` on a target that exits as soon as it started: the requester
/// does not keep running, whichever way the timing falls, and the proxy's
/// journal says the target ended.
fn exiting_target(s: &mut Suite) -> Result<()> {
    let (web1, db1) = (s.m("web1")?, s.m("db1")?);
    write_unit(db1, "exits.service", "[Service]\nExecStart=/bin/true\n")?;
    write_unit(
        web1,
        "need-exits.service",
        "[Unit]\nRequires=drover-proxy@db1_exits.service\nAfter=drover-proxy@db1_exits.service\n\
         [Service]\nExecStart=/bin/sleep infinity\n",
    )?;
    for _ in 0..3 {
        let _ = web1.sh("systemctl start need-exits.service")?;
        wait_active(web1, "need-exits.service", "inactive")?;
        let said =
            web1.must("journalctl -q --no-pager -o cat -u drover-proxy@db1_exits.service")?;
        ensure!(said.contains("exits.service on node db1"), "{said}");
        web1.must("systemctl reset-failed")?;
    }
    Ok(())
}

/// A unit file written for BlueChi (`bluechi-proxy@`), with the optional
/// package's templates, in their shipped sandbox.
fn bluechi_names(s: &mut Suite) -> Result<()> {
    let (web1, db1) = (s.m("web1")?, s.m("db1")?);
    write_unit(
        db1,
        "db2.service",
        "[Service]\nExecStart=/bin/sleep infinity\n",
    )?;
    write_unit(
        web1,
        "need-db2.service",
        "[Unit]\nWants=bluechi-proxy@db1_db2.service\nAfter=bluechi-proxy@db1_db2.service\n\
         [Service]\nExecStart=/bin/sleep infinity\n",
    )?;
    web1.must("systemctl start need-db2.service")?;
    ensure!(
        prop(db1, "db2.service", "ActiveState")? == "active",
        "db2 is not active"
    );
    ensure!(
        prop(web1, "bluechi-proxy@db1_db2.service", "PrivateNetwork")? == "yes",
        "not sandboxed"
    );
    web1.must("systemctl stop need-db2.service")?;
    wait_active(web1, "bluechi-proxy@db1_db2.service", "inactive")
}

/// `drover-pki revoke` + `systemctl reload drover-manager`: the node's
/// session is dropped, the manager's journal names it, the agent says its
/// certificate is revoked.
fn revocation(s: &mut Suite) -> Result<()> {
    let manager = s.m("manager")?;
    let mark = journal_mark(manager)?;
    manager.must(&format!(
        "drover-pki revoke {CA_DIR} web1 && cp {CA_DIR}/crl.pem {TLS_DIR}/crl.pem"
    ))?;
    let t = Instant::now();
    manager.must("systemctl reload drover-manager")?;
    eventually("web1 offline", T, || {
        let out = manager.must("droverctl status web1")?;
        Ok((out.contains("offline").then_some(()), out))
    })?;
    s.note(format!(
        "revocation: web1 offline {:.2} s after the reload began",
        t.elapsed().as_secs_f64()
    ));
    let said = journal_since(manager, "drover-manager", &mark)?;
    ensure!(
        said.lines().any(|l| l.starts_with(
            "config reload: dropping the session of node web1: its certificate (serial "
        ) && l.contains("is revoked")),
        "the manager's journal:\n{said}"
    );
    let web1 = s.m("web1")?;
    eventually("web1's agent says why", T, || {
        let status = prop(web1, "drover-agent", "StatusText")?;
        Ok((status
            .starts_with("refused by the manager at 192.0.2.10:842 (the manager refused this node's certificate: it is revoked)")
            .then_some(()), status))
    })?;
    let manager_status = prop(manager, "drover-manager", "StatusText")?;
    ensure!(manager_status == "1 of 2 nodes online", "{manager_status}");
    Ok(())
}

/// A new certificate for web1 (`drover-pki node --force`) and
/// `systemctl reload drover-agent`: it registers again with it. db1's
/// certificate rotated the same way while connected: its session stays.
fn rotation(s: &mut Suite) -> Result<()> {
    let manager = s.m("manager")?;
    let mark = journal_mark(manager)?;
    for node in ["web1", "db1"] {
        manager.must(&format!("drover-pki node --force {CA_DIR} {node}"))?;
        let m = s.m(node)?;
        for ext in ["pem", "key"] {
            std::fs::copy(
                manager.path(&format!("{CA_DIR}/nodes/{node}.{ext}")),
                m.path(&format!("{TLS_DIR}/{node}.{ext}")),
            )?;
        }
        m.must("systemctl reload drover-agent")?;
        let said = m.must("journalctl -q --no-pager -o cat -u drover-agent")?;
        ensure!(
            said.contains("TLS files read again (certificate serial"),
            "{node}: {said}"
        );
    }
    wait_online(s, &["web1", "db1"])?;
    let said = journal_since(manager, "drover-manager", &mark)?;
    ensure!(
        said.lines()
            .any(|l| l.starts_with("node web1 (certificate serial ")
                && l.contains("registered over TLS")),
        "web1 did not register again:\n{said}"
    );
    ensure!(
        !said.contains("node db1 disconnected"),
        "the rotation dropped db1:\n{said}"
    );
    Ok(())
}

/// Units whose state must not change across a manager reboot.
const KEPT: &[(&str, &str)] = &[
    ("web1", "need-db.service"),
    ("web1", "drover-proxy@db1_db.service"),
    ("db1", "db.service"),
    ("db1", "drover-dep@db.service.service"),
];

fn snapshot(s: &Suite) -> Result<Vec<String>> {
    KEPT.iter()
        .map(|(m, u)| {
            let m = s.m(m)?;
            Ok(format!(
                "{u}: {} since {}",
                prop(m, u, "ActiveState")?,
                prop(m, u, "ActiveEnterTimestampMonotonic")?
            ))
        })
        .collect()
}

/// The manager machine reboots while need-db on web1 uses db on db1:
/// no unit on the nodes changes state, the manager comes back enabled,
/// the dependency is tracked again, and the agents saw a clean close.
fn manager_reboot(s: &mut Suite) -> Result<()> {
    let before = snapshot(s)?;
    ensure!(
        before.iter().all(|l| l.contains(": active since ")),
        "{before:#?}"
    );
    let marks: Vec<String> = ["web1", "db1"]
        .iter()
        .map(|n| journal_mark(s.m(n)?))
        .collect::<Result<_>>()?;
    let t = Instant::now();
    s.fleet.reboot("manager")?;
    wait_online(s, &["web1", "db1"])?;
    s.note(format!(
        "manager reboot: both nodes online again {:.1} s after the power-off began",
        t.elapsed().as_secs_f64()
    ));
    let manager = s.m("manager")?;
    eventually("the dependency is tracked again", T, || {
        let proxies = manager.must("droverctl proxies")?;
        let back = proxies.lines().any(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            cells == ["web1", "db1", "db.service", "active", "active", "1"]
        });
        Ok((back.then_some(()), proxies))
    })?;
    let after = snapshot(s)?;
    ensure!(
        before == after,
        "units changed across the reboot:\nbefore {before:#?}\nafter {after:#?}"
    );
    for (node, mark) in ["web1", "db1"].iter().zip(&marks) {
        let said = journal_since(s.m(node)?, "drover-agent", mark)?;
        ensure!(
            said.contains(
                "lost the link to the manager at 192.0.2.10:842: the manager closed the connection"
            ),
            "{node}: {said}"
        );
        ensure!(
            !said.contains("close_notify"),
            "{node} saw a TLS stream cut:\n{said}"
        );
    }
    Ok(())
}

/// `drover-manager.socket` enabled (README, docs/packaging.md): the next
/// agent that connects starts the manager.
fn socket_activation(s: &mut Suite) -> Result<()> {
    let manager = s.m("manager")?;
    let mark = journal_mark(manager)?;
    manager.must(
        "systemctl stop drover-manager.service && systemctl enable --now drover-manager.socket",
    )?;
    wait_online(s, &["web1", "db1"])?;
    let manager = s.m("manager")?;
    ensure!(
        prop(manager, "drover-manager.service", "TriggeredBy")? == "drover-manager.socket",
        "not socket-activated"
    );
    let said = journal_since(manager, "drover-manager", &mark)?;
    ensure!(
        said.contains("using the socket-activated listener on [::]:842"),
        "{said}"
    );
    Ok(())
}

/// `docs/security.md`, "Local access": root may do anything; a member of
/// `drover-readers` may read (after `systemctl reload dbus`) and nothing
/// more; any other user gets nothing.
fn dbus_policy(s: &mut Suite) -> Result<()> {
    let manager = s.m("manager")?;
    manager.must("useradd -m alice && useradd -m bob")?;
    let as_user = |user: &str, cmd: &str| manager.sh(&format!("runuser -u {user} -- {cmd}"));
    // The docs' commands, in their order; without the last one the group's
    // rules are not in force yet (which is why the docs say it).
    manager.must("groupadd -r drover-readers && usermod -aG drover-readers alice")?;
    let out = as_user("alice", "droverctl status")?;
    ensure!(
        !out.ok(),
        "the group worked before dbus-daemon was reloaded: the docs say more than needed"
    );
    manager.must("systemctl reload dbus")?;
    let read_only = [
        "droverctl status",
        "droverctl list-units web1",
        "droverctl proxies",
        "busctl --system call org.eclipse.bluechi /org/eclipse/bluechi org.eclipse.bluechi.Controller GetNode s web1",
        "busctl --system call org.eclipse.bluechi /org/eclipse/bluechi/node/web1 org.eclipse.bluechi.Node GetUnitProperty sss need-db.service org.freedesktop.systemd1.Unit ActiveState",
    ];
    let changing = [
        "droverctl stop web1 need-db.service",
        "busctl --system call org.eclipse.bluechi /org/eclipse/bluechi io.drover.Controller Reload",
        "busctl --system call org.eclipse.bluechi /org/eclipse/bluechi/node/web1 org.eclipse.bluechi.Node SetLogLevel s DEBUG",
    ];
    for cmd in read_only {
        let out = as_user("alice", cmd)?;
        ensure!(out.ok(), "drover-readers member: {cmd}: {}", out.text());
        let out = as_user("bob", cmd)?;
        ensure!(
            !out.ok() && out.text().to_lowercase().contains("denied"),
            "unprivileged user: {cmd}: {}",
            out.text()
        );
    }
    for cmd in changing {
        let out = as_user("alice", cmd)?;
        ensure!(
            !out.ok() && out.text().to_lowercase().contains("denied"),
            "drover-readers member may: {cmd}: {}",
            out.text()
        );
    }
    ensure!(
        prop(s.m("web1")?, "need-db.service", "ActiveState")? == "active",
        "a reader stopped need-db"
    );
    // Root may change things.
    manager.must("droverctl restart web1 need-db.service")?;
    Ok(())
}

/// `systemd-analyze security` of the units as loaded in the machines (the
/// real unit files, instances running) stays within `make units`' bounds.
fn unit_scores(s: &mut Suite) -> Result<()> {
    let checks = [
        ("manager", "drover-manager.service", 2.5),
        ("web1", "drover-agent.service", 2.0),
        ("web1", "drover-proxy@db1_db.service", 1.0),
        ("db1", "drover-dep@db.service.service", 0.5),
    ];
    for (machine, unit, bound) in checks {
        let out = s
            .m(machine)?
            .must(&format!("systemd-analyze security --no-pager '{unit}'"))?;
        let score: f64 = out
            .lines()
            .find_map(|l| l.split_once(&format!("{unit}: ")).map(|(_, r)| r))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no score for {unit}:\n{out}"))?;
        s.note(format!(
            "systemd-analyze security {unit} on {machine}: {score}"
        ));
        ensure!(score <= bound, "{unit}: {score} > {bound}");
    }
    Ok(())
}
