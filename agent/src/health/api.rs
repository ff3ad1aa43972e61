//! `io.drover.Agent` on the agent's object (`/org/eclipse/bluechi`, next to
//! BlueChi's `org.eclipse.bluechi.Agent`): pushed health for services that
//! know best, and a unit's health as this agent sees it.
//!
//! * `ReportHealth(s unit, s state, s reason, t ttl_usec)`: `state` is
//!   `healthy`, `unhealthy` or `starting`; the verdict holds for `ttl_usec`
//!   (100 ms to 1 day), after which the unit turns `unhealthy` unless a new
//!   report came. The unit must declare `HealthPush=yes` and be active
//!   (else `org.freedesktop.DBus.Error.Failed` with the reason). `reason` is
//!   cut to 4 KiB.
//! * `GetUnitHealth(s unit) → (s state, s reason, t since_usec)`: `none` for
//!   a unit that declares nothing; `since_usec` is the realtime µs of the
//!   last change.
//!
//! Who may report (`authorize`): root, or the unit's own user — the uid of
//! its `User=`, or for a unit without `User=` the user of its service
//! manager (the agent's own user). The caller's uid is the bus's
//! (`GetConnectionUnixUser`), never a claim of the caller. Anyone else gets
//! `org.freedesktop.DBus.Error.AccessDenied` and nothing changes. Reading is
//! open to whoever the bus policy lets call.
//!
//! Arguments are checked before anything else: a bad unit name, state or
//! time to live is `InvalidArgs`.

use super::driver::Host;
use super::table::PushError;
use crate::caller::{Caller, caller_uid};
use drover_bus::bluechi::AGENT_PATH;
use drover_protocol::error_names::{ACCESS_DENIED, FAILED, INVALID_ARGS};
use drover_protocol::{HealthState, UnitName};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zbus::message::Header;
use zbus::{Connection, interface};

/// The interface name.
pub const IFACE: &str = "io.drover.Agent";
/// Bounds of `ttl_usec`.
pub const TTL_MIN: Duration = Duration::from_millis(100);
pub const TTL_MAX: Duration = Duration::from_secs(86_400);

/// An error reply: a D-Bus error name and a message.
#[derive(Debug, Clone, PartialEq, Eq, zbus::DBusError)]
#[zbus(prefix = "org.freedesktop.DBus.Error")]
pub enum HealthError {
    InvalidArgs(String),
    AccessDenied(String),
    Failed(String),
}

impl HealthError {
    /// The D-Bus error name (the constants every process shares).
    pub fn error_name(&self) -> &'static str {
        match self {
            HealthError::InvalidArgs(_) => INVALID_ARGS,
            HealthError::AccessDenied(_) => ACCESS_DENIED,
            HealthError::Failed(_) => FAILED,
        }
    }
}

/// What the served object asks of health (a [`Host`] behind it).
trait Reports: Send + Sync + 'static {
    fn report(
        &self,
        report: Report,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PushError>> + Send + '_>>;
    fn health(&self, unit: &UnitName) -> drover_protocol::Health;
}

struct ViaHost<H>(Arc<H>);

impl<H: Host> Reports for ViaHost<H> {
    fn report(
        &self,
        r: Report,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PushError>> + Send + '_>>
    {
        Box::pin(
            async move { super::driver::push(&self.0, &r.unit, r.state, &r.reason, r.ttl).await },
        )
    }

    fn health(&self, unit: &UnitName) -> drover_protocol::Health {
        self.0.health().get(unit, std::time::Instant::now())
    }
}

/// The served object.
pub struct HealthObject {
    reports: Arc<dyn Reports>,
}

/// The checked arguments of `ReportHealth`.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub unit: UnitName,
    pub state: HealthState,
    pub reason: String,
    pub ttl: Duration,
}

impl Report {
    /// Checks `ReportHealth`'s arguments.
    pub fn parse(
        unit: &str,
        state: &str,
        reason: &str,
        ttl_usec: u64,
    ) -> Result<Self, HealthError> {
        let invalid = |m: String| HealthError::InvalidArgs(m);
        let unit = UnitName::new(unit).map_err(|e| invalid(format!("unit: {e}")))?;
        let state = match HealthState::parse(state) {
            Some(s @ (HealthState::Healthy | HealthState::Unhealthy | HealthState::Starting)) => s,
            _ => {
                return Err(invalid(format!(
                    "state: '{}' is not healthy, unhealthy or starting",
                    state.escape_default()
                )));
            }
        };
        let ttl = Duration::from_micros(ttl_usec);
        if !(TTL_MIN..=TTL_MAX).contains(&ttl) {
            return Err(invalid(format!(
                "ttl_usec: {ttl_usec} is not between {} and {} µs",
                TTL_MIN.as_micros(),
                TTL_MAX.as_micros()
            )));
        }
        Ok(Self {
            unit,
            state,
            reason: drover_protocol::health::cut_reason(reason).to_owned(),
            ttl,
        })
    }
}

/// Lets a report for `unit` through when the caller is root or the unit's
/// own user (see the module docs).
async fn authorize(
    conn: &Connection,
    header: &Header<'_>,
    unit: &UnitName,
) -> Result<(), HealthError> {
    let denied = |why: String| {
        let message = format!("only root or the user {unit} runs as may report its health: {why}");
        tracing::warn!("refused ReportHealth: {message}");
        HealthError::AccessDenied(message)
    };
    let Caller { sender, uid, .. } = caller_uid(conn, header, &denied).await?;
    if uid == 0 {
        return Ok(());
    }
    let (user, _, _) = super::systemd::run_as(conn, unit.as_str())
        .await
        .map_err(|e| denied(format!("cannot tell which user {unit} runs as: {e}")))?;
    let owner = tokio::task::spawn_blocking(move || uid_of(&user))
        .await
        .map_err(|e| denied(e.to_string()))?
        .map_err(denied)?;
    let owner_uid = owner.unwrap_or_else(|| nix::unistd::Uid::effective().as_raw());
    if may_report(uid, owner_uid) {
        Ok(())
    } else {
        Err(denied(format!(
            "the caller {sender} runs as uid {uid}, {unit} as uid {owner_uid}"
        )))
    }
}

/// The uid of `User=` (a name or a number); `None` when it is empty (the
/// unit runs as its service manager's user).
fn uid_of(user: &str) -> Result<Option<u32>, String> {
    if user.is_empty() {
        return Ok(None);
    }
    if let Ok(uid) = user.parse::<u32>() {
        return Ok(Some(uid));
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(Some(u.uid.as_raw())),
        Ok(None) => Err(format!("user {user} does not exist")),
        Err(e) => Err(format!("cannot look up user {user}: {e}")),
    }
}

/// The rule: root, or the uid the unit runs as.
fn may_report(caller: u32, unit_runs_as: u32) -> bool {
    caller == 0 || caller == unit_runs_as
}

#[interface(name = "io.drover.Agent", introspection_docs = false)]
impl HealthObject {
    /// See the module docs.
    async fn report_health(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        unit: String,
        state: String,
        reason: String,
        ttl_usec: u64,
    ) -> Result<(), HealthError> {
        let report = Report::parse(&unit, &state, &reason, ttl_usec)?;
        authorize(conn, &header, &report.unit).await?;
        self.reports
            .report(report)
            .await
            .map_err(|e: PushError| HealthError::Failed(e.to_string()))
    }

    /// See the module docs.
    #[zbus(out_args("state", "reason", "since_usec"))]
    async fn get_unit_health(&self, unit: String) -> Result<(String, String, u64), HealthError> {
        let unit = UnitName::new(unit.as_str())
            .map_err(|e| HealthError::InvalidArgs(format!("unit: {e}")))?;
        let health = self.reports.health(&unit);
        let since = SystemTime::now()
            .checked_sub(Duration::from_millis(health.changed_ms_ago))
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Ok((health.state.as_str().to_owned(), health.reason, since))
    }
}

/// Exports the interface on `conn` (the agent's name is owned by
/// `crate::api::serve`).
pub async fn serve<H: Host>(conn: &Connection, host: Arc<H>) -> zbus::Result<()> {
    let object = HealthObject {
        reports: Arc::new(ViaHost(host)),
    };
    conn.object_server()
        .at(AGENT_PATH, object)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_or_the_units_own_user_may_report() {
        assert!(may_report(0, 1000));
        assert!(may_report(1000, 1000));
        assert!(!may_report(1001, 1000));
        assert!(!may_report(1000, 0));
        assert_eq!(uid_of(""), Ok(None));
        assert_eq!(uid_of("4242"), Ok(Some(4242)));
        assert_eq!(uid_of("root"), Ok(Some(0)));
        assert_eq!(
            uid_of("no-such-user-drover"),
            Err("user no-such-user-drover does not exist".into())
        );
    }

    #[test]
    fn garbage_arguments_are_invalid() {
        let ok = Report::parse("app.service", "healthy", "fine", 30_000_000).unwrap();
        assert_eq!(ok.ttl, Duration::from_secs(30));
        for (unit, state, ttl) in [
            ("app", "healthy", 30_000_000),
            ("app.service/x", "healthy", 30_000_000),
            ("app.service", "none", 30_000_000),
            ("app.service", "Healthy", 30_000_000),
            ("app.service", "", 30_000_000),
            ("app.service", "healthy", 0),
            ("app.service", "healthy", 99_999),
            ("app.service", "healthy", u64::MAX),
        ] {
            let err = Report::parse(unit, state, "", ttl).unwrap_err();
            assert!(
                matches!(err, HealthError::InvalidArgs(_)),
                "{unit} {state} {ttl}: {err:?}"
            );
        }
        let long =
            Report::parse("app.service", "unhealthy", &"x".repeat(10_000), 1_000_000).unwrap();
        assert_eq!(long.reason.len(), drover_protocol::health::REASON_MAX);
    }
}
