//! systemd's side of D-Bus as drover uses it: its bus name, object paths and
//! interfaces, and the `ListUnits` row.
//!
//! * Unit objects live at `UNIT_PATH_PREFIX/<escaped unit name>`
//!   ([`unit_path`], [`unit_name_from_path`]), jobs at `JOB_PATH_PREFIX/<id>`.
//! * A `ListUnits` row is `(ssssssouso)` (`UnitTuple`, feature `zbus`):
//!   name, description, load state, active state, sub state, followed unit,
//!   unit object path, job id, job type, job object path. The agent reads
//!   rows from systemd (`unit_info`), the wire carries them as
//!   [`drover_protocol::UnitInfo`], and the manager serves them unchanged
//!   (`unit_tuple`): BlueChi's `ListUnits` is systemd's row.

use crate::label::{bus_label_escape, bus_label_unescape};

/// systemd's well-known bus name.
pub const BUS_NAME: &str = "org.freedesktop.systemd1";
/// systemd's manager object.
pub const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
/// Unit objects: `UNIT_PATH_PREFIX/<escaped unit name>`.
pub const UNIT_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit";
/// Job objects: `JOB_PATH_PREFIX/<id>`.
pub const JOB_PATH_PREFIX: &str = "/org/freedesktop/systemd1/job";

/// systemd's manager interface (`ListUnits`, `StartUnit`, job signals, …).
pub const MANAGER_IFACE: &str = "org.freedesktop.systemd1.Manager";
/// The interface every unit object has (`ActiveState`, `SubState`, …).
pub const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
/// The interface of service units (`MainPID`, …).
pub const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";
/// The interface of job objects (`JobType`, `State`, `Cancel`).
pub const JOB_IFACE: &str = "org.freedesktop.systemd1.Job";

/// systemd's object path of the unit named `name`.
pub fn unit_path(name: &str) -> String {
    format!("{UNIT_PATH_PREFIX}/{}", bus_label_escape(name))
}

/// The unit named by a unit object path
/// (`/org/freedesktop/systemd1/unit/foo_2eservice` → `foo.service`); `None`
/// for anything else.
pub fn unit_name_from_path(path: &str) -> Option<String> {
    let label = path.strip_prefix(UNIT_PATH_PREFIX)?.strip_prefix('/')?;
    if label.contains('/') {
        return None;
    }
    bus_label_unescape(label).filter(|name| !name.is_empty())
}

#[cfg(feature = "zbus")]
pub use row::{UnitTuple, unit_info, unit_tuple};

#[cfg(feature = "zbus")]
mod row {
    use drover_protocol::UnitInfo;
    use zbus::OwnedObjectPath;

    /// systemd's `ListUnits` row `(ssssssouso)` (see the module docs).
    pub type UnitTuple = (
        String,
        String,
        String,
        String,
        String,
        String,
        OwnedObjectPath,
        u32,
        String,
        OwnedObjectPath,
    );

    /// A row from systemd as the wire carries it.
    pub fn unit_info(row: UnitTuple) -> UnitInfo {
        UnitInfo {
            object_path: row.6.to_string(),
            job_path: row.9.to_string(),
            job_id: row.7,
            name: row.0,
            description: row.1,
            load_state: row.2,
            active_state: row.3,
            sub_state: row.4,
            followed: row.5,
            job_type: row.8,
        }
    }

    /// A row from the wire as served on D-Bus. The wire is input from outside:
    /// an object path that is not one (a broken agent) becomes `/`.
    pub fn unit_tuple(u: UnitInfo) -> UnitTuple {
        (
            u.name,
            u.description,
            u.load_state,
            u.active_state,
            u.sub_state,
            u.followed,
            object_path_or_root(u.object_path),
            u.job_id,
            u.job_type,
            object_path_or_root(u.job_path),
        )
    }

    fn object_path_or_root(s: String) -> OwnedObjectPath {
        OwnedObjectPath::try_from(s).unwrap_or_else(|_| {
            OwnedObjectPath::try_from("/").expect("root is a valid object path")
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn info(path: &str) -> UnitInfo {
            UnitInfo {
                name: "db.service".into(),
                description: "the db".into(),
                load_state: "loaded".into(),
                active_state: "active".into(),
                sub_state: "running".into(),
                followed: String::new(),
                object_path: path.into(),
                job_id: 7,
                job_type: "start".into(),
                job_path: "/org/freedesktop/systemd1/job/7".into(),
            }
        }

        #[test]
        fn rows_round_trip_field_by_field() {
            let u = info("/org/freedesktop/systemd1/unit/db_2eservice");
            let row = unit_tuple(u.clone());
            assert_eq!(
                (row.0.as_str(), row.3.as_str(), row.4.as_str()),
                ("db.service", "active", "running")
            );
            assert_eq!(row.7, 7);
            assert_eq!(unit_info(row), u);
        }

        #[test]
        fn a_path_from_a_broken_agent_becomes_root() {
            let row = unit_tuple(info("not a path"));
            assert_eq!(row.6.as_str(), "/");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_paths_turn_back_into_names() {
        let name = |p: &str| unit_name_from_path(p);
        assert_eq!(
            name("/org/freedesktop/systemd1/unit/foo_2eservice").as_deref(),
            Some("foo.service")
        );
        assert_eq!(
            name("/org/freedesktop/systemd1/unit/drover_2ddep_40db_5fx_2eservice").as_deref(),
            Some("drover-dep@db_x.service")
        );
        assert_eq!(
            name("/org/freedesktop/systemd1/unit/_31abc_2etarget").as_deref(),
            Some("1abc.target")
        );
        assert_eq!(name("/org/freedesktop/systemd1/unit/"), None);
        assert_eq!(name("/org/freedesktop/systemd1/unit/a/b"), None);
        assert_eq!(name("/org/freedesktop/systemd1/unit/bad_2"), None);
        assert_eq!(name("/org/freedesktop/systemd1/unit/bad_zz"), None);
        assert_eq!(name("/org/freedesktop/systemd1/job/1"), None);
        assert_eq!(name("/org/freedesktop/systemd1/unitx/a"), None);
    }

    #[test]
    fn unit_names_escape_as_systemd_does() {
        assert_eq!(
            unit_path("drover-proxy@node2_db.service"),
            "/org/freedesktop/systemd1/unit/drover_2dproxy_40node2_5fdb_2eservice"
        );
        assert_eq!(
            unit_path("1abc.target"),
            "/org/freedesktop/systemd1/unit/_31abc_2etarget"
        );
        assert_eq!(unit_path(""), "/org/freedesktop/systemd1/unit/_");
        for name in ["a-b@c\\x2d.service", "é.service", "x.y_z.mount"] {
            assert_eq!(unit_name_from_path(&unit_path(name)).as_deref(), Some(name));
        }
    }
}
