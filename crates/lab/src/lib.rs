//! Virtual data-center on one machine: runs the papers' experiments end to end

pub mod nginx;
pub mod report;
pub mod summary;
pub mod svg;
