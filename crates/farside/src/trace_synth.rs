//! `farside trace synth`: write a synthetic trace fitted to a classic trace's published
//! statistics (`farside_coop::synth`), in the World Cup sample's format, for
//! `farside lab coop --trace FILE` or `farside loadgen --trace worldcup --trace-file FILE`.
//!
//! Beside `NAME.csv.gz` it writes `NAME.synth.json`: the profile, its source and the rules
//! used where a figure was not published, the exact command and seed (which regenerate
//! the file byte for byte: its FNV-1a digest is recorded), and the trace as measured
//! (distinct documents, sizes, top-25 share, fitted alpha, one-timers, W90). Before it
//! reports success it reads the file back with both readers of the format (the lab's and
//! the load generator's) and refuses a file either would skip rows of.

use farside_coop::synth::{self, Profile};
use farside_coop::trace::Trace;
use std::path::{Path, PathBuf};

/// `farside trace ...`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    pub what: TraceWhat,
}

/// What to do with traces.
#[derive(Debug, clap::Subcommand)]
pub enum TraceWhat {
    /// Write a synthetic trace fitted to published statistics of a classic web trace
    /// (profiles: ncsa-1994, bu-1995; figures and sources in data/TRACES.md) as gzip'd
    /// CSV in the World Cup sample's format, and NAME.synth.json beside it (profile,
    /// source, command, seed, digest, measured statistics). The same profile, requests
    /// and seed give the same bytes.
    Synth(SynthArgs),
}

/// `farside trace synth`.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// Profile: ncsa-1994 (NCSA's server, 2-3 Aug 1994: 8,949 documents, top 25 take
    /// 59 % of requests, median 3 KB, mean 17 KB) or bu-1995 (Boston University client
    /// traces: 46,830 documents, Zipf alpha 0.986; sizes by the ncsa-1994 rule).
    #[arg(long)]
    pub profile: String,
    /// Requests (rows) to write, 1..=10,000,000. Default 200,000 (the World Cup
    /// sample's size).
    #[arg(long, default_value_t = 200_000)]
    pub requests: usize,
    /// Seed of the generator (popularity draws, sessions, which size each document gets).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (`.csv.gz`); NAME.synth.json is written beside it.
    #[arg(long)]
    pub out: PathBuf,
}

/// The format tag of the `.synth.json` description.
pub const SIDECAR_FORMAT: &str = "farside-synth-trace/1";

/// Run `farside trace ...`.
pub fn run(a: TraceArgs) -> Result<(), String> {
    match a.what {
        TraceWhat::Synth(s) => synth_cmd(&s),
    }
}

fn synth_cmd(a: &SynthArgs) -> Result<(), String> {
    let names: Vec<&str> = synth::profiles().iter().map(|p| p.name).collect();
    let p = synth::profile(&a.profile).ok_or_else(|| {
        format!(
            "trace synth: no profile {:?} (profiles: {})",
            a.profile,
            names.join(", ")
        )
    })?;
    let rows =
        synth::synthesize(&p, a.requests, a.seed).map_err(|e| format!("trace synth: {e}"))?;
    synth::write_csv_gz(&rows, &a.out)
        .map_err(|e| format!("trace synth: {}: {e}", a.out.display()))?;
    let side = describe(&p, a, &a.out)?;
    let side_path = synth::sidecar_path(&a.out);
    std::fs::write(
        &side_path,
        serde_json::to_string_pretty(&side).expect("json") + "\n",
    )
    .map_err(|e| format!("trace synth: {}: {e}", side_path.display()))?;
    let m = &side["measured"];
    println!(
        "farside trace synth: {} rows of {} ({}) to {}",
        a.requests,
        p.name,
        p.label(),
        a.out.display()
    );
    println!(
        "  profile: {} documents, alpha {:.3}, median {:.0} B, mean {:.0} B",
        p.distinct_objects,
        p.alpha(),
        p.size_median_bytes,
        p.size_mean_bytes
    );
    println!(
        "  measured: {} documents requested ({:.0} expected), alpha fitted {:.3}, median {} B, \
         mean {:.0} B per document, {:.0} B per request, top {} {:.3} of requests, \
         one-timers {:.3}, W90 {} B",
        m["distinct_objects"],
        side["expected_distinct_objects"].as_f64().unwrap_or(0.0),
        m["alpha_fit"].as_f64().unwrap_or(f64::NAN),
        m["median_object_bytes"],
        m["mean_object_bytes"].as_f64().unwrap_or(0.0),
        m["mean_request_bytes"].as_f64().unwrap_or(0.0),
        synth::FIT_TOP,
        m["top_share"].as_f64().unwrap_or(0.0),
        m["one_timer_share"].as_f64().unwrap_or(0.0),
        side["w90_bytes"]
    );
    println!("  description: {}", side_path.display());
    Ok(())
}

/// The command that makes `out` (its file name only: it is regenerated where it is).
pub fn command_line(a: &SynthArgs, out: &Path) -> String {
    format!(
        "farside trace synth --profile {} --requests {} --seed {} --out {}",
        a.profile,
        a.requests,
        a.seed,
        out.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    )
}

/// Reads `out` back with both readers and describes it (the `.synth.json` content).
fn describe(p: &Profile, a: &SynthArgs, out: &Path) -> Result<serde_json::Value, String> {
    let e = |what: String| format!("trace synth: {}: {what}", out.display());
    let t = Trace::read_world_cup(out).map_err(|x| e(x.to_string()))?;
    let lg = farside_loadgen::WorldCupTrace::load(out).map_err(|x| e(x.to_string()))?;
    if t.requests.len() != a.requests || lg.sequence.len() != a.requests || lg.rows_skipped != 0 {
        return Err(e(format!(
            "read back {} / {} rows ({} skipped by the load generator's reader), wrote {}",
            t.requests.len(),
            lg.sequence.len(),
            lg.rows_skipped,
            a.requests
        )));
    }
    let bytes = std::fs::read(out).map_err(|x| e(x.to_string()))?;
    Ok(serde_json::json!({
        "format": SIDECAR_FORMAT,
        "profile": p.name,
        "synthetic": true,
        "label": p.label(),
        "source": p.source,
        "rules": p.rules,
        "sizes_published": p.sizes_published,
        "command": command_line(a, out),
        "requests": a.requests,
        "seed": a.seed,
        "file": out.file_name().map(|n| n.to_string_lossy().into_owned()),
        "file_bytes": bytes.len(),
        "fnv1a64": format!("{:016x}", synth::fnv1a64(&bytes)),
        "profile_figures": {
            "distinct_objects": p.distinct_objects,
            "alpha": p.alpha(),
            "size_median_bytes": p.size_median_bytes,
            "size_mean_bytes": p.size_mean_bytes,
            "body_bytes_max": synth::SYNTH_BODY_BYTES_MAX,
        },
        "expected_distinct_objects": synth::expected_distinct(p, a.requests),
        "measured": synth::fit(&t),
        "w90_bytes": t.working_set_bytes(0.9),
        "w99_bytes": t.working_set_bytes(0.99),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthetic_trace_reads_back_with_both_readers_and_describes_itself() {
        let dir = std::env::temp_dir().join(format!("farside-trace-synth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["ncsa-1994", "bu-1995"] {
            let out = dir.join(format!("{name}.csv.gz"));
            let a = SynthArgs {
                profile: name.into(),
                requests: 30_000,
                seed: 5,
                out: out.clone(),
            };
            synth_cmd(&a).unwrap();
            let side: serde_json::Value =
                serde_json::from_slice(&std::fs::read(synth::sidecar_path(&out)).unwrap()).unwrap();
            assert_eq!(side["format"], SIDECAR_FORMAT);
            assert_eq!(side["synthetic"], true);
            assert_eq!(side["requests"], 30_000);
            assert!(side["label"]
                .as_str()
                .unwrap()
                .starts_with("synthetic, fitted to"));
            // The load generator sees every row, its sessions and a 200 each.
            let lg = farside_loadgen::WorldCupTrace::load(&out).unwrap();
            assert_eq!((lg.sequence.len(), lg.rows_skipped), (30_000, 0));
            assert!(lg.not_modified.iter().all(|&n| !n));
            assert!(lg.clients.iter().max().unwrap() > &1_000);
            // The recorded command regenerates the same bytes.
            let first = std::fs::read(&out).unwrap();
            synth_cmd(&a).unwrap();
            assert_eq!(std::fs::read(&out).unwrap(), first);
            assert_eq!(
                side["fnv1a64"],
                format!("{:016x}", synth::fnv1a64(&first)).as_str()
            );
            assert_eq!(
                side["command"],
                format!("farside trace synth --profile {name} --requests 30000 --seed 5 --out {name}.csv.gz").as_str()
            );
        }
        let bad = SynthArgs {
            profile: "clarknet".into(),
            requests: 10,
            seed: 1,
            out: dir.join("x.csv.gz"),
        };
        let err = synth_cmd(&bad).unwrap_err();
        assert!(err.contains("ncsa-1994, bu-1995"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
