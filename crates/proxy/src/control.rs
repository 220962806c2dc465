//! Control layer of the proxy: monitor table, admission policy, balancing.
//! (Implemented by the control-layer work; the data path only sees `gate::Gate`.)

pub use farside_rmem::Endpoint as RegionSource;
