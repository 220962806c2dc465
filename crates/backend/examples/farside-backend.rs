//! Stand-alone back-end for benchmarks and the wrk cross-check
//! (`farside backend` is the product command line).

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: farside_backend::BackendArgs,
}

fn main() {
    let cli = Cli::parse();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Keep SIGTERM/SIGINT for run()'s sigwait, not this thread.
        // SAFETY: local sigset manipulation.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        if let Ok(addr) = rx.recv() {
            println!("listening on {addr}");
        }
    });
    if let Err(e) = farside_backend::run(cli.args, Some(tx)) {
        eprintln!("farside-backend: {e}");
        std::process::exit(1);
    }
}
