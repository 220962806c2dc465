//! Trust boundaries between farside components (DESIGN.md "Trust model").
pub mod keys;
pub mod mac;
pub mod replay;
pub mod rights;
pub mod siphash;
