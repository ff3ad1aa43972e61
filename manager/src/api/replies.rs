//! An agent's list replies as the D-Bus values the API returns, shared by
//! `Node.ListUnits`/`ListUnitFiles` and their fleet-wide versions on the
//! controller.
//!
//! Invariant: a reply of the wrong kind (a broken agent) is an error, never
//! an empty list.

use crate::error::ApiError;
use drover_bus::systemd::{UnitTuple, unit_tuple};
use drover_protocol::Response;

/// The `(ssssssouso)` tuples of a `ListUnits` reply. Object paths that are
/// not valid object paths (a broken agent) become `/`.
pub fn units_of(response: Response) -> Result<Vec<UnitTuple>, ApiError> {
    match response {
        Response::Units(units) => Ok(units.into_iter().map(unit_tuple).collect()),
        other => Err(ApiError::unexpected_reply(&other)),
    }
}

/// The `(ss)` rows of a `ListUnitFiles` reply.
pub fn unit_files(response: Response) -> Result<Vec<(String, String)>, ApiError> {
    match response {
        Response::UnitFiles(files) => Ok(files),
        other => Err(ApiError::unexpected_reply(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::UnitInfo;

    #[test]
    fn bad_unit_paths_become_root() {
        let units = units_of(Response::Units(vec![UnitInfo {
            object_path: "not a path".into(),
            ..UnitInfo::loaded("a.service", "active", "running")
        }]))
        .unwrap();
        assert_eq!(units[0].6.as_str(), "/");
        assert!(units_of(Response::Empty).is_err());
    }
}
