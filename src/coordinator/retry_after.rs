//! A `Retry-After` header value (RFC 9110 §10.2.3) as a delay for
//! [`Coordinator::cooldown`](super::Coordinator::cooldown). The coordinator never reads
//! headers itself.

use std::fmt;
use std::time::{Duration, SystemTime};

/// Why a `Retry-After` value was not understood.
///
/// ```
/// use llm_bulkhead::coordinator::{parse_retry_after, RetryAfterError};
/// assert_eq!(parse_retry_after("soon", std::time::UNIX_EPOCH), Err(RetryAfterError::Invalid));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryAfterError {
    /// Neither delta-seconds nor an HTTP-date.
    Invalid,
}

impl fmt::Display for RetryAfterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Retry-After is neither delta-seconds nor an HTTP-date")
    }
}

impl std::error::Error for RetryAfterError {}

/// Parses a `Retry-After` value into a delay: delta-seconds (`"120"`), or an HTTP-date
/// (IMF-fixdate, `"Sun, 06 Nov 1994 08:49:37 GMT"`) taken relative to `now` (a date in the
/// past gives zero). Surrounding whitespace is ignored.
///
/// ```
/// use llm_bulkhead::coordinator::parse_retry_after;
/// use std::time::{Duration, UNIX_EPOCH};
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_717); // Sun, 06 Nov 1994 08:48:37 GMT
/// assert_eq!(parse_retry_after("120", now), Ok(Duration::from_secs(120)));
/// assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), Ok(Duration::from_secs(60)));
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Result<Duration, RetryAfterError> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Delta-seconds too large for a u64 is as good as forever.
        return Ok(Duration::from_secs(v.parse().unwrap_or(u64::MAX)));
    }
    let at = http_date(v).ok_or(RetryAfterError::Invalid)?;
    Ok(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
fn http_date(v: &str) -> Option<SystemTime> {
    let b = v.as_bytes();
    if b.len() != 29 || &b[3..5] != b", " || &v[25..] != " GMT" {
        return None;
    }
    let num = |s: &str| -> Option<u64> {
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let day = num(&v[5..7])?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == &v[8..11])? as u64 + 1;
    let year = num(&v[12..16])?;
    let (h, m, s) = (num(&v[17..19])?, num(&v[20..22])?, num(&v[23..25])?);
    if b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[19] != b':' || b[22] != b':' {
        return None;
    }
    if !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 || year < 1970 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_deltas() {
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:01:00 GMT", now),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Sat, 29 Feb 2020 00:00:00 GMT", now),
            Ok(Duration::from_secs(1_582_934_400))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Ok(Duration::ZERO));
        let later = now + Duration::from_secs(3600);
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:01:00 GMT", later),
            Ok(Duration::ZERO)
        );
        for bad in [
            "",
            "-1",
            "1.5",
            "Thu, 01 Jan 1970 00:01:00 UTC",
            "Thu, 32 Jan 1970 00:01:00 GMT",
        ] {
            assert_eq!(
                parse_retry_after(bad, now),
                Err(RetryAfterError::Invalid),
                "{bad}"
            );
        }
    }
}
