//! A small, dependency-free line-chart writer producing standalone SVG.
//!
//! Enough for the lab's figures: a title, x/y axes with "nice" ticks, labels
//! with units, a legend, several series (colour-blind-safe palette plus a
//! distinct marker shape per series, so the lines stay apart in greyscale),
//! an optional log y axis and optional horizontal reference line (a QoS
//! threshold, Fig. 8), error bars (± one standard deviation over repeats)
//! and scatter series (Fig. 6's per-request cloud). Output is deterministic:
//! the same chart gives the same bytes. This is the lab's only plotting module.
//!
//! Non-finite y values (and, on a log axis, values <= 0) are gaps: the line
//! is broken there instead of drawn to a made-up value.

use std::fmt::Write as _;

/// Okabe–Ito palette: distinguishable with the common colour-vision deficiencies.
const PALETTE: [&str; 7] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
];
/// Above this many points a series is drawn as a bare line: markers would
/// merge into a smear (a 100-second time series, Fig. 6/7).
const MARKERS_POINTS_MAX: usize = 40;
/// Aimed-for number of ticks per axis; the actual count is 4..=11.
const TICKS_TARGET: usize = 6;

/// One named line of a [`Chart`].
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// `(x, y)` points, drawn in the given order.
    pub points: Vec<(f64, f64)>,
    /// Half-height of each point's error bar (same length as `points`; empty = none).
    pub err: Vec<f64>,
    /// Dots only, no line (a cloud of samples).
    pub scatter: bool,
}

/// A line chart. Build with [`Chart::new`] and the builder methods, render with [`Chart::to_svg`].
#[derive(Clone, Debug)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label, with unit, e.g. `"clients"` or `"time (s)"`.
    pub x_label: String,
    /// Y axis label, with unit, e.g. `"avg response time (ms)"`.
    pub y_label: String,
    /// Logarithmic y axis (decades). Default false.
    pub log_y: bool,
    /// Start a linear y axis at zero when all values are positive. Default true.
    pub y_from_zero: bool,
    /// Optional horizontal reference line at `y` with a label.
    pub hline: Option<(f64, String)>,
    /// The lines, in legend order.
    pub series: Vec<Series>,
    /// Image width in px. Default 720.
    pub width_px: u32,
    /// Image height in px. Default 420.
    pub height_px: u32,
}

impl Chart {
    /// A linear chart with no series.
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Chart {
        Chart {
            title: title.to_string(),
            x_label: x_label.to_string(),
            y_label: y_label.to_string(),
            log_y: false,
            y_from_zero: true,
            hline: None,
            series: Vec::new(),
            width_px: 720,
            height_px: 420,
        }
    }

    /// Sets a logarithmic y axis.
    pub fn log_y(mut self, on: bool) -> Chart {
        self.log_y = on;
        self
    }

    /// Adds a horizontal reference line.
    pub fn hline(mut self, y: f64, label: &str) -> Chart {
        self.hline = Some((y, label.to_string()));
        self
    }

    /// Adds a series.
    pub fn series(mut self, name: &str, points: Vec<(f64, f64)>) -> Chart {
        self.series.push(Series {
            name: name.to_string(),
            points,
            ..Series::default()
        });
        self
    }

    /// Adds a series with error bars of half-height `err[i]` at point `i` (bars of 0
    /// are not drawn).
    pub fn series_err(mut self, name: &str, points: Vec<(f64, f64)>, err: Vec<f64>) -> Chart {
        self.series.push(Series {
            name: name.to_string(),
            points,
            err,
            scatter: false,
        });
        self
    }

    /// Adds a scatter series: small dots, no line.
    pub fn scatter(mut self, name: &str, points: Vec<(f64, f64)>) -> Chart {
        self.series.push(Series {
            name: name.to_string(),
            points,
            err: Vec::new(),
            scatter: true,
        });
        self
    }

    /// Renders a standalone SVG document (starts with `<svg`, no XML prolog,
    /// so it can also be inlined into HTML as is).
    pub fn to_svg(&self) -> String {
        let w = f64::from(self.width_px.max(200));
        let h = f64::from(self.height_px.max(150));
        let mut out = String::new();
        let _ = write!(
            out,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">"##
        );
        out.push('\n');
        let _ = writeln!(
            out,
            r##"<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="22" text-anchor="middle" font-size="15" font-weight="bold" fill="#222">{}</text>"##,
            w / 2.0,
            escape(&self.title)
        );

        // Legend rows under the title; the plot starts below them.
        let (legend, legend_rows) = self.legend(w);
        let top = 40.0 + 18.0 * legend_rows as f64;
        let (left, right, bottom) = (74.0, w - 24.0, h - 48.0);
        let plot = Rect {
            left,
            right,
            top,
            bottom,
        };

        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| x.is_finite() && self.y_ok(y))
            .collect();
        // The y range covers the error bars too.
        let mut y_range = points.clone();
        for s in &self.series {
            for (&(x, y), &e) in s.points.iter().zip(&s.err) {
                for v in [y - e, y + e] {
                    if x.is_finite() && self.y_ok(y) && self.y_ok(v) {
                        y_range.push((x, v));
                    }
                }
            }
        }
        let (x_ticks, x_lo, x_hi) = axis_x(&points);
        let y_axis = self.axis_y(&y_range);

        // Grid and ticks.
        out.push_str(r##"<g stroke="#e3e3e3" stroke-width="1">"##);
        out.push('\n');
        for &t in &x_ticks {
            let px = plot.x(t, x_lo, x_hi);
            let _ = writeln!(
                out,
                r#"<line x1="{px:.1}" y1="{top:.1}" x2="{px:.1}" y2="{bottom:.1}"/>"#
            );
        }
        for t in &y_axis.ticks {
            let py = plot.y(y_axis.map(t.value));
            let width = if t.major { "1" } else { "0.5" };
            let _ = writeln!(
                out,
                r#"<line x1="{left:.1}" y1="{py:.1}" x2="{right:.1}" y2="{py:.1}" stroke-width="{width}"/>"#
            );
        }
        out.push_str("</g>\n");
        let _ = writeln!(
            out,
            r##"<rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#444" stroke-width="1"/>"##,
            right - left,
            bottom - top
        );
        let x_step = step_of(&x_ticks);
        out.push_str(r##"<g fill="#333" text-anchor="middle">"##);
        out.push('\n');
        for &t in &x_ticks {
            let px = plot.x(t, x_lo, x_hi);
            let _ = writeln!(
                out,
                r##"<line x1="{px:.1}" y1="{bottom:.1}" x2="{px:.1}" y2="{:.1}" stroke="#444"/><text x="{px:.1}" y="{:.1}">{}</text>"##,
                bottom + 5.0,
                bottom + 18.0,
                format_tick(t, x_step)
            );
        }
        out.push_str("</g>\n");
        out.push_str(r##"<g fill="#333" text-anchor="end">"##);
        out.push('\n');
        for t in y_axis.ticks.iter().filter(|t| t.label.is_some()) {
            let py = plot.y(y_axis.map(t.value));
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{py:.1}" x2="{left:.1}" y2="{py:.1}" stroke="#444"/><text x="{:.1}" y="{:.1}">{}</text>"##,
                left - 5.0,
                left - 8.0,
                py + 4.0,
                t.label.as_deref().unwrap_or_default()
            );
        }
        out.push_str("</g>\n");
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#222">{}</text>"##,
            (left + right) / 2.0,
            h - 12.0,
            escape(&self.x_label)
        );
        let (ylx, yly) = (16.0, (top + bottom) / 2.0);
        let _ = writeln!(
            out,
            r##"<text x="{ylx:.1}" y="{yly:.1}" text-anchor="middle" fill="#222" transform="rotate(-90 {ylx:.1} {yly:.1})">{}</text>"##,
            escape(&self.y_label)
        );

        if points.is_empty() {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#888" font-size="14">no data</text>"##,
                (left + right) / 2.0,
                (top + bottom) / 2.0
            );
        }

        if let Some((y, label)) = &self.hline {
            if self.y_ok(*y) {
                let m = y_axis.map(*y);
                if (0.0..=1.0).contains(&m) {
                    let py = plot.y(m);
                    let _ = writeln!(
                        out,
                        r##"<line x1="{left:.1}" y1="{py:.1}" x2="{right:.1}" y2="{py:.1}" stroke="#B00020" stroke-width="1.2" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#B00020" stroke="#fff" stroke-width="3" paint-order="stroke">{}</text>"##,
                        right - 4.0,
                        py - 4.0,
                        escape(label)
                    );
                }
            }
        }

        // Data, clipped to the plot area. The id only depends on the clip
        // geometry, so charts inlined into one HTML page that share an id
        // also share the same rectangle.
        let clip_id = format!("clip-{w}-{h}-{top}");
        let _ = writeln!(
            out,
            r#"<clipPath id="{clip_id}"><rect x="{left:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath>"#,
            top - 4.0,
            right - left + 4.0,
            bottom - top + 8.0
        );
        let _ = writeln!(
            out,
            r#"<g clip-path="url(#{clip_id})" fill="none" stroke-linejoin="round" stroke-linecap="round">"#
        );
        for (i, s) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let mapped: Vec<Option<(f64, f64)>> = s
                .points
                .iter()
                .map(|&(x, y)| {
                    (x.is_finite() && self.y_ok(y))
                        .then(|| (plot.x(x, x_lo, x_hi), plot.y(y_axis.map(y))))
                })
                .collect();
            if s.scatter {
                for &(x, y) in mapped.iter().flatten() {
                    let _ = writeln!(
                        out,
                        r#"<circle cx="{x:.1}" cy="{y:.1}" r="1.6" fill="{color}" fill-opacity="0.55" stroke="none"/>"#
                    );
                }
                continue;
            }
            for (&(x, y), &e) in s.points.iter().zip(&s.err) {
                if !(x.is_finite() && self.y_ok(y) && e > 0.0 && e.is_finite()) {
                    continue;
                }
                let px = plot.x(x, x_lo, x_hi);
                let lo = if self.y_ok(y - e) { y - e } else { y };
                let (y1, y2) = (plot.y(y_axis.map(lo)), plot.y(y_axis.map(y + e)));
                let _ = writeln!(
                    out,
                    r#"<path d="M{px:.1},{y1:.1}V{y2:.1}M{:.1},{y1:.1}H{:.1}M{:.1},{y2:.1}H{:.1}" stroke="{color}" stroke-width="1.2"/>"#,
                    px - 4.0,
                    px + 4.0,
                    px - 4.0,
                    px + 4.0
                );
            }
            for segment in mapped.split(|p| p.is_none()) {
                let pts: Vec<String> = segment
                    .iter()
                    .flatten()
                    .map(|(x, y)| format!("{x:.1},{y:.1}"))
                    .collect();
                if pts.len() >= 2 {
                    let _ = writeln!(
                        out,
                        r#"<polyline stroke="{color}" stroke-width="2" points="{}"/>"#,
                        pts.join(" ")
                    );
                }
            }
            let valid = mapped.iter().flatten().count();
            // A lone point has no line, so it always gets a marker.
            if valid <= MARKERS_POINTS_MAX || valid == 1 {
                for &(x, y) in mapped.iter().flatten() {
                    out.push_str(&marker(i, x, y, color));
                    out.push('\n');
                }
            }
        }
        out.push_str("</g>\n");
        out.push_str(&legend);
        out.push_str("</svg>\n");
        out
    }

    fn y_ok(&self, y: f64) -> bool {
        y.is_finite() && (!self.log_y || y > 0.0)
    }

    /// Legend markup and the number of rows it takes.
    fn legend(&self, w: f64) -> (String, usize) {
        if self.series.is_empty() {
            return (String::new(), 0);
        }
        let mut out = String::new();
        let (x0, x_max) = (74.0, w - 24.0);
        let (mut x, mut row) = (x0, 0usize);
        for (i, s) in self.series.iter().enumerate() {
            // The legend shows a marker only where the line has them.
            let marked = s.points.len() <= MARKERS_POINTS_MAX && !s.scatter;
            // Rough text width: 7 px per char at 12 px sans-serif.
            let item_w = 34.0 + 7.0 * s.name.chars().count() as f64 + 18.0;
            if x + item_w > x_max && x > x0 {
                x = x0;
                row += 1;
            }
            let y = 40.0 + 18.0 * row as f64 - 6.0;
            let color = PALETTE[i % PALETTE.len()];
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="{}"/>{}<text x="{:.1}" y="{:.1}" fill="#222">{}</text>"##,
                x + 26.0,
                if s.scatter { "5" } else { "2" },
                if marked {
                    marker(i, x + 13.0, y, color)
                } else {
                    String::new()
                },
                x + 32.0,
                y + 4.0,
                escape(&s.name)
            );
            x += item_w;
        }
        (out, row + 1)
    }

    fn axis_y(&self, points: &[(f64, f64)]) -> YAxis {
        let ys = points.iter().map(|p| p.1);
        let mut lo = ys.clone().fold(f64::INFINITY, f64::min);
        let mut hi = ys.fold(f64::NEG_INFINITY, f64::max);
        if let Some((y, _)) = &self.hline {
            if self.y_ok(*y) && lo.is_finite() {
                lo = lo.min(*y);
                hi = hi.max(*y);
            }
        }
        if self.log_y {
            if !lo.is_finite() {
                (lo, hi) = (1.0, 10.0);
            }
            let d_lo = lo.log10().floor();
            let mut d_hi = hi.log10().ceil();
            if d_hi <= d_lo {
                d_hi = d_lo + 1.0;
            }
            let decades = (d_hi - d_lo) as i32;
            let mut ticks = Vec::new();
            for d in (d_lo as i32)..=(d_hi as i32) {
                for m in [1.0, 2.0, 5.0] {
                    let v = m * 10f64.powi(d);
                    if d == d_hi as i32 && m > 1.0 {
                        break;
                    }
                    // Few decades: label 1-2-5; many: label decades only.
                    let label = (m == 1.0 || decades <= 2).then(|| format_log_tick(v));
                    ticks.push(Tick {
                        value: v,
                        label,
                        major: m == 1.0,
                    });
                }
            }
            return YAxis {
                log: true,
                lo: d_lo,
                hi: d_hi,
                ticks,
            };
        }
        if !lo.is_finite() {
            (lo, hi) = (0.0, 1.0);
        }
        if self.y_from_zero && lo > 0.0 {
            lo = 0.0;
        }
        if hi <= lo {
            hi = lo + if lo == 0.0 { 1.0 } else { lo.abs() };
        }
        let values = nice_ticks(lo, hi, TICKS_TARGET);
        let step = step_of(&values);
        let ticks = values
            .iter()
            .map(|&v| Tick {
                value: v,
                label: Some(format_tick(v, step)),
                major: true,
            })
            .collect();
        YAxis {
            log: false,
            lo: values[0],
            hi: values[values.len() - 1],
            ticks,
        }
    }
}

struct Rect {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Rect {
    fn x(&self, v: f64, lo: f64, hi: f64) -> f64 {
        self.left + (v - lo) / (hi - lo) * (self.right - self.left)
    }
    /// Pixel y of a fraction 0..=1 of the axis height (see [`YAxis::map`]).
    fn y(&self, frac: f64) -> f64 {
        self.bottom - frac * (self.bottom - self.top)
    }
}

struct Tick {
    value: f64,
    label: Option<String>,
    major: bool,
}

struct YAxis {
    log: bool,
    /// Axis-space bounds (log10 of the value on a log axis).
    lo: f64,
    hi: f64,
    ticks: Vec<Tick>,
}

impl YAxis {
    /// Fraction 0..=1 of the axis height at value `v`.
    fn map(&self, v: f64) -> f64 {
        let a = if self.log { v.log10() } else { v };
        (a - self.lo) / (self.hi - self.lo)
    }
}

fn axis_x(points: &[(f64, f64)]) -> (Vec<f64>, f64, f64) {
    let mut lo = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let mut hi = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi <= lo {
        (lo, hi) = (lo - 1.0, hi + 1.0);
    }
    let mut ticks = nice_ticks(lo, hi, TICKS_TARGET);
    // Counts (clients, busy processes) have no 0.5: keep integer steps.
    let integral = !points.is_empty() && points.iter().all(|p| p.0.fract() == 0.0);
    if integral && step_of(&ticks) < 1.0 {
        ticks = (lo.floor() as i64..=hi.ceil() as i64)
            .map(|i| i as f64)
            .collect();
    }
    let (a, b) = (ticks[0], ticks[ticks.len() - 1]);
    (ticks, a, b)
}

/// Evenly spaced "nice" ticks (steps of 1, 2 or 5 × 10^k) covering `lo..=hi`.
/// The first tick is <= `lo`, the last >= `hi`. Requires `lo < hi`, both finite.
pub fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    assert!(lo.is_finite() && hi.is_finite() && lo < hi, "bad range");
    let raw = (hi - lo) / target.max(1) as f64;
    let exp = raw.log10().floor() as i32;
    let mag = 10f64.powi(exp);
    let mult = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|m| m * mag >= raw * 0.999)
        .unwrap_or(10.0);
    // Tick i is i * mult * 10^exp. For negative exponents divide by the
    // exact power of ten instead of multiplying by its inexact inverse, so
    // 6 * 0.05 comes out as 0.3, not 0.30000000000000004.
    let at = |i: i64| {
        let v = if exp < 0 {
            i as f64 * mult / 10f64.powi(-exp)
        } else {
            i as f64 * mult * mag
        };
        if v == 0.0 {
            0.0 // no negative zero
        } else {
            v
        }
    };
    let step = at(1);
    let first = (lo / step + 1e-9).floor() as i64;
    let last = (hi / step - 1e-9).ceil() as i64;
    (first..=last).map(at).collect()
}

fn step_of(ticks: &[f64]) -> f64 {
    if ticks.len() >= 2 {
        ticks[1] - ticks[0]
    } else {
        1.0
    }
}

/// A tick label with as many decimals as the step needs; thousands as `k`, millions as `M`.
pub fn format_tick(v: f64, step: f64) -> String {
    let (v, step, suffix) = if step >= 1e5 {
        (v / 1e6, step / 1e6, "M")
    } else if step >= 1e3 {
        (v / 1e3, step / 1e3, "k")
    } else {
        (v, step, "")
    };
    let decimals = if step >= 1.0 - 1e-9 {
        0
    } else {
        (-step.log10()).ceil().max(0.0) as usize
    };
    let v = if v.abs() < step * 1e-6 { 0.0 } else { v };
    format!("{v:.decimals$}{suffix}")
}

fn format_log_tick(v: f64) -> String {
    if v >= 1.0 {
        format_tick(v, if v >= 1e3 { v } else { 1.0 })
    } else {
        // 0.05, 0.002, ...: just enough decimals.
        let decimals = (-v.log10()).ceil() as usize;
        format!("{v:.decimals$}")
    }
}

/// Marker `i % 4`: circle, square, triangle, diamond.
fn marker(i: usize, x: f64, y: f64, color: &str) -> String {
    match i % 4 {
        0 => format!(
            r##"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}" stroke="#fff" stroke-width="0.8"/>"##
        ),
        1 => format!(
            r##"<rect x="{:.1}" y="{:.1}" width="7" height="7" fill="{color}" stroke="#fff" stroke-width="0.8"/>"##,
            x - 3.5,
            y - 3.5
        ),
        2 => format!(
            r##"<path d="M{x:.1},{:.1}L{:.1},{:.1}L{:.1},{:.1}Z" fill="{color}" stroke="#fff" stroke-width="0.8"/>"##,
            y - 4.5,
            x + 4.5,
            y + 3.5,
            x - 4.5,
            y + 3.5
        ),
        _ => format!(
            r##"<path d="M{x:.1},{:.1}L{:.1},{y:.1}L{x:.1},{:.1}L{:.1},{y:.1}Z" fill="{color}" stroke="#fff" stroke-width="0.8"/>"##,
            y - 4.5,
            x + 4.5,
            y + 4.5,
            x - 4.5
        ),
    }
}

/// Escapes text for XML/HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Test helper: checks that `doc` is a single element tree with balanced,
/// properly nested tags and that it is an `<svg` document. Not a full XML
/// parser; enough to catch a missing close tag or a stray `<`.
#[cfg(test)]
pub(crate) fn check_well_formed(doc: &str) -> Result<(), String> {
    if !doc.trim_start().starts_with("<svg") {
        return Err("does not start with <svg".into());
    }
    let mut stack: Vec<String> = Vec::new();
    let mut rest = doc;
    let mut roots = 0;
    while let Some(i) = rest.find('<') {
        if rest[..i].contains('>') {
            return Err(format!("stray '>' near {:?}", &rest[..i.min(40)]));
        }
        rest = &rest[i..];
        let end = rest.find('>').ok_or("unterminated tag")?;
        let tag = &rest[1..end];
        if tag.contains('<') {
            return Err(format!("'<' inside tag {tag:?}"));
        }
        if tag.starts_with('?') || tag.starts_with('!') {
        } else if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("close </{name}> without open"))?;
            if open != name.trim() {
                return Err(format!("<{open}> closed by </{name}>"));
            }
        } else {
            let name: String = tag
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '/')
                .collect();
            if stack.is_empty() {
                roots += 1;
            }
            if tag.matches('"').count() & 1 == 1 {
                return Err(format!("unbalanced quotes in <{name}>"));
            }
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &rest[end + 1..];
    }
    if !stack.is_empty() {
        return Err(format!("unclosed tags: {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ticks_cover_the_range_with_round_steps() {
        assert_eq!(
            nice_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(
            nice_ticks(40.0, 640.0, 6),
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
        );
        let t = nice_ticks(0.0, 0.3, 6);
        assert_eq!(t, vec![0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]);
        let t = nice_ticks(-3.2, 7.9, 6);
        assert!(t[0] <= -3.2 && *t.last().unwrap() >= 7.9);
    }

    #[test]
    fn tick_labels_use_the_step_precision() {
        assert_eq!(format_tick(0.15, 0.05), "0.15");
        assert_eq!(format_tick(200.0, 100.0), "200");
        assert_eq!(format_tick(2500.0, 500.0), "2500");
        assert_eq!(format_tick(4000.0, 2000.0), "4k");
        assert_eq!(format_tick(1.5e6, 5e5), "1.5M");
        assert_eq!(format_tick(1.2e5, 2e4), "120k");
        assert_eq!(format_log_tick(0.01), "0.01");
        assert_eq!(format_log_tick(1000.0), "1k");
        assert_eq!(format_log_tick(50.0), "50");
    }

    #[test]
    fn error_bars_and_scatter_are_drawn_and_widen_the_axis() {
        let bars = Chart::new("bars", "x", "y")
            .series_err("a", vec![(1.0, 10.0), (2.0, 20.0)], vec![0.0, 15.0])
            .to_svg();
        check_well_formed(&bars).unwrap();
        // One bar (the zero one is not drawn), and the axis reaches 20 + 15.
        assert_eq!(bars.matches("<path d=\"M").count(), 1, "{bars}");
        assert!(bars.contains(">35<") || bars.contains(">40<"), "{bars}");
        let cloud = Chart::new("cloud", "t (s)", "ms")
            .log_y(true)
            .hline(1000.0, "QoS")
            .scatter("a", (0..100).map(|i| (i as f64, 1.0 + i as f64)).collect())
            .to_svg();
        check_well_formed(&cloud).unwrap();
        // Dots, no line, even above the marker limit; the QoS line is there.
        assert_eq!(cloud.matches("r=\"1.6\"").count(), 100);
        assert!(!cloud.contains("<polyline"));
        assert!(cloud.contains("QoS"));
    }

    #[test]
    fn charts_are_well_formed_in_every_shape() {
        let charts = [
            Chart::new("empty", "x", "y"),
            Chart::new("one point", "x", "y").series("a", vec![(1.0, 2.0)]),
            Chart::new("flat", "x", "y").series("a", vec![(1.0, 2.0), (2.0, 2.0)]),
            Chart::new("gaps <&>", "x (s)", "y (ms)").series(
                "a \"q\"",
                vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0), (3.0, 4.0)],
            ),
            Chart::new("log", "x", "y")
                .log_y(true)
                .hline(1000.0, "QoS 1 s")
                .series("a", vec![(0.0, 0.5), (1.0, 0.0), (2.0, 5000.0)])
                .series("b", vec![(0.0, 3.0), (2.0, 30.0)]),
        ];
        assert!(
            charts[4].to_svg().contains("QoS 1 s"),
            "reference line drawn"
        );
        for c in &charts {
            let svg = c.to_svg();
            check_well_formed(&svg).unwrap_or_else(|e| panic!("{}: {e}\n{svg}", c.title));
        }
    }

    #[test]
    fn text_is_escaped_and_output_is_deterministic() {
        let c = Chart::new("a<b", "x", "y").series("s&t", vec![(0.0, 1.0), (1.0, 2.0)]);
        let svg = c.to_svg();
        assert!(svg.contains("a&lt;b") && svg.contains("s&amp;t"));
        assert_eq!(svg, c.to_svg());
    }

    #[test]
    fn well_formed_check_catches_breakage() {
        assert!(check_well_formed("<svg><g></svg>").is_err());
        assert!(check_well_formed("<svg></svg><svg></svg>").is_err());
        assert!(check_well_formed("<html></html>").is_err());
        assert!(check_well_formed("<svg><g/></svg>").is_ok());
    }
}
