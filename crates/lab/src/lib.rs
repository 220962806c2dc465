//! Virtual data-center on one machine: runs the papers' experiments end to end
