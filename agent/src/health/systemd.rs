//! What health asks of systemd, over the agent's own bus connection: a
//! unit's files as systemd itself sees them (`FragmentPath`, `DropInPaths`),
//! the user its service runs as (`User`, `Group`), the manager's
//! `SystemState`, and the restart or stop `HealthOnFailure=` asks for.
//!
//! A unit's files are read only while it is loaded: its path comes from
//! `GetUnit` (a property call on a unit's path would load an unloaded unit,
//! and its garbage collection would unload it again). `User=`/`Group=` are
//! read on the unit's path while it runs. The property calls of one unit go
//! out together (the bus keeps them in order, and they are answered in one
//! round trip).
//!
//! Errors are one line of text for a health reason or a log line.

use drover_bus::bus::PROPERTIES_IFACE;
use drover_bus::systemd::{BUS_NAME, MANAGER_IFACE, MANAGER_PATH, SERVICE_IFACE, UNIT_IFACE};
use drover_config::health::UnitDeclaration;
use drover_config::unit_file::{UnitEntry, read_x_drover};
use drover_protocol::UnitName;
use drover_protocol::error_names::NO_SUCH_UNIT;
use drover_protocol::ports::Ports;
use zbus::{Connection, OwnedObjectPath, OwnedVariant};

async fn get(
    conn: &Connection,
    path: &str,
    iface: &str,
    name: &str,
) -> Result<OwnedVariant, String> {
    let path =
        zbus::ObjectPath::try_from(path).map_err(|e| format!("bad object path {path}: {e}"))?;
    let reply = conn
        .call_method(
            Some(BUS_NAME),
            &path,
            Some(PROPERTIES_IFACE),
            "Get",
            &(iface, name),
        )
        .await
        .map_err(|e| format!("reading {name}: {e}"))?;
    reply
        .body()
        .deserialize::<OwnedVariant>()
        .map_err(|e| format!("reading {name}: {e}"))
}

fn string(value: OwnedVariant, name: &str) -> Result<String, String> {
    String::try_from(value).map_err(|e| format!("{name} is not a string: {e}"))
}

/// The object path of a loaded unit (`GetUnit`, which does not load it);
/// `None` when it is not loaded.
async fn loaded_path(conn: &Connection, unit: &str) -> Result<Option<String>, String> {
    match conn
        .call_method(
            Some(BUS_NAME),
            MANAGER_PATH,
            Some(MANAGER_IFACE),
            "GetUnit",
            &(unit,),
        )
        .await
    {
        Ok(reply) => reply
            .body()
            .deserialize::<OwnedObjectPath>()
            .map(|p| Some(p.as_str().to_owned()))
            .map_err(|e| format!("GetUnit: unexpected reply: {e}")),
        Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == NO_SUCH_UNIT => Ok(None),
        Err(e) => Err(format!("GetUnit: {e}")),
    }
}

/// systemd's `FragmentPath` and `DropInPaths` of `unit` (in the order
/// systemd applies them); `None` when the unit is not loaded (nothing here
/// loads it).
pub async fn unit_files(
    conn: &Connection,
    unit: &str,
) -> Result<Option<(String, Vec<String>)>, String> {
    let Some(path) = loaded_path(conn, unit).await? else {
        return Ok(None);
    };
    let (fragment, dropins) = tokio::join!(
        get(conn, &path, UNIT_IFACE, "FragmentPath"),
        get(conn, &path, UNIT_IFACE, "DropInPaths"),
    );
    let fragment = string(fragment?, "FragmentPath")?;
    let dropins = <Vec<String>>::try_from(dropins?)
        .map_err(|e| format!("DropInPaths is not a string list: {e}"))?;
    Ok(Some((fragment, dropins)))
}

/// What `unit`'s `[X-Drover]` sections declare: its health declaration
/// and its ports.
pub struct Declaration {
    /// `Err`: the first problem (a file that cannot be read, a syntax
    /// error, a bad key), naming the file.
    pub health: Result<UnitDeclaration, String>,
    /// Empty when none, or when they are bad (logged, naming file, line
    /// and key: a bad port never touches health).
    pub ports: Ports,
}

/// `unit`'s declaration: its `[X-Drover]` entries from its fragment and its
/// drop-ins, read as systemd lists them.
pub async fn declaration(conn: &Connection, unit: &UnitName) -> Declaration {
    let entries = match entries(conn, unit).await {
        Ok(entries) => entries,
        Err(e) => {
            return Declaration {
                health: Err(e),
                ports: Ports::default(),
            };
        }
    };
    let ports = if entries.is_empty() {
        Ports::default()
    } else {
        drover_config::ports::unit_ports(&entries).unwrap_or_else(|why| {
            tracing::warn!("{unit}: [X-Drover] ports left out: {why}");
            Ports::default()
        })
    };
    let health = if entries.is_empty() {
        Ok(UnitDeclaration::default())
    } else {
        drover_config::health::unit_declaration(unit, &entries)
    };
    Declaration { health, ports }
}

/// `unit`'s `[X-Drover]` entries, fragment first (none when not loaded).
async fn entries(conn: &Connection, unit: &UnitName) -> Result<Vec<UnitEntry>, String> {
    let Some((fragment, dropins)) = unit_files(conn, unit.as_str()).await? else {
        return Ok(Vec::new());
    };
    let files: Vec<String> = std::iter::once(fragment)
        .filter(|f| !f.is_empty())
        .chain(dropins)
        .collect();
    let entries = tokio::task::spawn_blocking(move || -> Result<Vec<UnitEntry>, String> {
        let mut all = Vec::new();
        for file in files {
            all.extend(read_x_drover(std::path::Path::new(&file))?);
        }
        Ok(all)
    })
    .await
    .map_err(|e| format!("reading the unit files: {e}"))??;
    Ok(entries)
}

/// `User=`, `Group=` and `SupplementaryGroups=` of a loaded service (empty
/// when not set); other unit types have none. An error when the unit is not
/// loaded.
pub async fn run_as(
    conn: &Connection,
    unit: &str,
) -> Result<(String, String, Vec<String>), String> {
    let Some(path) = loaded_path(conn, unit).await? else {
        return Err(format!("{unit} is not loaded"));
    };
    if !unit.ends_with(".service") {
        return Ok((String::new(), String::new(), Vec::new()));
    }
    let (user, group, groups) = tokio::join!(
        get(conn, &path, SERVICE_IFACE, "User"),
        get(conn, &path, SERVICE_IFACE, "Group"),
        get(conn, &path, SERVICE_IFACE, "SupplementaryGroups"),
    );
    let groups = <Vec<String>>::try_from(groups?)
        .map_err(|e| format!("SupplementaryGroups is not a string list: {e}"))?;
    Ok((string(user?, "User")?, string(group?, "Group")?, groups))
}

/// The names of the loaded units that run or are on their way (not
/// `inactive` or `failed`), from `ListUnits`.
pub async fn running_units(conn: &Connection) -> Result<Vec<UnitName>, String> {
    let reply = conn
        .call_method(
            Some(BUS_NAME),
            MANAGER_PATH,
            Some(MANAGER_IFACE),
            "ListUnits",
            &(),
        )
        .await
        .map_err(|e| format!("ListUnits: {e}"))?;
    let rows: Vec<drover_bus::systemd::UnitTuple> = reply
        .body()
        .deserialize()
        .map_err(|e| format!("ListUnits: unexpected reply: {e}"))?;
    Ok(rows
        .into_iter()
        .map(drover_bus::systemd::unit_info)
        .filter(|u| !matches!(u.active_state.as_str(), "inactive" | "failed"))
        .filter_map(|u| UnitName::new(u.name).ok())
        .collect())
}

/// systemd's `Reloading(b)` signals (true as a daemon-reload begins, false
/// when it ended), as a channel. Only systemd speaks for systemd: a signal
/// its current unique owner did not send is dropped (`drover_bus::sender`:
/// anyone may send a signal straight to the agent's name).
pub async fn reload_signals(
    conn: &Connection,
) -> Result<tokio::sync::mpsc::Receiver<bool>, String> {
    use drover_bus::sender::{Dropped, Owner, Verdict};
    use futures::StreamExt;
    use zbus::export::ordered_stream::{self, OrderedStreamExt};
    let queue = std::num::NonZeroUsize::new(64);
    let (mut owner, changes) = Owner::follow(conn, BUS_NAME, queue)
        .await
        .map_err(|e| format!("following the owner of {BUS_NAME}: {e}"))?;
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(BUS_NAME)
        .interface(MANAGER_IFACE)
        .member("Reloading")
        .path(MANAGER_PATH)
        .build()
        .map_err(|e| format!("building a match rule: {e}"))?;
    let reloads = zbus::MessageStream::for_match_rule(rule, conn, queue)
        .await
        .map_err(|e| format!("subscribing to Reloading: {e}"))?;
    let mut joined = ordered_stream::join(reloads, changes).into_stream();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut dropped = Dropped::new("systemd's Reloading signals (health)");
        loop {
            // Ends with its receiver, not only at the next signal: the
            // stream holds the bus connection.
            let msg = tokio::select! {
                () = tx.closed() => return,
                msg = joined.next() => msg,
            };
            let Some(msg) = msg else { return };
            let Ok(msg) = msg else { continue };
            match owner.judge(&msg) {
                Verdict::FromOwner => {}
                Verdict::OwnerChanged { .. } => continue,
                Verdict::NotFromOwner { sender } => {
                    if let Some(line) = dropped.note(&msg, &sender, &owner.describe()) {
                        tracing::warn!("{line}");
                    }
                    continue;
                }
            }
            if let Ok(active) = msg.body().deserialize::<bool>()
                && tx.send(active).await.is_err()
            {
                return;
            }
        }
    });
    Ok(rx)
}

/// The manager's `SystemState`.
pub async fn system_state(conn: &Connection) -> Result<String, String> {
    string(
        get(conn, MANAGER_PATH, MANAGER_IFACE, "SystemState").await?,
        "SystemState",
    )
}

/// `RestartUnit` or `StopUnit` (`method`) of `unit`, mode `replace`.
pub async fn unit_job(conn: &Connection, method: &str, unit: &str) -> Result<(), String> {
    conn.call_method(
        Some(BUS_NAME),
        MANAGER_PATH,
        Some(MANAGER_IFACE),
        method,
        &(unit, "replace"),
    )
    .await
    .map_err(|e| format!("{method}: {e}"))?
    .body()
    .deserialize::<OwnedObjectPath>()
    .map(|_| ())
    .map_err(|e| format!("{method}: unexpected reply: {e}"))
}
