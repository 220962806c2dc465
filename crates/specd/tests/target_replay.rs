//! Replay across a restart of specd's target (no root): an OFFER captured on the
//! cluster network and accepted by a keyed target is refused by the target's next run,
//! although the restart emptied its replay windows — the target refuses every sequence
//! sealed in a second before its start (sources seal with clock sequences). A fresh
//! offer of the same source is still served.

use std::io::{Cursor, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use farside_auth::replay::{Sequencer, SEQ_COUNT_BITS};
use farside_migrate::wire::{read_message_auth, write_message_auth, Auth, Message};
use farside_migrate::{RepairWindow, TcpOptions, TcpState};
use farside_specd::cli::{load_auth, SpecdArgs};
use farside_specd::handoff::Handoff;
use farside_specd::target::{OfferRules, TargetConfig, TargetDaemon};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    a: SpecdArgs,
}

/// The daemon's migration key, loaded the way `farside specd --key-file` loads it.
fn daemon_auth(key_file: &std::path::Path) -> Arc<Auth> {
    let args = format!(
        "specd --listen 127.0.0.1:0 --server-port 80 --adopt-socket /a --key-file {}",
        key_file.display()
    );
    let cli = Cli::try_parse_from(args.split_whitespace()).expect("flags");
    load_auth(&cli.a).expect("key").expect("keyed")
}

fn target(auth: Arc<Auth>) -> TargetDaemon {
    TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: 9,
        admit_queue_max: 64,
        handoff: Handoff::Relay("127.0.0.1:9".parse().unwrap()),
        threads: 2,
        peers: vec!["127.0.0.1:1".parse().unwrap()],
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: Some(auth),
        // The offers below name another service port: an authentic one is answered
        // with a REFUSE for the port (no restore, so no root); a frame refused by the
        // authentication is not answered.
        offers: OfferRules {
            service_ip: None,
            service_port: 80,
            cluster: Vec::new(),
            loopback: true,
        },
    })
    .unwrap()
}

fn offer() -> Message {
    Message::Offer(TcpState {
        local: "127.0.0.1:8080".parse().unwrap(),
        remote: "192.0.2.7:40000".parse().unwrap(),
        snd_seq: 1,
        rcv_seq: 1,
        options: TcpOptions {
            mss: 1460,
            wscale: None,
            sack: false,
            timestamps: false,
        },
        timestamp: 0,
        window: RepairWindow {
            snd_wl1: 1,
            snd_wnd: 1000,
            max_window: 1000,
            rcv_wnd: 1000,
            rcv_wup: 1,
        },
        sndbuf: 0,
        rcvbuf: 0,
        send_queue: Vec::new(),
        unsent_len: 0,
        recv_queue: Vec::new(),
    })
}

/// Send `frame` on a new control connection and end it; the target's answer (a
/// REFUSE here), opened by the source, or None if the target closed it unanswered
/// (a frame refused before anything of it is acted on).
fn answer(t: &TargetDaemon, src: &Auth, frame: &[u8]) -> Option<String> {
    let mut c = TcpStream::connect(t.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(frame).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    if got.is_empty() {
        return None;
    }
    match read_message_auth(&mut Cursor::new(&got), Some(src)) {
        Ok(Message::Refuse(r)) => Some(r),
        other => panic!("expected a REFUSE, got {other:?} ({} bytes)", got.len()),
    }
}

#[test]
fn an_offer_captured_before_a_restart_is_refused_after_it() {
    let dir = std::env::temp_dir().join(format!("specd-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("migration.key");
    std::fs::write(&key_file, "5e0c7a19d3b2f48611ac9e0d7b35f2c4\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let src = daemon_auth(&key_file);
    let before = daemon_auth(&key_file);
    let t = target(before.clone());
    // The capture: an authentic OFFER, acted on (refused for its port, not its frame).
    let mut captured = Vec::new();
    write_message_auth(&mut captured, &offer(), Some(&src)).unwrap();
    let sealed_s = Sequencer::unix_s();
    let r = answer(&t, &src, &captured).expect("an authentic offer is answered");
    assert!(r.contains("port"), "refused for its port: {r}");
    assert_eq!(before.refused(), 0);
    // Replayed to the same run: its window refuses it.
    assert_eq!(answer(&t, &src, &captured), None, "replay");
    assert_eq!(before.refused(), 1);
    t.stop();

    // The restart, in a later second than the capture was sealed in (awaited: at most
    // a second).
    while Sequencer::unix_s() <= sealed_s {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = daemon_auth(&key_file);
    assert!(after.replay_floor() >= ((sealed_s + 1) << SEQ_COUNT_BITS) - 1);
    let t = target(after.clone());
    assert_eq!(
        answer(&t, &src, &captured),
        None,
        "the replay after the restart"
    );
    assert_eq!(after.refused(), 1, "counted as refused");
    // A fresh offer of the same source is served as before.
    let mut fresh = Vec::new();
    write_message_auth(&mut fresh, &offer(), Some(&src)).unwrap();
    let r = answer(&t, &src, &fresh).expect("a fresh offer is answered");
    assert!(r.contains("port"), "refused for its port: {r}");
    assert_eq!(after.refused(), 1);
    t.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}
