//! Host names and IP literals, as drover's config keys take them
//! (`ControllerHost`, `TLSControllerName`, the hosts of `HealthTCP=` and
//! `HealthHTTP=`): checked here, resolved by whoever dials.

use std::net::IpAddr;

/// Accepts an IP literal or a DNS host name (labels of ASCII letters, digits,
/// `-` and `_`, at most 63 bytes each, 253 in all, an optional final dot).
/// The name is only checked here; it is resolved on every connection attempt.
pub fn check_host(host: &str) -> Result<(), String> {
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let bad = || format!("'{host}' is neither an IP address nor a valid host name");
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return Err(bad());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(bad())
    }
}
