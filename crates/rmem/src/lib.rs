//! Remote memory: `read`, `write`, `compare_swap` and `fetch_add` on a back-end's
//! region, over several transports behind one interface.

mod endpoint;
pub use endpoint::Endpoint;
