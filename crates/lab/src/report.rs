//! Outputs of a lab run: the text table on the terminal, and into `--out DIR`
//! `summary.json`, CSV files (written with the `csv` crate), SVG figures ([`crate::svg`],
//! the lab's one plotting module) and a self-contained `report.html`. The sweep runner
//! calls [`write_all`] on the summary it rebuilds from `points.jsonl`, as
//! `farside lab report DIR` does ([`crate::sweep::regenerate`]).
//!
//! This is the shell every experiment shares; the experiment's own parts come through
//! [`Experiment`]. Files written by [`write_all`], in this order (names are stable;
//! names built from point fields are sanitised to `[A-Za-z0-9._-]`):
//!
//! | file | content |
//! |---|---|
//! | `summary.json` | [`Summary`], pretty JSON, without per-run extras (series, samples) |
//! | [`Experiment::files`] | the experiment's CSV files (and `table.txt`, series) |
//! | [`Experiment::figures`] | its SVG figures |
//! | `report.html` | title, run metadata and warnings, parameters, the experiment's tables, figures inlined, notes |
//!
//! Each experiment's module doc lists its own files.
//!
//! Everything is a pure function of the [`Summary`]: the same input gives
//! byte-identical files.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::experiment::Experiment;
use crate::summary::Summary;
use crate::svg::escape;

/// Prints the run lines and the experiment's table ([`table_text`]).
pub fn print_table<E: Experiment>(s: &Summary<E::Point>, w: &mut impl Write) -> io::Result<()> {
    w.write_all(table_text::<E>(s).as_bytes())
}

/// What ran where: commit, kernel, CPU, seed, whether the run was quick or unfinished,
/// and every privileged setting that was not applied (one per line).
pub fn run_lines<P>(s: &Summary<P>) -> String {
    let mut out = String::new();
    let dirty = match s.commit_dirty {
        Some(true) => " (dirty tree)",
        _ => "",
    };
    let build = s
        .build
        .as_deref()
        .map_or_else(String::new, |b| format!("; build {b}"));
    let _ = writeln!(
        out,
        "commit {}{dirty}{build}; kernel {}; CPU {} x {}; seed {}",
        s.commit.as_deref().unwrap_or("unknown"),
        if s.kernel.is_empty() {
            "unknown"
        } else {
            &s.kernel
        },
        s.cpus,
        if s.cpu_model.is_empty() {
            "unknown"
        } else {
            &s.cpu_model
        },
        s.seed.map_or_else(|| "none".to_string(), |x| x.to_string())
    );
    if s.quick {
        let _ = writeln!(
            out,
            "quick run: for demos and smoke tests, not for comparison"
        );
    }
    if !s.finished {
        let _ = writeln!(
            out,
            "unfinished sweep: points so far only (`--resume DIR` continues it)"
        );
    }
    for (name, st) in &s.settings {
        if !st.applied {
            let _ = writeln!(
                out,
                "warning: {name} = {} not applied: {}",
                st.requested,
                st.reason.as_deref().unwrap_or("unknown reason")
            );
        }
    }
    // The trace a run replayed, when it says (`lab coop --trace`).
    if let Some(label) = s.params.get("trace_label").and_then(|v| v.as_str()) {
        let _ = writeln!(out, "trace: {label}");
    }
    // The one operator objective and what it set for each system (`lab admission`).
    if let Some(rule) = s.params.get("objective_rule").and_then(|v| v.as_str()) {
        let _ = writeln!(out, "objective: {rule}");
    }
    if let Some(by) = s
        .params
        .get("proxy_args_by_system")
        .and_then(|v| v.as_object())
    {
        for (sys, args) in by {
            let args: Vec<&str> = args
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            let _ = writeln!(out, "proxy args {sys}: {}", args.join(" "));
        }
    }
    out
}

/// The text of [`print_table`]: the run lines, then the experiment's table.
pub fn table_text<E: Experiment>(s: &Summary<E::Point>) -> String {
    let mut out = run_lines(s);
    out.push('\n');
    out.push_str(&E::table(s));
    if s.points.is_empty() {
        let _ = writeln!(out, "{}: no points measured", s.experiment);
    }
    out
}

/// Writes every output of the run into `dir` (created if missing) and
/// returns the paths written, in writing order. See the module docs for the list.
pub fn write_all<E: Experiment>(s: &Summary<E::Point>, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut put = |name: &str, text: &str| -> io::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        written.push(path);
        Ok(())
    };
    put("summary.json", &(s.to_json_pretty() + "\n"))?;
    for (name, text) in E::files(s)? {
        put(&name, &text)?;
    }
    let figures = E::figures(s);
    for (name, _, svg) in &figures {
        put(name, svg)?;
    }
    put("report.html", &html::<E>(s, &figures))?;
    Ok(written)
}

/// CSV text of `rows` under `head` (RFC 4180 quoting by the `csv` crate).
pub fn csv_text(head: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> io::Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(head).map_err(io::Error::other)?;
    for r in rows {
        w.write_record(&r).map_err(io::Error::other)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| io::Error::other(e.to_string()))?;
    String::from_utf8(bytes).map_err(io::Error::other)
}

fn html<E: Experiment>(s: &Summary<E::Point>, figures: &[crate::experiment::Figure]) -> String {
    let mut out = String::new();
    let title = format!("farside lab — {}", s.experiment);
    let _ = write!(
        out,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{t}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }}
h1 {{ margin-bottom: 0.2em; }}
.meta {{ color: #555; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; }}
td {{ text-align: right; font-variant-numeric: tabular-nums; }}
th {{ background: #f2f2f2; }}
td.missing {{ color: #aaa; text-align: center; }}
.imp {{ font-weight: bold; margin: 0.3em 0 1.5em 0; }}
figure {{ margin: 1em 0; }}
figcaption {{ color: #555; font-size: 13px; }}
pre {{ background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 12px; }}
</style>
</head>
<body>
<h1>{t}</h1>
<p class="meta">hosts: {hosts} · started {start} UTC · duration {dur:.1} s{quick}</p>
"#,
        t = escape(&title),
        hosts = escape(&s.hosts),
        start = utc_string(s.started_unix_s),
        dur = s.duration_s,
        quick = if s.quick {
            " · <b>quick run</b> (smoke test, not for comparison)"
        } else {
            ""
        },
    );
    let _ = writeln!(out, "<h2>Run</h2>\n<pre>{}</pre>", escape(&run_lines(s)));
    let _ = writeln!(out, "<h2>Parameters</h2>");
    let params = serde_json::to_string_pretty(&s.params).unwrap_or_default();
    let _ = writeln!(out, "<pre>{}</pre>", escape(&params));
    out.push_str(&E::html(s));
    if s.points.is_empty() {
        out.push_str("<p>No points were measured.</p>\n");
    }

    if !figures.is_empty() {
        out.push_str("<h2>Figures</h2>\n");
    }
    for (name, caption, svg) in figures {
        let _ = writeln!(
            out,
            "<figure>\n{}<figcaption>{} — <a href=\"{n}\">{n}</a></figcaption>\n</figure>",
            svg,
            escape(caption),
            n = escape(name)
        );
    }

    out.push_str("<h2>Notes</h2>\n");
    if s.notes.is_empty() {
        out.push_str("<p>None.</p>\n");
    } else {
        out.push_str("<ul>\n");
        for n in &s.notes {
            let _ = writeln!(out, "<li>{}</li>", escape(n));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// Keeps `[A-Za-z0-9._-]`, maps anything else to `_`, so names are safe in file names.
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with('.') {
        format!("_{out}")
    } else {
        out
    }
}

/// `1000` for whole numbers, else up to 3 decimals.
pub fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time, without a date library.
fn utc_string(unix_s: u64) -> String {
    let (y, m, d, hh, mm, ss) = farside_rt::clock::utc(unix_s);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}:{ss:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitised_and_dates_are_utc() {
        assert_eq!(sanitize("world cup/98"), "world_cup_98");
        assert_eq!(sanitize(".."), "_..");
        assert_eq!(utc_string(0), "1970-01-01 00:00:00");
        assert_eq!(utc_string(951_782_400), "2000-02-29 00:00:00");
    }
}
