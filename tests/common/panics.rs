//! Panics inside the broker fail the test. tokio catches a panic in a
//! spawned task (a connection, a timer) and the test would go on green, so
//! a process-wide hook records every panic raised in the broker's own code
//! (its location is under `src/`, `plugins/` or `vendor/`, not `tests/` or a
//! dependency), and `TestBroker` checks the record when it is dropped.

use std::sync::{Mutex, Once};

static RECORD: Mutex<Vec<String>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// Installs the hook (once per test binary); the previous hook still prints.
pub fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_broker = info.location().is_some_and(|l| {
                let f = l.file();
                f.starts_with("src/") || f.starts_with("plugins/") || f.starts_with("vendor/")
            });
            if in_broker {
                let thread = std::thread::current();
                let name = thread.name().unwrap_or("?");
                RECORD
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("thread '{name}' {info}"));
            }
            previous(info);
        }));
    });
}

/// How many broker panics were recorded so far.
pub fn count() -> usize {
    RECORD.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// The broker panics recorded after the first `since`.
pub fn since(since: usize) -> Vec<String> {
    let r = RECORD.lock().unwrap_or_else(|e| e.into_inner());
    r.get(since..).map(<[String]>::to_vec).unwrap_or_default()
}
