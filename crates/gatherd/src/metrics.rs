//! A minimal Prometheus endpoint for gatherd: one blocking thread, one short request per
//! connection, bounded request size and time. It never touches the sampling loop.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most bytes of a metrics request read before answering.
const REQUEST_BYTES_MAX: usize = 4096;
/// Time a metrics client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

pub struct MetricsServer {
    pub local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl MetricsServer {
    pub fn spawn(addr: SocketAddr, render: Render) -> io::Result<MetricsServer> {
        let l = TcpListener::bind(addr)?;
        let local_addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        std::thread::Builder::new()
            .name("gatherd-metrics".into())
            .spawn(move || {
                for conn in l.incoming() {
                    if st.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Ok(c) = conn {
                        if let Err(e) = answer(c, &render) {
                            log::debug!("gatherd metrics: {e}");
                        }
                    }
                }
            })?;
        Ok(MetricsServer { local_addr, stop })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(100));
    }
}

fn answer(mut c: TcpStream, render: &Render) -> io::Result<()> {
    c.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut buf = [0u8; REQUEST_BYTES_MAX];
    let mut n = 0;
    while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        let r = c.read(&mut buf[n..])?;
        if r == 0 {
            return Ok(());
        }
        n += r;
    }
    let (status, body) = if buf.starts_with(b"GET /metrics ") {
        ("200 OK", render())
    } else {
        ("404 Not Found", "try GET /metrics\n".to_string())
    };
    write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
