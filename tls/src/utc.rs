//! Dates for people: certificate times in error messages and tool output,
//! as `YYYY-MM-DD HH:MM:SS UTC`, without a calendar dependency.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A Unix timestamp (seconds, may be negative) as a `SystemTime`.
pub(crate) fn from_unix(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

pub(crate) fn to_unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// `t` as `YYYY-MM-DD HH:MM:SS UTC`, for messages and tool output.
pub fn format(t: SystemTime) -> String {
    let secs = to_unix(t);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format(from_unix(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(format(from_unix(951_782_400)), "2000-02-29 00:00:00 UTC");
        assert_eq!(format(from_unix(1_798_761_599)), "2026-12-31 23:59:59 UTC");
        assert_eq!(format(from_unix(-1)), "1969-12-31 23:59:59 UTC");
        assert_eq!(to_unix(from_unix(-86_400)), -86_400);
    }
}
