//! Closed- and open-loop HTTP load generator with single-file, Zipf and World Cup traces
