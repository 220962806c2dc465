//! HTTP-dates (RFC 9110 §5.6.7): formatting `Date` and `Last-Modified`, and
//! parsing `If-Modified-Since`.
//!
//! A server sends IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) and must
//! accept the two obsolete forms too: RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`)
//! and asctime (`Sun Nov  6 08:49:37 1994`). Written here (about 100 lines)
//! rather than adding a crate to the shared lock file for two functions.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
/// Latest year accepted when parsing: later dates are not dates a client saw.
const YEAR_MAX: i64 = 9999;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats `t` as IMF-fixdate; times before 1970 are formatted as the epoch.
pub(crate) fn format(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = farside_rt::clock::civil_from_days(days);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        d,
        MONTHS[m as usize - 1],
        y,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn month(name: &str) -> Option<u32> {
    MONTHS.iter().position(|m| *m == name).map(|i| i as u32 + 1)
}

fn hms(s: &str) -> Option<i64> {
    let mut it = s.split(':');
    let h: i64 = it.next()?.parse().ok()?;
    let m: i64 = it.next()?.parse().ok()?;
    let sec: i64 = it.next()?.parse().ok()?;
    // 60 allows a leap second, as RFC 5322 does.
    (it.next().is_none() && h < 24 && m < 60 && sec <= 60).then_some(h * 3600 + m * 60 + sec)
}

fn to_time(y: i64, m: u32, d: u32, secs_of_day: i64) -> Option<SystemTime> {
    if !(1970..=YEAR_MAX).contains(&y) || !(1..=31).contains(&d) {
        return None;
    }
    let secs = days_from_civil(y, m, d) * 86_400 + secs_of_day;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Parses an HTTP-date in any of its three forms; `None` if it is not one
/// (RFC 9110 §13.1.3: an invalid `If-Modified-Since` is then ignored).
pub(crate) fn parse(s: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = s.split_ascii_whitespace().collect();
    match parts.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [wd, d, mon, y, t, "GMT"] if wd.ends_with(',') && y.len() == 4 => {
            to_time(y.parse().ok()?, month(mon)?, d.parse().ok()?, hms(t)?)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT (two-digit year: 70..99 → 19xx)
        [wd, date, t, "GMT"] if wd.ends_with(',') => {
            let mut it = date.split('-');
            let d: u32 = it.next()?.parse().ok()?;
            let mon = month(it.next()?)?;
            let yy: i64 = it.next()?.parse().ok()?;
            let y = if yy >= 70 { 1900 + yy } else { 2000 + yy };
            to_time(y, mon, d, hms(t)?)
        }
        // asctime: Sun Nov  6 08:49:37 1994
        [_wd, mon, d, t, y] => to_time(y.parse().ok()?, month(mon)?, d.parse().ok()?, hms(t)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_the_rfc_example_and_round_trips() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(format(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse(&format(t)), Some(t));
        assert_eq!(format(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(format(leap), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(parse(&format(leap)), Some(leap));
    }

    #[test]
    fn parses_the_obsolete_forms_and_rejects_junk() {
        let t = Some(UNIX_EPOCH + Duration::from_secs(784_111_777));
        assert_eq!(parse("Sunday, 06-Nov-94 08:49:37 GMT"), t);
        assert_eq!(parse("Sun Nov  6 08:49:37 1994"), t);
        for bad in [
            "",
            "yesterday",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Nov 1960 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
