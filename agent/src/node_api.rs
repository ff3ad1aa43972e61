//! The rest of the node API: requests that are one systemd call each
//! (unit properties, unit files, kill, freeze/thaw, reset-failed, default
//! target), the agent's log level, and job metrics (BlueChi's `Node` and
//! `Metrics` interfaces: `org.eclipse.bluechi.Node.xml` and `….Metrics.xml` in
//! `dist/usr/share/dbus-1/interfaces/`).
//!
//! Everything from the manager is validated here before systemd sees it,
//! even where the manager validated it too — the agent never trusts the wire:
//! kill targets must be `main`, `control` or `all` and signals 1..=64;
//! interface and property names must be D-Bus names; log levels are BlueChi's
//! words (`DEBUG`, `INFO`, `WARN`, `ERROR`). Bad input is
//! `org.freedesktop.DBus.Error.InvalidArgs` and nothing is called. Unit names
//! arrive as [`drover_protocol::UnitName`]s: a frame with an invalid one does
//! not even decode.
//!
//! systemd's errors keep their D-Bus names; a method an old systemd lacks is
//! `org.freedesktop.DBus.Error.UnknownMethod` with a message naming it.
//!
//! Log level: the tracing subscriber is process-wide, and so is the handle
//! that changes its level — the binary installs it with [`use_log_handle`]
//! right after creating it; `SetLogLevel` applies levels through it and
//! updates the level the local API shows. Without a handle (tests, library
//! use) the level is validated and recorded only.
//!
//! Metrics: while the manager has them enabled (per session: a new session
//! starts with them off, the manager re-enables them on registration), every
//! job the agent queued reports `Event::JobMetrics { unit, method, micros }`
//! after its `JobDone` — micros from the call to systemd to its `JobRemoved`.

use crate::link::status::AgentStatus;
use crate::systemd::api::Systemd;
use drover_config::logging::{LogHandle, LogLevel};
use drover_protocol::error_names::INVALID_ARGS;
use drover_protocol::{Event, RemoteError, Request, Response, UnitName};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Most jobs whose start time is remembered for metrics at once; beyond it,
/// new jobs go unmeasured (systemd itself queues far fewer).
pub const MAX_MEASURED_JOBS: usize = 16_384;
/// Most files in one `EnableUnitFiles` / `DisableUnitFiles`.
pub const MAX_FILES: usize = 4096;

fn invalid(message: impl Into<String>) -> RemoteError {
    RemoteError::new(INVALID_ARGS, message)
}

struct JobStart {
    unit: UnitName,
    method: &'static str,
    at: Instant,
}

/// Node-wide settings the manager can change: metrics and the log level.
#[derive(Default)]
pub struct NodeState {
    metrics: AtomicBool,
    starts: Mutex<HashMap<(u64, u32), JobStart>>,
    level: Mutex<Option<LogLevel>>,
}

/// The handle of the process's tracing subscriber (see the module docs).
static LOG_HANDLE: OnceLock<LogHandle> = OnceLock::new();

/// Makes `SetLogLevel` change the level of the subscriber behind `handle`.
/// The first call wins.
pub fn use_log_handle(handle: LogHandle) {
    let _ = LOG_HANDLE.set(handle);
}

impl NodeState {
    fn starts(&self) -> MutexGuard<'_, HashMap<(u64, u32), JobStart>> {
        self.starts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The level last set by `SetLogLevel`, if any.
    pub fn log_level(&self) -> Option<LogLevel> {
        *self.level.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn metrics_enabled(&self) -> bool {
        self.metrics.load(Ordering::Relaxed)
    }

    /// A new manager session: metrics off until it asks again.
    pub fn session_started(&self) {
        self.metrics.store(false, Ordering::Relaxed);
        self.starts().clear();
    }

    /// A job call is about to go to systemd (measured only with metrics on).
    pub fn job_call(&self, epoch: u64, job_id: u32, unit: &UnitName, method: &'static str) {
        if !self.metrics_enabled() {
            return;
        }
        let mut starts = self.starts();
        if starts.len() < MAX_MEASURED_JOBS {
            starts.insert(
                (epoch, job_id),
                JobStart {
                    unit: unit.clone(),
                    method,
                    at: Instant::now(),
                },
            );
        }
    }

    /// The job call failed: no job, nothing to measure.
    pub fn job_call_failed(&self, epoch: u64, job_id: u32) {
        self.starts().remove(&(epoch, job_id));
    }

    /// The job ended (`JobDone` sent): its metrics event, if measured and
    /// metrics are still on.
    pub fn job_done(&self, epoch: u64, job_id: u32) -> Option<Event> {
        let start = {
            let mut starts = self.starts();
            if starts.is_empty() {
                return None;
            }
            starts.remove(&(epoch, job_id))?
        };
        if !self.metrics_enabled() {
            return None;
        }
        let micros = u64::try_from(start.at.elapsed().as_micros()).unwrap_or(u64::MAX);
        Some(Event::JobMetrics {
            unit: start.unit,
            method: start.method.to_string(),
            micros,
        })
    }

    fn set_metrics(&self, on: bool) {
        self.metrics.store(on, Ordering::Relaxed);
        if !on {
            self.starts().clear();
        }
    }
}

/// `KillUnit`'s `whom`, as BlueChi and systemd spell them.
pub const KILL_WHOM: [&str; 3] = ["main", "control", "all"];

/// Checks `KillUnit` arguments.
pub fn check_kill(whom: &str, signal: i32) -> Result<(), RemoteError> {
    if !KILL_WHOM.contains(&whom) {
        return Err(invalid(format!(
            "invalid kill target '{}': expected main, control or all",
            whom.chars().take(32).collect::<String>()
        )));
    }
    if !(1..=64).contains(&signal) {
        return Err(invalid(format!(
            "invalid signal number {signal}: expected 1 to 64"
        )));
    }
    Ok(())
}

fn check_interface(interface: &str, empty_ok: bool) -> Result<(), RemoteError> {
    if interface.is_empty() && empty_ok {
        return Ok(());
    }
    zbus::names::InterfaceName::try_from(interface)
        .map(|_| ())
        .map_err(|_| {
            invalid(format!(
                "invalid D-Bus interface name '{}'",
                interface.chars().take(64).collect::<String>()
            ))
        })
}

fn check_property(property: &str) -> Result<(), RemoteError> {
    zbus::names::MemberName::try_from(property)
        .map(|_| ())
        .map_err(|_| {
            invalid(format!(
                "invalid D-Bus property name '{}'",
                property.chars().take(64).collect::<String>()
            ))
        })
}

fn check_files(files: &[String]) -> Result<(), RemoteError> {
    if files.is_empty() {
        return Err(invalid("no unit files given"));
    }
    if files.len() > MAX_FILES {
        return Err(invalid(format!(
            "{} unit files given, at most {MAX_FILES} allowed",
            files.len()
        )));
    }
    if let Some(bad) = files
        .iter()
        .find(|f| f.is_empty() || f.contains('\0') || f.len() > 4096)
    {
        return Err(invalid(format!(
            "invalid unit file name '{}'",
            bad.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// Handles the requests of this module; `None` for requests it does not own.
/// `node` is this module's state; `status` shows the log level on the local
/// API.
pub async fn handle<S: Systemd>(
    systemd: &S,
    node: &NodeState,
    status: &AgentStatus,
    req: &Request,
) -> Option<Result<Response, RemoteError>> {
    let empty = |r: Result<(), RemoteError>| r.map(|()| Response::Empty);
    Some(match req {
        Request::ListUnitFiles => systemd.list_unit_files().await.map(Response::UnitFiles),
        Request::GetUnitProperties { unit, interface } => match check_interface(interface, true) {
            Ok(()) => systemd
                .get_unit_properties(unit.as_str(), interface)
                .await
                .map(Response::Value),
            Err(e) => Err(e),
        },
        Request::GetUnitProperty {
            unit,
            interface,
            property,
        } => match check_interface(interface, false).and_then(|()| check_property(property)) {
            Ok(()) => systemd
                .get_unit_property(unit.as_str(), interface, property)
                .await
                .map(Response::Value),
            Err(e) => Err(e),
        },
        Request::SetUnitProperties {
            unit,
            runtime,
            properties,
        } => empty(
            systemd
                .set_unit_properties(unit.as_str(), *runtime, properties)
                .await,
        ),
        Request::FreezeUnit { unit } => empty(systemd.freeze_unit(unit.as_str(), true).await),
        Request::ThawUnit { unit } => empty(systemd.freeze_unit(unit.as_str(), false).await),
        Request::KillUnit { unit, whom, signal } => match check_kill(whom, *signal) {
            Ok(()) => empty(systemd.kill_unit(unit.as_str(), whom, *signal).await),
            Err(e) => Err(e),
        },
        Request::EnableUnitFiles {
            files,
            runtime,
            force,
        } => match check_files(files) {
            Ok(()) => systemd
                .enable_unit_files(files, *runtime, *force)
                .await
                .map(|(carries_install_info, changes)| Response::Changes {
                    carries_install_info,
                    changes,
                }),
            Err(e) => Err(e),
        },
        Request::DisableUnitFiles { files, runtime } => match check_files(files) {
            Ok(()) => systemd
                .disable_unit_files(files, *runtime)
                .await
                .map(|changes| Response::Changes {
                    carries_install_info: false,
                    changes,
                }),
            Err(e) => Err(e),
        },
        Request::GetUnitFileState { file } => match check_files(std::slice::from_ref(file)) {
            Ok(()) => systemd.get_unit_file_state(file).await.map(Response::Text),
            Err(e) => Err(e),
        },
        Request::ResetFailed => empty(systemd.reset_failed(None).await),
        Request::ResetFailedUnit { unit } => empty(systemd.reset_failed(Some(unit.as_str())).await),
        Request::GetDefaultTarget => systemd.get_default_target().await.map(Response::Text),
        Request::SetDefaultTarget { target, force } => systemd
            .set_default_target(target.as_str(), *force)
            .await
            .map(|changes| Response::Changes {
                carries_install_info: false,
                changes,
            }),
        Request::SetLogLevel { level } => match LogLevel::parse(level) {
            Some(parsed) => {
                if let Some(handle) = LOG_HANDLE.get() {
                    handle.set_level(parsed);
                }
                *node.level.lock().unwrap_or_else(|p| p.into_inner()) = Some(parsed);
                status.set_log_level(parsed.as_str());
                tracing::info!("log level set to {}", parsed.as_str());
                Ok(Response::Empty)
            }
            None => Err(invalid(format!(
                "invalid log level '{}': expected DEBUG, INFO, WARN or ERROR",
                level.chars().take(32).collect::<String>()
            ))),
        },
        Request::EnableMetrics => {
            node.set_metrics(true);
            Ok(Response::Empty)
        }
        Request::DisableMetrics => {
            node.set_metrics(false);
            Ok(Response::Empty)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::Script;
    use crate::test_rig::{Rig, next, unit};
    use drover_bus::marshal::{self, PropertyList, PropertyMap};
    use drover_protocol::JobKind;
    use drover_protocol::{Marshalled, ToManager};
    use std::time::Duration;

    async fn rig() -> Rig {
        Rig::new(5).await
    }

    async fn call(r: &mut Rig, id: u64, req: Request) -> Result<Response, RemoteError> {
        r.d.handle(1, id, req).await;
        match next(&mut r.rx).await {
            ToManager::Reply { id: got, result } if got == id => result,
            other => panic!("expected reply {id}, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn bad_kill_arguments_never_reach_systemd() {
        let mut r = rig().await;
        r.fake.add_unit("a.service", Script::Hang);
        for (whom, signal) in [
            ("main", 0),
            ("all", 65),
            ("all", -9),
            ("everyone", 9),
            ("", 15),
        ] {
            let e = call(
                &mut r,
                1,
                Request::KillUnit {
                    unit: unit("a.service"),
                    whom: whom.into(),
                    signal,
                },
            )
            .await
            .unwrap_err();
            assert_eq!(e.name, INVALID_ARGS, "{whom} {signal}: {e}");
        }
        assert!(
            !r.fake.calls().iter().any(|c| c.starts_with("KillUnit")),
            "{:?}",
            r.fake.calls()
        );
        for whom in KILL_WHOM {
            call(
                &mut r,
                2,
                Request::KillUnit {
                    unit: unit("a.service"),
                    whom: whom.into(),
                    signal: 64,
                },
            )
            .await
            .unwrap();
        }
        assert_eq!(
            r.fake.calls().last().map(String::as_str),
            Some("KillUnit a.service all 64")
        );
        // A unit systemd does not know: its error, with its name.
        let e = call(
            &mut r,
            3,
            Request::KillUnit {
                unit: unit("nope.service"),
                whom: "main".into(),
                signal: 15,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.name, "org.freedesktop.systemd1.NoSuchUnit");
    }

    #[tokio::test]
    async fn log_levels_are_bluechis_words() {
        let mut r = rig().await;
        for bad in ["debug", "TRACE", "", "INFO "] {
            let e = call(&mut r, 1, Request::SetLogLevel { level: bad.into() })
                .await
                .unwrap_err();
            assert_eq!(e.name, INVALID_ARGS);
            assert!(e.message.contains("DEBUG, INFO, WARN or ERROR"), "{e}");
        }
        assert_eq!(r.shared.node.log_level(), None, "nothing changed");
        call(
            &mut r,
            2,
            Request::SetLogLevel {
                level: "WARN".into(),
            },
        )
        .await
        .unwrap();
        assert_eq!(r.shared.node.log_level(), Some(LogLevel::Warn));
    }

    #[tokio::test]
    async fn properties_come_back_marshalled_and_names_are_checked() {
        let mut r = rig().await;
        r.fake.set_state("a.service", "active", "running");
        let v = call(
            &mut r,
            1,
            Request::GetUnitProperties {
                unit: unit("a.service"),
                interface: String::new(),
            },
        )
        .await
        .unwrap();
        let Response::Value(m) = v else {
            panic!("{v:?}")
        };
        let map: PropertyMap = marshal::decode(&m).unwrap();
        assert_eq!(
            String::try_from(map["ActiveState"].try_clone().unwrap()).unwrap(),
            "active"
        );
        for (interface, property) in [("not an interface", "Id"), ("org.x.Y", "bad-name")] {
            let e = call(
                &mut r,
                2,
                Request::GetUnitProperty {
                    unit: unit("a.service"),
                    interface: interface.into(),
                    property: property.into(),
                },
            )
            .await
            .unwrap_err();
            assert_eq!(e.name, INVALID_ARGS, "{e}");
        }
        // SetUnitProperties: the wrong D-Bus type is refused before systemd.
        let wrong = marshal::encode(&PropertyMap::new()).unwrap();
        let e = call(
            &mut r,
            3,
            Request::SetUnitProperties {
                unit: unit("a.service"),
                runtime: true,
                properties: wrong,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.name, INVALID_ARGS);
        let garbage = Marshalled {
            signature: "a(sv)".into(),
            data: vec![0xff; 7],
        };
        let e = call(
            &mut r,
            4,
            Request::SetUnitProperties {
                unit: unit("a.service"),
                runtime: true,
                properties: garbage,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.name, INVALID_ARGS);
        assert!(
            !r.fake
                .calls()
                .iter()
                .any(|c| c.starts_with("SetUnitProperties"))
        );
        let list: PropertyList = vec![("CPUWeight".into(), zbus::OwnedVariant::from(50u64))];
        call(
            &mut r,
            5,
            Request::SetUnitProperties {
                unit: unit("a.service"),
                runtime: true,
                properties: marshal::encode(&list).unwrap(),
            },
        )
        .await
        .unwrap();
        assert_eq!(
            r.fake.calls().last().map(String::as_str),
            Some("SetUnitProperties a.service true CPUWeight")
        );
    }

    #[tokio::test]
    async fn unit_file_requests() {
        let mut r = rig().await;
        let got = call(
            &mut r,
            1,
            Request::EnableUnitFiles {
                files: vec!["a.service".into()],
                runtime: false,
                force: true,
            },
        )
        .await
        .unwrap();
        assert!(matches!(
            got,
            Response::Changes { carries_install_info: true, ref changes } if changes.len() == 1 && changes[0].0 == "symlink"
        ));
        let e = call(
            &mut r,
            2,
            Request::DisableUnitFiles {
                files: vec![],
                runtime: false,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.name, INVALID_ARGS);
        let got = call(&mut r, 3, Request::GetDefaultTarget).await.unwrap();
        assert_eq!(got, Response::Text("default.target".into()));
    }

    #[tokio::test]
    async fn metrics_follow_every_job_while_enabled_and_reset_per_session() {
        let mut r = rig().await;
        r.fake.add_unit("a.service", Script::Finish("done".into()));
        let start = |job_id| Request::UnitJob {
            kind: JobKind::Start,
            unit: unit("a.service"),
            mode: "replace".into(),
            job_id,
        };
        // Off: JobDone only.
        call(&mut r, 1, start(1)).await.unwrap();
        next(&mut r.rx).await; // running
        assert!(matches!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobDone { job_id: 1, .. })
        ));
        call(&mut r, 2, Request::EnableMetrics).await.unwrap();
        call(&mut r, 3, start(2)).await.unwrap();
        next(&mut r.rx).await; // running
        assert!(matches!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobDone { job_id: 2, .. })
        ));
        match next(&mut r.rx).await {
            ToManager::Event(Event::JobMetrics {
                unit: u,
                method,
                micros,
            }) => {
                assert_eq!(u.as_str(), "a.service");
                assert_eq!(method, "StartUnit");
                assert!(micros < 5_000_000, "{micros}");
            }
            other => panic!("expected metrics, got {other:?}"),
        }
        // StartTransientUnit is a tracked job too, with its own method name.
        let props: PropertyList = vec![];
        let aux: marshal::AuxUnits = vec![];
        call(
            &mut r,
            4,
            Request::StartTransientUnit {
                unit: unit("t.service"),
                mode: "fail".into(),
                properties: marshal::encode(&props).unwrap(),
                aux: marshal::encode(&aux).unwrap(),
                job_id: 3,
            },
        )
        .await
        .unwrap();
        next(&mut r.rx).await; // running
        assert_eq!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobDone {
                job_id: 3,
                result: "done".into()
            })
        );
        assert!(matches!(
            next(&mut r.rx).await,
            ToManager::Event(Event::JobMetrics { method, .. }) if method == "StartTransientUnit"
        ));
        // A failed call is no job: no metrics either.
        let e = call(
            &mut r,
            6,
            Request::UnitJob {
                kind: JobKind::Start,
                unit: unit("missing.service"),
                mode: "replace".into(),
                job_id: 5,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.name, "org.freedesktop.systemd1.NoSuchUnit");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(r.rx.try_recv().is_err());
        // A new session starts with metrics off.
        r.shared.session_started(2, 6);
        assert!(!r.shared.node.metrics_enabled());
    }
}
