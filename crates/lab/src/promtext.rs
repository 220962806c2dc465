//! Reading the proxy's Prometheus histograms in the lab: fetch `/metrics` from the admin
//! listener, sum one histogram's buckets over all its label sets, take the difference of
//! two scrapes (one point's window) and estimate quantiles as Prometheus's
//! `histogram_quantile` does (linear within a bucket).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Bound on one scrape: the proxy's admin listener answers at once, and a lab point must
/// not hang on a proxy that died.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on the body read (a few back-ends' histograms are tens of KB).
const SCRAPE_BYTES_MAX: u64 = 4 << 20;

/// `GET /metrics` from an admin listener; the body.
pub fn scrape(addr: SocketAddr) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT)?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    s.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    s.take(SCRAPE_BYTES_MAX).read_to_string(&mut raw)?;
    match raw.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(crate::error::LabError::Metrics {
            addr,
            first_line: raw.lines().next().unwrap_or("(empty)").to_string(),
        }
        .into()),
    }
}

/// Cumulative bucket counts `(le, count)` of histogram `name`, summed over its label sets,
/// in rising `le` order (`+Inf` last as `f64::INFINITY`).
pub type Buckets = Vec<(f64, u64)>;

pub fn buckets(text: &str, name: &str) -> Buckets {
    let prefix = format!("{name}_bucket{{");
    let mut out: Buckets = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((labels, value)) = split_sample(&line[prefix.len()..]) else {
            continue;
        };
        let Some(le) = labels
            .iter()
            .find(|(k, _)| k == "le")
            .and_then(|(_, v)| match v.as_str() {
                "+Inf" => Some(f64::INFINITY),
                v => v.parse::<f64>().ok(),
            })
        else {
            continue;
        };
        let Some(n) = value.parse::<f64>().ok().map(|v| v as u64) else {
            continue;
        };
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += n,
            None => out.push((le, n)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Parse the rest of a sample line after its `{`: the labels (values unescaped as the
/// text format escapes them: `\\`, `\"`, `\n`) and the value. `None` if malformed.
fn split_sample(rest: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = rest;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            let value = r.trim_start().split(' ').next()?;
            return Some((labels, value));
        }
        let (key, r) = rest.split_once("=\"")?;
        let mut val = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                (i, '"') => break i + 1,
                (_, c) => val.push(c),
            }
        };
        labels.push((key.trim_start_matches(',').to_string(), val));
        rest = r[end..].trim_start_matches(',');
    }
}

/// `after - before`, bucket by bucket (a bucket missing from `before` counts as 0).
pub fn delta(after: &Buckets, before: &Buckets) -> Buckets {
    after
        .iter()
        .map(|&(le, n)| {
            let b = before.iter().find(|(x, _)| *x == le).map_or(0, |&(_, c)| c);
            (le, n.saturating_sub(b))
        })
        .collect()
}

/// The `q` quantile (0..=1) of cumulative buckets, interpolated linearly inside the
/// bucket that holds it; `None` when the histogram is empty. A quantile in the `+Inf`
/// bucket is reported as the largest finite bound.
pub fn quantile(b: &Buckets, q: f64) -> Option<f64> {
    let total = b.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let (mut lo, mut below) = (0.0, 0u64);
    for &(le, n) in b {
        if n as f64 >= rank && n > below {
            if le.is_infinite() {
                return Some(lo);
            }
            let frac = (rank - below as f64) / (n - below) as f64;
            return Some(lo + (le - lo) * frac.clamp(0.0, 1.0));
        }
        lo = le;
        below = n;
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE x_seconds histogram
x_seconds_bucket{backend=\"a\",le=\"0.001\"} 10
x_seconds_bucket{backend=\"a\",le=\"0.002\"} 20
x_seconds_bucket{backend=\"a\",le=\"+Inf\"} 20
x_seconds_bucket{backend=\"b\",le=\"0.001\"} 0
x_seconds_bucket{backend=\"b\",le=\"0.002\"} 60
x_seconds_bucket{backend=\"b\",le=\"+Inf\"} 80
x_seconds_count{backend=\"a\"} 20
y_seconds_bucket{backend=\"a\",le=\"0.001\"} 999
";

    #[test]
    fn sums_label_sets_and_interpolates_quantiles() {
        let b = buckets(TEXT, "x_seconds");
        assert_eq!(b, vec![(0.001, 10), (0.002, 80), (f64::INFINITY, 100)]);
        // rank 5 of 10 in the first bucket: halfway from 0 to 1 ms.
        assert_eq!(quantile(&b, 0.05), Some(0.0005));
        // rank 45: 35 of 70 into (1 ms, 2 ms].
        assert!((quantile(&b, 0.45).unwrap() - 0.0015).abs() < 1e-12);
        // rank 99 is in +Inf: the largest finite bound.
        assert_eq!(quantile(&b, 0.99), Some(0.002));
    }

    #[test]
    fn escaped_label_values_do_not_confuse_le() {
        // A site named `tricky le="9" },\` (escaped as the text format does).
        let text = "x_seconds_bucket{site=\"tricky le=\\\"9\\\" },\\\\\",le=\"0.002\"} 20\n\
                    x_seconds_bucket{site=\"tricky le=\\\"9\\\" },\\\\\",le=\"+Inf\"} 21\n";
        assert_eq!(
            buckets(text, "x_seconds"),
            vec![(0.002, 20), (f64::INFINITY, 21)]
        );
    }

    #[test]
    fn a_window_is_the_difference_of_two_scrapes() {
        let before = vec![(0.001, 10), (0.002, 10), (f64::INFINITY, 10)];
        let after = vec![(0.001, 10), (0.002, 30), (f64::INFINITY, 30)];
        let d = delta(&after, &before);
        assert_eq!(d, vec![(0.001, 0), (0.002, 20), (f64::INFINITY, 20)]);
        assert_eq!(quantile(&d, 0.5), Some(0.0015));
        assert_eq!(quantile(&delta(&before, &before), 0.5), None);
        assert_eq!(quantile(&Vec::new(), 0.5), None);
    }
}
