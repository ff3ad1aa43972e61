//! `scripts/bluechi-bin-dir`, which lets the benchmarks run BlueChi in drover's
//! sandbox, on a stand-in for a BlueChi build (CI has no BlueChi): what it
//! refuses (one line, exit 2, nothing made), and what its wrappers hand to
//! BlueChi's programs when the sandbox runs them as drover's.

use drover_testkit::process::{Run, TempDir};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bluechi-bin-dir")
}

fn run(args: &[&Path]) -> Run {
    Command::new(script())
        .args(args)
        .output()
        .expect("the script runs")
        .into()
}

fn executable(path: &Path, text: &str) {
    write(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A program that records its arguments, then the file after `-c`, in `$FAKE_LOG`.
const RECORDER: &str = "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_LOG\"\n\
                        echo ---- >> \"$FAKE_LOG\"\ncat \"$2\" >> \"$FAKE_LOG\"\n";

/// What the script reads of a BlueChi build, and drover's three binaries.
struct Fake {
    dir: TempDir,
    build: PathBuf,
    drover: PathBuf,
}

impl Fake {
    fn new(tag: &str) -> Fake {
        let dir = TempDir::new(tag);
        let fake = Fake {
            build: dir.join("build"),
            drover: dir.join("drover"),
            dir,
        };
        fake.meson(&format!(
            r#"{{"directories": {{"source": "{}"}}}}"#,
            fake.source().display()
        ));
        fake.options("user");
        for program in ["controller", "agent", "proxy"] {
            executable(
                &fake.build.join(format!("src/{program}/bluechi-{program}")),
                RECORDER,
            );
        }
        write(
            &fake.source().join("systemd-units/bluechi-dep@.service"),
            "[Unit]\nDescription=dep %i\n",
        );
        write(
            &fake.source().join("config/controller/controller.conf"),
            "[bluechi-controller]\n",
        );
        write(
            &fake.source().join("config/agent/agent.conf"),
            "[bluechi-agent]\n",
        );
        for name in ["drover-manager", "drover-agent", "drover-proxy"] {
            executable(&fake.drover.join(name), "#!/bin/sh\n");
        }
        fake
    }

    fn source(&self) -> PathBuf {
        self.dir.join("source")
    }

    fn prefix(&self) -> PathBuf {
        self.dir.join("prefix")
    }

    fn out(&self) -> PathBuf {
        self.dir.join("out")
    }

    fn meson(&self, info: &str) {
        write(&self.build.join("meson-info/meson-info.json"), info);
    }

    fn options(&self, api_bus: &str) {
        write(
            &self.build.join("meson-info/intro-buildoptions.json"),
            &format!(
                r#"[{{"name": "api_bus", "value": "{api_bus}"}},
                    {{"name": "prefix", "value": "{}"}},
                    {{"name": "datadir", "value": "share"}}]"#,
                self.prefix().display()
            ),
        );
    }

    fn run(&self) -> Run {
        run(&[
            &self.build,
            &self.out(),
            Path::new("--drover"),
            &self.drover,
        ])
    }
}

/// Runs `wrapper` as the sandbox runs drover's daemon (`--no-default-config -c
/// CONF --bus ADDR`, the node's `XDG_CONFIG_HOME` under `node`); returns the
/// arguments and the config file the recorder standing in for BlueChi's program got.
fn wrapped(wrapper: &Path, conf: &Path, node: &TempDir) -> (String, String) {
    let log = node.join("recorded");
    let status = Command::new(wrapper)
        .args([Path::new("--no-default-config"), Path::new("-c"), conf])
        .args(["--bus", "unix:path=/nowhere"])
        .env("XDG_CONFIG_HOME", node.join("config"))
        .env("FAKE_LOG", &log)
        .status()
        .expect("the wrapper runs");
    assert!(status.success());
    let recorded = read(&log);
    let (args, config) = recorded.split_once("----\n").expect("args, then config");
    (args.to_owned(), config.to_owned())
}

/// Refused with one line naming `expected`, exit 2, and nothing made.
fn refused(fake: &Fake, run: Run, expected: &str) {
    let (code, stdout, stderr) = run.parts();
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("bluechi-bin-dir: "), "{stderr}");
    assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    assert!(!fake.out().exists(), "made {}", fake.out().display());
    assert!(!fake.prefix().exists(), "made {}", fake.prefix().display());
}

#[test]
fn no_arguments_is_a_usage_error() {
    let (code, _, stderr) = run(&[]).parts();
    assert_eq!(code, 2);
    assert!(stderr.contains("usage: bluechi-bin-dir"), "{stderr}");
}

#[test]
fn what_is_not_a_bluechi_build_for_the_session_bus_is_refused() {
    let fake = Fake::new("bbd-nobuild");
    let missing = fake.dir.join("nothing");
    let out = fake.out();
    refused(
        &fake,
        run(&[&missing, &out]),
        "is not a configured meson build directory",
    );

    let cases: &[(&str, &str, &str)] = &[
        (
            "not json",
            "[]",
            "is not a configured meson build directory",
        ),
        ("{}", "[]", "no 'directories'"),
        (
            r#"{"directories": {"source": "/x"}}"#,
            r#"{"prefix": "/usr"}"#,
            "an entry of the wrong type",
        ),
        (
            r#"{"directories": {"source": "/x"}}"#,
            r#"[{"name": "api_bus", "value": "user"}]"#,
            "no 'prefix'",
        ),
        (
            r#"{"directories": {"source": 7}}"#,
            r#"[{"name": "prefix", "value": "/usr"}]"#,
            "a path that is not a string",
        ),
    ];
    for (info, options, expected) in cases {
        let fake = Fake::new("bbd-garbage");
        fake.meson(info);
        write(
            &fake.build.join("meson-info/intro-buildoptions.json"),
            options,
        );
        refused(&fake, fake.run(), expected);
    }

    let fake = Fake::new("bbd-system");
    fake.options("system");
    refused(&fake, fake.run(), "must be configured with -Dapi_bus=user");
}

#[test]
fn missing_programs_and_files_are_named() {
    let fake = Fake::new("bbd-noagent");
    std::fs::remove_file(fake.build.join("src/agent/bluechi-agent")).expect("rm");
    refused(
        &fake,
        fake.run(),
        "bluechi-agent is missing: build BlueChi first",
    );

    let fake = Fake::new("bbd-nodep");
    std::fs::remove_file(fake.source().join("systemd-units/bluechi-dep@.service")).expect("rm");
    refused(&fake, fake.run(), "BlueChi's source tree?");

    let fake = Fake::new("bbd-nodrover");
    std::fs::remove_file(fake.drover.join("drover-proxy")).expect("rm");
    refused(&fake, fake.run(), "drover-proxy is missing (--drover");
}

#[test]
fn an_output_that_cannot_be_made_or_a_helper_path_no_unit_can_hold_is_refused() {
    let fake = Fake::new("bbd-out");
    write(&fake.dir.join("a-file"), "");
    let out = fake.dir.join("a-file/out");
    let drover = fake.drover.clone();
    let (code, _, stderr) = run(&[&fake.build, &out, Path::new("--drover"), &drover]).parts();
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot make"), "{stderr}");
    assert!(!fake.prefix().exists());

    // systemd would split the helper's path at the blank.
    let fake = Fake::new("bbd-blank");
    let spaced = fake.dir.join("a build");
    std::fs::rename(&fake.build, &spaced).expect("rename");
    let out = fake.out();
    let (code, _, stderr) = run(&[&spaced, &out, Path::new("--drover"), &drover]).parts();
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot go in a unit file"), "{stderr}");
}

#[test]
fn the_wrappers_give_bluechi_the_sandbox_configs_in_its_own_terms() {
    let fake = Fake::new("bbd-ok");
    let run = fake.run();
    assert!(run.success(), "{}", run.stderr);
    let blue = fake.out().join("bluechi");
    let ours = fake.out().join("drover");
    assert!(
        run.stdout
            .contains(&format!("DROVER_BIN_DIR={}", blue.display()))
    );
    assert!(
        run.stdout
            .contains(&format!("DROVER_BIN_DIR={}", ours.display()))
    );

    // drover's side: links to drover's own binaries, nothing in between.
    for name in ["drover-manager", "drover-agent", "drover-proxy"] {
        let target = std::fs::read_link(ours.join(name)).expect("a link");
        assert_eq!(target, fake.drover.join(name));
    }
    // BlueChi reads its default configuration files from its prefix.
    assert_eq!(
        read(&fake.prefix().join("share/bluechi/config/controller.conf")),
        "[bluechi-controller]\n"
    );
    assert_eq!(
        read(&fake.prefix().join("share/bluechi-agent/config/agent.conf")),
        "[bluechi-agent]\n"
    );

    // The agent, as the sandbox starts drover's.
    let node = TempDir::new("bbd-node");
    let units = node.join("config/systemd/user");
    std::fs::create_dir_all(&units).expect("mkdir");
    let conf = node.file(
        "agent.conf",
        "[drover-agent]\nNodeName=node2\nControllerPort=4242\nHeartbeatInterval=500\n\
         ControllerHeartbeatThreshold=2000\nLogTarget=stderr\n",
    );
    let (args, config) = wrapped(&blue.join("drover-agent"), &conf, &node);
    assert_eq!(args, format!("-c\n{}.bluechi\n--user\n", conf.display()));
    assert_eq!(
        config,
        "[bluechi-agent]\nNodeName=node2\nControllerPort=4242\nHeartbeatInterval=500\n\
         LogTarget=stderr\n"
    );
    assert_eq!(
        read(&units.join("bluechi-dep@.service")),
        "[Unit]\nDescription=dep %i\n"
    );
    let proxy = fake.build.join("src/proxy/bluechi-proxy");
    assert_eq!(
        read(&units.join("drover-proxy@.service.d/50-bluechi-proxy.conf")),
        format!(
            "[Service]\nExecStart=\nExecStart={p} --user create %i.service\n\
             ExecStop=\nExecStop={p} --user remove %i.service\n",
            p = proxy.display()
        )
    );

    // The manager, as the sandbox starts drover's.
    let conf = node.file(
        "manager.conf",
        "[drover-manager]\nControllerPort=4242\nLogLevel=DEBUG\n\n[node node2]\n\
         AllowDependenciesOn=node1\n",
    );
    let (args, config) = wrapped(&blue.join("drover-manager"), &conf, &node);
    assert_eq!(args, format!("-c\n{}.bluechi\n", conf.display()));
    assert_eq!(
        config,
        "[bluechi-controller]\nUseUDS=false\nControllerPort=4242\nLogLevel=INFO\n\n\
         [node node2]\nAllowDependenciesOn=node1\n"
    );

    // A second run over the first one: the same directories, links replaced.
    let again = fake.run();
    assert!(again.success(), "{}", again.stderr);
    assert_eq!(
        std::fs::read_link(ours.join("drover-proxy")).expect("a link"),
        fake.drover.join("drover-proxy")
    );
}
