//! `org.eclipse.bluechi.Node` at `/org/eclipse/bluechi/node/<escaped name>`.
//!
//! Exported for every allowed node, online or not. Calls on an offline node
//! fail with `org.eclipse.bluechi.Offline`; invalid unit names and job modes
//! fail with `InvalidArgs` before anything is sent to the agent; systemd's
//! errors from the node come back with their own names.

use crate::api::handles::Handles;
use crate::api::replies::{unit_files, units_of};
use crate::error::ApiError;
use crate::fanout::limit::{FleetCalls, Turn};
use crate::job_runner::JobRunner;
use crate::nodes::lifecycle::Nodes;
use crate::nodes::registry::OFFLINE;
use drover_bus::client::ChangeTuple as Change;
use drover_bus::marshal::{self, PropertyMap};
use drover_bus::systemd::UnitTuple;
use drover_config::LogLevel;
use drover_protocol::job::check_mode;
use drover_protocol::{JobKind, NodeName, RemoteError, Request, Response, UnitName};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use zbus::interface;
use zbus::message::Header;
use zbus::{OwnedObjectPath, OwnedVariant};

/// `KillUnit` targets systemd accepts.
pub const KILL_WHO: &[&str] = &["main", "control", "all"];
/// Largest signal number on Linux (SIGRTMAX).
pub const MAX_SIGNAL: i32 = 64;
/// Longest unit file argument (a path or a name) passed on.
const MAX_FILE_ARG: usize = 4096;
/// Most unit files in one call.
const MAX_FILES: usize = 1024;

fn unit_arg(name: &str) -> Result<UnitName, ApiError> {
    UnitName::new(name).map_err(|e| ApiError::invalid_args(e.to_string()))
}

/// A unit file argument: a unit name or an absolute path.
fn file_arg(file: &str) -> Result<String, ApiError> {
    let ok = if file.starts_with('/') {
        file.len() <= MAX_FILE_ARG && !file.contains('\0') && !file.contains("/../")
    } else {
        UnitName::new(file).is_ok()
    };
    if ok {
        Ok(file.to_owned())
    } else {
        Err(ApiError::invalid_args(format!(
            "invalid unit file '{}': expected a unit name or an absolute path",
            file.escape_default()
        )))
    }
}

fn files_arg(files: &[String]) -> Result<Vec<String>, ApiError> {
    if files.len() > MAX_FILES {
        return Err(ApiError::invalid_args(format!(
            "too many unit files (at most {MAX_FILES})"
        )));
    }
    files.iter().map(|f| file_arg(f)).collect()
}

/// `interface` of GetUnitProperty/ies: empty (all) or a D-Bus interface name.
fn interface_arg(interface: &str) -> Result<String, ApiError> {
    if interface.is_empty() || zbus::names::InterfaceName::try_from(interface).is_ok() {
        Ok(interface.to_owned())
    } else {
        Err(ApiError::invalid_args(format!(
            "invalid interface name '{}'",
            interface.escape_default()
        )))
    }
}

fn property_arg(property: &str) -> Result<String, ApiError> {
    if zbus::names::MemberName::try_from(property).is_ok() {
        Ok(property.to_owned())
    } else {
        Err(ApiError::invalid_args(format!(
            "invalid property name '{}'",
            property.escape_default()
        )))
    }
}

fn mode_arg(mode: &str) -> Result<String, ApiError> {
    check_mode(mode)
        .map(str::to_owned)
        .map_err(ApiError::invalid_args)
}

fn marshal_err(e: RemoteError) -> ApiError {
    ApiError::invalid_args(e.message)
}

fn agent_err(e: RemoteError) -> ApiError {
    ApiError::failed(format!("bad value from the agent: {}", e.message))
}

fn unexpected() -> ApiError {
    ApiError::failed("unexpected reply from the agent")
}

fn empty(r: Response) -> Result<(), ApiError> {
    match r {
        Response::Empty => Ok(()),
        _ => Err(unexpected()),
    }
}

fn text(r: Response) -> Result<String, ApiError> {
    match r {
        Response::Text(t) => Ok(t),
        _ => Err(unexpected()),
    }
}

fn changes(r: Response) -> Result<(bool, Vec<Change>), ApiError> {
    match r {
        Response::Changes {
            carries_install_info,
            changes,
        } => Ok((carries_install_info, changes)),
        _ => Err(unexpected()),
    }
}

pub struct NodeObject {
    nodes: Arc<Nodes>,
    jobs: Arc<JobRunner>,
    request_timeout: Duration,
    lists: Arc<FleetCalls>,
    name: NodeName,
}

impl NodeObject {
    pub fn new(handles: &Handles, name: NodeName) -> Self {
        Self {
            nodes: handles.nodes.clone(),
            jobs: handles.jobs.clone(),
            request_timeout: handles.request,
            lists: handles.node_lists.clone(),
            name,
        }
    }

    async fn job(
        &self,
        name: &str,
        mode: &str,
        kind: JobKind,
    ) -> Result<OwnedObjectPath, ApiError> {
        self.jobs.start_job(&self.name, name, mode, kind).await
    }
}

#[interface(name = "org.eclipse.bluechi.Node", introspection_docs = false)]
impl NodeObject {
    #[zbus(out_args("job"))]
    async fn start_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobKind::Start).await
    }

    #[zbus(out_args("job"))]
    async fn stop_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobKind::Stop).await
    }

    #[zbus(out_args("job"))]
    async fn restart_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobKind::Restart).await
    }

    #[zbus(out_args("job"))]
    async fn reload_unit(&self, name: String, mode: String) -> Result<OwnedObjectPath, ApiError> {
        self.job(&name, &mode, JobKind::Reload).await
    }

    /// Each caller waits its turn, and is refused over its share or when
    /// too many wait ([`crate::fanout::limit`]): a list holds the node's rows.
    #[zbus(out_args("units"))]
    async fn list_units(
        &self,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<Vec<UnitTuple>, ApiError> {
        let _turn = self.list_turn(&header, "ListUnits").await?;
        units_of(self.request(Request::ListUnits).await?)
    }

    /// systemd daemon-reload on the node.
    async fn reload(&self) -> Result<(), ApiError> {
        match self.request(Request::Reload).await? {
            Response::Empty => Ok(()),
            _ => Err(ApiError::failed("unexpected reply from the agent")),
        }
    }

    /// A transient unit, tracked as a drover job (JobNew/JobRemoved) unlike
    /// BlueChi, which hands back the node's systemd job path.
    #[zbus(out_args("job"))]
    async fn start_transient_unit(
        &self,
        name: String,
        mode: String,
        properties: Vec<(String, OwnedVariant)>,
        aux: Vec<(String, Vec<(String, OwnedVariant)>)>,
    ) -> Result<OwnedObjectPath, ApiError> {
        let unit = unit_arg(&name)?;
        let mode = mode_arg(&mode)?;
        let properties = marshal::encode(&properties).map_err(marshal_err)?;
        let aux = marshal::encode(&aux).map_err(marshal_err)?;
        let for_request = unit.clone();
        self.jobs
            .start_job_with(&self.name, unit, JobKind::Start, move |job_id| {
                Request::StartTransientUnit {
                    unit: for_request,
                    mode,
                    properties,
                    aux,
                    job_id,
                }
            })
            .await
    }

    async fn freeze_unit(&self, name: String) -> Result<(), ApiError> {
        let unit = unit_arg(&name)?;
        empty(self.request(Request::FreezeUnit { unit }).await?)
    }

    async fn thaw_unit(&self, name: String) -> Result<(), ApiError> {
        let unit = unit_arg(&name)?;
        empty(self.request(Request::ThawUnit { unit }).await?)
    }

    /// `who`: main, control or all; `signal`: 1..=64.
    async fn kill_unit(&self, name: String, who: String, signal: i32) -> Result<(), ApiError> {
        let unit = unit_arg(&name)?;
        if !KILL_WHO.contains(&who.as_str()) {
            return Err(ApiError::invalid_args(format!(
                "invalid process selection '{}': expected one of {}",
                who.escape_default(),
                KILL_WHO.join(", ")
            )));
        }
        if !(1..=MAX_SIGNAL).contains(&signal) {
            return Err(ApiError::invalid_args(format!(
                "invalid signal number {signal}: expected 1 to {MAX_SIGNAL}"
            )));
        }
        empty(
            self.request(Request::KillUnit {
                unit,
                whom: who,
                signal,
            })
            .await?,
        )
    }

    #[zbus(out_args("props"))]
    async fn get_unit_properties(
        &self,
        name: String,
        interface: String,
    ) -> Result<HashMap<String, OwnedVariant>, ApiError> {
        let unit = unit_arg(&name)?;
        let interface = interface_arg(&interface)?;
        match self
            .request(Request::GetUnitProperties { unit, interface })
            .await?
        {
            Response::Value(m) => marshal::decode::<PropertyMap>(&m).map_err(agent_err),
            _ => Err(unexpected()),
        }
    }

    #[zbus(out_args("value"))]
    async fn get_unit_property(
        &self,
        name: String,
        interface: String,
        property: String,
    ) -> Result<OwnedVariant, ApiError> {
        let unit = unit_arg(&name)?;
        let interface = interface_arg(&interface)?;
        let property = property_arg(&property)?;
        match self
            .request(Request::GetUnitProperty {
                unit,
                interface,
                property,
            })
            .await?
        {
            Response::Value(m) => marshal::decode::<OwnedVariant>(&m).map_err(agent_err),
            _ => Err(unexpected()),
        }
    }

    async fn set_unit_properties(
        &self,
        name: String,
        runtime: bool,
        keyvalues: Vec<(String, OwnedVariant)>,
    ) -> Result<(), ApiError> {
        let unit = unit_arg(&name)?;
        let properties = marshal::encode(&keyvalues).map_err(marshal_err)?;
        empty(
            self.request(Request::SetUnitProperties {
                unit,
                runtime,
                properties,
            })
            .await?,
        )
    }

    #[zbus(out_args("carries_install_info", "changes"))]
    async fn enable_unit_files(
        &self,
        files: Vec<String>,
        runtime: bool,
        force: bool,
    ) -> Result<(bool, Vec<Change>), ApiError> {
        let files = files_arg(&files)?;
        changes(
            self.request(Request::EnableUnitFiles {
                files,
                runtime,
                force,
            })
            .await?,
        )
    }

    #[zbus(out_args("changes"))]
    async fn disable_unit_files(
        &self,
        files: Vec<String>,
        runtime: bool,
    ) -> Result<Vec<Change>, ApiError> {
        let files = files_arg(&files)?;
        let (_, c) = changes(
            self.request(Request::DisableUnitFiles { files, runtime })
                .await?,
        )?;
        Ok(c)
    }

    /// Bounded as `ListUnits`.
    #[zbus(out_args("unitfiles"))]
    async fn list_unit_files(
        &self,
        #[zbus(header)] header: Header<'_>,
    ) -> Result<Vec<(String, String)>, ApiError> {
        let _turn = self.list_turn(&header, "ListUnitFiles").await?;
        unit_files(self.request(Request::ListUnitFiles).await?)
    }

    #[zbus(out_args("state"))]
    async fn get_unit_file_state(&self, file: String) -> Result<String, ApiError> {
        let file = file_arg(&file)?;
        text(self.request(Request::GetUnitFileState { file }).await?)
    }

    async fn reset_failed(&self) -> Result<(), ApiError> {
        empty(self.request(Request::ResetFailed).await?)
    }

    async fn reset_failed_unit(&self, name: String) -> Result<(), ApiError> {
        let unit = unit_arg(&name)?;
        empty(self.request(Request::ResetFailedUnit { unit }).await?)
    }

    #[zbus(out_args("defaulttarget"))]
    async fn get_default_target(&self) -> Result<String, ApiError> {
        text(self.request(Request::GetDefaultTarget).await?)
    }

    #[zbus(out_args("out"))]
    async fn set_default_target(
        &self,
        defaulttarget: String,
        force: bool,
    ) -> Result<Vec<Change>, ApiError> {
        let target = unit_arg(&defaulttarget)?;
        if !target.as_str().ends_with(".target") {
            return Err(ApiError::invalid_args(format!(
                "'{target}' is not a target unit"
            )));
        }
        let (_, c) = changes(
            self.request(Request::SetDefaultTarget { target, force })
                .await?,
        )?;
        Ok(c)
    }

    /// The agent's log level: DEBUG, INFO, WARN or ERROR (checked here,
    /// unlike BlueChi).
    async fn set_log_level(&self, level: String) -> Result<(), ApiError> {
        let Some(level) = LogLevel::parse(&level) else {
            return Err(ApiError::invalid_args(format!(
                "invalid log level '{}': expected DEBUG, INFO, WARN or ERROR",
                level.escape_default()
            )));
        };
        empty(
            self.request(Request::SetLogLevel {
                level: level.as_str().to_owned(),
            })
            .await?,
        )
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn name(&self) -> String {
        self.name.to_string()
    }

    /// `online` / `offline`; every transition is announced by the node
    /// lifecycle.
    #[zbus(property)]
    fn status(&self) -> String {
        self.nodes
            .registry()
            .get(self.name.as_str())
            .map(|n| n.status())
            .unwrap_or(OFFLINE)
            .to_owned()
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn peer_ip(&self) -> String {
        self.nodes
            .registry()
            .get(self.name.as_str())
            .map(|n| n.peer_ip().to_owned())
            .unwrap_or_default()
    }

    /// Realtime µs of the last frame from the node (registration or any
    /// later frame); kept after a disconnect; 0 if never seen.
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp(&self) -> u64 {
        self.last_seen().0
    }

    #[zbus(property(emits_changed_signal = "false"))]
    fn last_seen_timestamp_monotonic(&self) -> u64 {
        self.last_seen().1
    }
}

impl NodeObject {
    /// A request to the node's agent with the standard timeout.
    /// The caller's turn to list this node's units (see `list_units`).
    async fn list_turn(&self, header: &Header<'_>, method: &str) -> Result<Turn, ApiError> {
        let client = header.sender().map(|s| s.as_str()).unwrap_or("");
        self.lists.turn(client, method).await
    }

    async fn request(&self, body: Request) -> Result<Response, ApiError> {
        let session = self.nodes.session_of(&self.name)?;
        session.request(body, self.request_timeout).await
    }

    /// Fresh from the kernel while the node is online
    /// ([`crate::nodes::session::Session::refresh_seen`]).
    fn last_seen(&self) -> (u64, u64) {
        let registry = self.nodes.registry();
        let Some(node) = registry.get(self.name.as_str()) else {
            return (0, 0);
        };
        if let Some(session) = &node.session {
            session.refresh_seen();
        }
        node.last_seen()
    }
}
