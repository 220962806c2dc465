//! The lab's objects on disk: every object of the trace written at its docroot path,
//! with content of its own, so a body served wrong is told from the right one.

use std::io;
use std::path::Path;

/// The content of object `id`, `len` bytes: distinct per object and position.
pub fn object_body(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes every object of the load generator's World Cup trace under `dir` at its
/// docroot path, with content of its own ([`object_body`]). Returns (files written,
/// bytes, objects skipped: paths that cannot be files, e.g. both `/a` and `/a/b`).
pub fn write_objects(trace: &farside_loadgen::Trace, dir: &Path) -> io::Result<(u64, u64, u64)> {
    let (mut files, mut bytes, mut skipped) = (0, 0, 0);
    let mut seen = std::collections::HashSet::new();
    for (id, obj) in trace.objects.iter().enumerate() {
        if !seen.insert(obj.file.clone()) {
            continue;
        }
        if obj.file.split('/').any(|s| s == ".." || s == ".") {
            skipped += 1;
            continue;
        }
        let path = dir.join(&obj.file);
        let wrote = (|| -> io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, object_body(id as u64, obj.bytes as usize))
        })();
        match wrote {
            Ok(()) => {
                files += 1;
                bytes += obj.bytes;
            }
            Err(_) => skipped += 1,
        }
    }
    Ok((files, bytes, skipped))
}
