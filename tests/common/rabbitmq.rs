//! A private RabbitMQ node (Debian's `rabbitmq-server`, 3.10.8 on these
//! machines) for tests of Warren beside RabbitMQ: its own AMQP, management,
//! distribution and epmd ports, a temp dir for its data, config and
//! cookie, run as the calling user (../shared/PEERS.md says how). The node
//! and the epmd it started are killed when the handle is dropped.
//!
//! Absent RabbitMQ, `start` says why and returns None, and the test skips;
//! with WARREN_REQUIRE_RABBITMQ set (.ci/run installs it) it fails instead.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};

use super::child::free_port;

const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// A running RabbitMQ node.
pub struct RabbitNode {
    pub amqp: u16,
    pub api: u16,
    epmd: u16,
    child: Child,
    dir: tempfile::TempDir,
}

/// Starts a node with the management plugin (and `plugins`), waiting
/// until its management API answers; None if RabbitMQ is not installed
/// and not required.
pub async fn start(plugins: &[&str]) -> Option<RabbitNode> {
    // reqwest (rustls without a provider of its own) reads the API.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !Path::new(SERVER).exists() {
        assert!(
            std::env::var_os("WARREN_REQUIRE_RABBITMQ").is_none(),
            "RabbitMQ is required (WARREN_REQUIRE_RABBITMQ) but {SERVER} is absent"
        );
        eprintln!("skipped: RabbitMQ is not installed ({SERVER}; apt-get install rabbitmq-server)");
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let (amqp, dist, api, epmd) = (free_port(), free_port(), free_port(), free_port());
    std::fs::create_dir_all(d.join("mnesia")).expect("mnesia dir");
    std::fs::create_dir_all(d.join("log")).expect("log dir");
    let cookie = d.join(".erlang.cookie");
    std::fs::write(&cookie, format!("warrentest{amqp}")).expect("cookie");
    std::fs::set_permissions(&cookie, std::os::unix::fs::PermissionsExt::from_mode(0o400))
        .expect("cookie mode");
    std::fs::write(
        d.join("rabbitmq.conf"),
        format!(
            "listeners.tcp.1 = 127.0.0.1:{amqp}\nloopback_users = none\n\
             management.tcp.port = {api}\nmanagement.tcp.ip = 127.0.0.1\n\
             collect_statistics_interval = 500\n"
        ),
    )
    .expect("rabbitmq.conf");
    let mut all = vec!["rabbitmq_management"];
    all.extend_from_slice(plugins);
    std::fs::write(d.join("enabled_plugins"), format!("[{}].", all.join(","))).expect("plugins");
    let out = std::fs::File::create(d.join("server.out")).expect("server.out");
    let err = out.try_clone().expect("server.out");
    let child = Command::new(SERVER)
        .current_dir(d)
        .env("HOME", d)
        .env("ERL_EPMD_PORT", epmd.to_string())
        .env("ERL_EPMD_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_NODENAME", format!("warren-test-{amqp}@localhost"))
        .env("RABBITMQ_NODE_PORT", amqp.to_string())
        .env("RABBITMQ_DIST_PORT", dist.to_string())
        .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", d.join("log"))
        .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
        // A group of its own: the start script's shell and the node are
        // killed together.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn rabbitmq-server");
    let mut node = RabbitNode {
        amqp,
        api,
        epmd,
        child,
        dir,
    };
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        if node.get("/overview").await.is_some() {
            break;
        }
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!("RabbitMQ exited with {status}: {}", node.output());
        }
        assert!(
            Instant::now() < until,
            "RabbitMQ did not start: {}",
            node.output()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Some(node)
}

impl RabbitNode {
    /// amqp://guest:guest@127.0.0.1:port/%2f
    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp)
    }

    /// 127.0.0.1:port of its AMQP listener.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.amqp))
    }

    /// Connects, retrying while the node finishes booting.
    pub async fn connect(&self) -> Connection {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match Connection::connect(&self.uri(), ConnectionProperties::default()).await {
                Ok(c) => return c,
                Err(e) => {
                    assert!(Instant::now() < until, "RabbitMQ refused: {e:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// GET /api{path} of its management API, as guest; None unless 200.
    pub async fn get(&self, path: &str) -> Option<serde_json::Value> {
        let url = format!("http://127.0.0.1:{}/api{path}", self.api);
        let r = reqwest::Client::new()
            .get(&url)
            .basic_auth("guest", Some("guest"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .ok()?;
        if r.status().as_u16() != 200 {
            return None;
        }
        serde_json::from_str(&r.text().await.ok()?).ok()
    }

    /// A request to its management API as guest: (status, body).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}/api{path}", self.api);
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut req = reqwest::Client::new()
            .request(method, &url)
            .basic_auth("guest", Some("guest"))
            .timeout(Duration::from_secs(10));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let r = req.send().await.expect("RabbitMQ's API answers");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    /// What the start script and the node wrote, for failure messages.
    pub fn output(&self) -> String {
        let out = std::fs::read_to_string(self.dir.path().join("server.out")).unwrap_or_default();
        let start = out.len().saturating_sub(4000);
        out.get(start..).unwrap_or(&out).to_string()
    }
}

/// The pid listening on TCP `port` of 127.0.0.1, as `ss` shows it.
fn listener(port: u16) -> Option<i32> {
    let out = Command::new("ss")
        .args(["-ltnpH", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find("pid=")? + 4;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        let group = self.child.id() as i32;
        // SAFETY: kill(2) of the process group this handle started.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
        // The epmd the node started on its own port (it daemonizes, out
        // of the group).
        let epmd = listener(self.epmd).filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "epmd")
        });
        if let Some(pid) = epmd {
            // SAFETY: kill(2) of the epmd on the port this node was given.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
