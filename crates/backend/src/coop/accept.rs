//! One accept loop for the node's small listeners (the peer port, the stats listener):
//! a thread per connection, a named bound on how many run at once, and a stop that the
//! shut-down listener wakes.

use super::Node;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Back-off after a failed accept (descriptors exhausted), so the thread does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// Accepts on `listener` until the node stops (its listeners are shut down then), each
/// connection served by `handle` on a thread of its own (`thread`: name, stack bytes),
/// at most `max` at once: a connection past them is closed unanswered.
pub(crate) fn accept_bounded(
    listener: &TcpListener,
    node: &Arc<Node>,
    max: usize,
    thread: (&str, usize),
    handle: fn(TcpStream, &Node),
) {
    let active = Arc::new(AtomicUsize::new(0));
    while !node.stopping() {
        let Ok((s, _)) = listener.accept() else {
            if node.stopping() {
                break;
            }
            std::thread::sleep(ACCEPT_RETRY);
            continue;
        };
        if active.fetch_add(1, Ordering::SeqCst) >= max {
            active.fetch_sub(1, Ordering::SeqCst);
            continue; // closed by drop
        }
        let (n, a) = (Arc::clone(node), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name(thread.0.into())
            .stack_size(thread.1)
            .spawn(move || {
                handle(s, &n);
                a.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
