//! The real `warren` binary as a child process, for tests that kill it or
//! that might crash it: a free port, start on a data dir, wait until it
//! accepts AMQP, SIGKILL. The child is killed when the handle is dropped,
//! so a panicking test leaves no broker behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

/// A port that was free a moment ago, for a listener that a child
/// process (or a broker started later) binds on 127.0.0.1. It is taken
/// below the kernel's ephemeral range, where the kernel hands out no port
/// of its own: a port the kernel picked (bind 127.0.0.1:0) could go, in
/// the time before the child binds it, to another test's listener or to
/// an outgoing connection's local end, and the child would fail to
/// listen. Never the same port twice in this process; a process starts
/// at a place drawn from its pid, so two at once rarely meet.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(LOW + 1_000, 65_536);
    let span = high - LOW;
    // u64: a pid above about 540,000 times 7,919 leaves u32.
    let start = (u64::from(std::process::id()) * 7_919 % u64::from(span)) as u32;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{high}")
}

/// A `warren` child process.
pub struct ChildBroker {
    child: Arc<Mutex<Option<Child>>>,
    pub port: u16,
    /// The management API's port (`spawn_with_api`).
    pub api_port: Option<u16>,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

impl ChildBroker {
    /// Starts `warren` on a free port with `data_dir`, logging to `log`
    /// (appended), with `extra` flags.
    pub fn spawn(data_dir: &Path, log: &Path, extra: &[&str]) -> ChildBroker {
        Self::start(data_dir, log, extra, None)
    }

    /// As `spawn`, with the management API on a free port.
    pub fn spawn_with_api(data_dir: &Path, log: &Path, extra: &[&str]) -> ChildBroker {
        Self::start(data_dir, log, extra, Some(free_port()))
    }

    /// As `spawn`, running the binary `bin` (an older build).
    #[allow(dead_code)]
    pub fn spawn_bin(bin: &Path, data_dir: &Path, log: &Path, extra: &[&str]) -> ChildBroker {
        // An older build may predate --stream-port (and has no such
        // listener to collide on), so it is not passed.
        Self::start_bin(bin.as_os_str().into(), data_dir, log, extra, None, false)
    }

    fn start(data_dir: &Path, log: &Path, extra: &[&str], api: Option<u16>) -> ChildBroker {
        // WARREN_BIN runs these tests against another build (for example
        // an older one, to see a test fail there).
        let bin =
            std::env::var("WARREN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_warren").into());
        Self::start_bin(bin.into(), data_dir, log, extra, api, true)
    }

    fn start_bin(
        bin: std::ffi::OsString,
        data_dir: &Path,
        log: &Path,
        extra: &[&str],
        api: Option<u16>,
        stream_flag: bool,
    ) -> ChildBroker {
        let port = free_port();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let err = out.try_clone().unwrap();
        let mut cmd = Command::new(bin);
        if stream_flag {
            cmd.arg("--stream-port").arg("off");
        }
        let child = cmd
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(port.to_string())
            .arg("--management-port")
            .arg(api.map_or("off".to_string(), |p| p.to_string()))
            .arg("--prometheus-port")
            .arg("off")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--log-level")
            .arg("warn")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn warren");
        ChildBroker {
            child: Arc::new(Mutex::new(Some(child))),
            port,
            api_port: api,
            data_dir: data_dir.to_path_buf(),
            log: log.to_path_buf(),
        }
    }

    /// amqp:// URI of this broker.
    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// 127.0.0.1:port.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Retries connecting until the broker accepts (or 60 s pass, or the
    /// process exits).
    pub async fn connect(&self) -> Connection {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match Connection::connect(&self.uri(), ConnectionProperties::default()).await {
                Ok(c) => return c,
                Err(e) => {
                    if let Some(status) = self.exited() {
                        panic!(
                            "warren exited with {status} before accepting: {}",
                            self.log_tail()
                        );
                    }
                    if tokio::time::Instant::now() > deadline {
                        panic!(
                            "warren did not accept connections: {e:?}; {}",
                            self.log_tail()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// The exit status if the process has ended.
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        g.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        let g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|c| c.id())
    }

    /// Resident memory of the process in KiB (VmRSS), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Whether the process is still running.
    pub fn is_running(&self) -> bool {
        let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends a signal (e.g. libc::SIGTERM) to the child.
    pub fn signal(&self, sig: i32) {
        let g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = g.as_ref() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// A handle another thread can use to SIGKILL the child.
    pub fn kill_handle(&self) -> KillHandle {
        KillHandle(Arc::clone(&self.child))
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(&self) {
        self.kill_handle().kill();
    }

    /// The last part of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = s.len().saturating_sub(4000);
        let mut start = start;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        format!("warren log tail:\n{}", &s[start..])
    }
}

impl Drop for ChildBroker {
    /// Kills the child; fails the test if its log says it panicked (tokio
    /// keeps a panicking connection task from ending the process).
    fn drop(&mut self) {
        self.kill();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if log.contains("panicked") && !std::thread::panicking() {
            panic!("warren panicked: {}", self.log_tail());
        }
    }
}

/// Kills a child broker from anywhere.
#[derive(Clone)]
pub struct KillHandle(Arc<Mutex<Option<Child>>>);

impl KillHandle {
    /// SIGKILL (std's Child::kill) and wait; idempotent.
    pub fn kill(&self) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut c) = g.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
