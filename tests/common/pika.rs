//! tests/pika/: Python scripts that drive a broker with pika, for what
//! the issues ask to see through pika. Run when python3 can import pika;
//! required (a missing pika fails the test) when WARREN_REQUIRE_PIKA is
//! set, as .ci/run sets it after installing pika.

use std::process::Command;

/// Runs tests/pika/dedup.py on `uri` with `args`; false if pika is
/// missing (and not required). A script that fails fails the test with
/// its output.
pub fn pika(uri: &str, args: &[&str]) -> bool {
    let have = Command::new("python3")
        .args(["-c", "import pika"])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            std::env::var_os("WARREN_REQUIRE_PIKA").is_none(),
            "pika is required (WARREN_REQUIRE_PIKA) but python3 cannot import it"
        );
        eprintln!("skipped: python3 cannot import pika");
        return false;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pika/dedup.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(uri)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "dedup.py {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}
