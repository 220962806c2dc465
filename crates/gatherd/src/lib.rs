//! Load gatherer: samples a back-end every millisecond and publishes its region
