//! `farside iwarp`: tools around the iWARP stack.

use std::io::Write;
use std::path::PathBuf;

/// Command-line flags of `farside iwarp`.
#[derive(Debug, Clone, clap::Args)]
pub struct IwarpArgs {
    #[command(subcommand)]
    pub cmd: IwarpCmd,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum IwarpCmd {
    /// Print every MPA Request/Reply and DDP/RDMAP message of a capture (classic
    /// little-endian pcap, Ethernet, IPv4) as one JSON object per line. Exits non-zero
    /// only if a stream cannot be deframed.
    Decode {
        /// The capture.
        file: PathBuf,
    },
}

/// Run `farside iwarp ...`, printing to stdout.
pub fn run(a: IwarpArgs) -> Result<(), String> {
    run_to(a, &mut std::io::stdout().lock())
}

/// Run `farside iwarp ...`, printing to `w`.
pub fn run_to(a: IwarpArgs, w: &mut impl Write) -> Result<(), String> {
    match a.cmd {
        IwarpCmd::Decode { file } => {
            let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let d = crate::decode::decode_pcap(&bytes)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            for l in &d.lines {
                writeln!(w, "{l}").map_err(|e| format!("stdout: {e}"))?;
            }
            w.flush().map_err(|e| format!("stdout: {e}"))?;
            if d.failures.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} stream(s) could not be deframed: {}",
                    d.failures.len(),
                    d.failures.join("; ")
                ))
            }
        }
    }
}
