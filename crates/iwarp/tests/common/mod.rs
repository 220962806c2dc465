//! Where the shared test material is, and the skip rule: without it a test fails under
//! CI (env `CI` set) and is otherwise recorded as skipped (farside-testkit), not passed.
#![allow(dead_code)]

pub mod rng;

use std::path::PathBuf;

/// `$FARSIDE_TESTDATA`, else `shared/testdata/iwarp` beside the clone.
pub fn testdata_dir() -> PathBuf {
    match std::env::var_os("FARSIDE_TESTDATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/iwarp"),
    }
}

/// Skip (or, under CI, fail) with `why`: recorded through farside-testkit, so
/// `scripts/test.sh` counts the test as skipped, not passed.
pub fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run this test, but: {why}");
    }
    // libtest names each test's thread after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("an iwarp test")
        .to_string();
    farside_testkit::skip(&test, why);
}

/// The bytes of test file `name`, or `None` after [`skip`].
pub fn testdata(name: &str) -> Option<Vec<u8>> {
    let p = testdata_dir().join(name);
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(e) => {
            skip(&format!(
                "test material {} unreadable ({e}); set FARSIDE_TESTDATA",
                p.display()
            ));
            None
        }
    }
}

pub fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
