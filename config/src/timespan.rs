//! systemd's time span syntax (`systemd.time(7)`), for the duration keys of
//! health checks: `10s`, `1min 30s`, `1min30s`, `500ms`, `2h`, `1.5s`, and a
//! bare number, which means seconds.
//!
//! Units: `us`/`usec`/`µs`, `ms`/`msec`, `s`/`sec`/`second(s)`,
//! `m`/`min`/`minute(s)`, `h`/`hr`/`hour(s)`, `d`/`day(s)`, `w`/`week(s)`.
//! Months and years (`M`, `y`) and `infinity` are refused: no check waits that
//! long. Pure; the result is exact to the microsecond.

use std::time::Duration;

const UNITS: &[(&str, u64)] = &[
    ("usec", 1),
    ("us", 1),
    ("µs", 1),
    ("μs", 1),
    ("msec", 1_000),
    ("ms", 1_000),
    ("seconds", 1_000_000),
    ("second", 1_000_000),
    ("sec", 1_000_000),
    ("s", 1_000_000),
    ("minutes", 60_000_000),
    ("minute", 60_000_000),
    ("min", 60_000_000),
    ("m", 60_000_000),
    ("hours", 3_600_000_000),
    ("hour", 3_600_000_000),
    ("hr", 3_600_000_000),
    ("h", 3_600_000_000),
    ("days", 86_400_000_000),
    ("day", 86_400_000_000),
    ("d", 86_400_000_000),
    ("weeks", 604_800_000_000),
    ("week", 604_800_000_000),
    ("w", 604_800_000_000),
];

/// Parses a time span; the error says what is wrong, for a message that
/// already names the file, line and key.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("'{text}' is not a time span ({why}; e.g. 10s, 1min 30s, 500ms)");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        if number.is_empty() {
            return Err(bad("a number must come first"));
        }
        let after = after.trim_start();
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = if unit.is_empty() {
            1_000_000
        } else {
            UNITS
                .iter()
                .find(|(name, _)| *name == unit)
                .map(|(_, scale)| *scale)
                .ok_or_else(|| bad(&format!("unknown unit '{unit}'")))?
        };
        let micros = scaled(number, scale).ok_or_else(|| bad("number out of range"))?;
        total = total
            .checked_add(micros)
            .ok_or_else(|| bad("number out of range"))?;
        rest = next.trim_start();
    }
    Ok(Duration::from_micros(total))
}

/// `number` (digits with at most one `.`) times `scale` µs, cut to whole µs.
fn scaled(number: &str, scale: u64) -> Option<u64> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut micros = whole.checked_mul(scale)?;
    let mut unit = scale;
    for digit in frac.bytes() {
        unit /= 10;
        if unit == 0 {
            break;
        }
        micros = micros.checked_add(u64::from(digit - b'0') * unit)?;
    }
    Some(micros)
}

/// A span as systemd would print it, shortest exact form: `10s`, `1min 30s`,
/// `500ms`, `1s 500ms`.
pub fn format(span: Duration) -> String {
    let mut micros = span.as_micros().min(u128::from(u64::MAX)) as u64;
    if micros == 0 {
        return "0".into();
    }
    let parts: [(&str, u64); 7] = [
        ("w", 604_800_000_000),
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("min", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
        ("us", 1),
    ];
    let mut out: Vec<String> = Vec::new();
    for (name, scale) in parts {
        if micros >= scale {
            out.push(format!("{}{name}", micros / scale));
            micros %= scale;
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn systemd_spellings() {
        assert_eq!(parse("10s"), Ok(ms(10_000)));
        assert_eq!(parse("10"), Ok(ms(10_000)));
        assert_eq!(parse(" 1min 30s "), Ok(ms(90_000)));
        assert_eq!(parse("1min30s"), Ok(ms(90_000)));
        assert_eq!(parse("500ms"), Ok(ms(500)));
        assert_eq!(parse("500 ms"), Ok(ms(500)));
        assert_eq!(parse("1.5s"), Ok(ms(1500)));
        assert_eq!(parse(".5s"), Ok(ms(500)));
        assert_eq!(parse("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse("1d 1h"), Ok(ms(90_000_000)));
        assert_eq!(parse("20us"), Ok(Duration::from_micros(20)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        for bad in [
            "",
            "s",
            "ten",
            "10 parsecs",
            "1M",
            "1y",
            "infinity",
            "1..5s",
            "-1s",
            "99999999999999999999s",
            "18446744073709551615w",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("not a time span"), "{bad}: {err}");
        }
    }

    #[test]
    fn format_is_read_back() {
        for span in [
            ms(10_000),
            ms(90_000),
            ms(500),
            ms(1500),
            ms(86_400_000 * 8),
        ] {
            assert_eq!(parse(&format(span)), Ok(span), "{}", format(span));
        }
        assert_eq!(format(ms(90_000)), "1min 30s");
    }
}
