//! Test web server: static files, CPU-costly dynamic endpoint, bounded workers and backlog
