//! A Warren cluster of real `warren` processes on loopback: free ports,
//! a data dir and a log per node, SIGKILL / SIGSTOP / SIGCONT, which node
//! leads (from the logs: "leading: serving clients term=T"), and a check
//! that no log says "panicked". Children are killed on drop.

#![allow(dead_code)]

pub mod api;
pub mod netns;
pub mod total;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

pub use super::common::child::free_port;

/// One node.
pub struct Node {
    pub id: u64,
    pub amqp: u16,
    pub raft: u16,
    /// The management API's port (the leader serves it; a follower
    /// carries its clients to the leader).
    pub http: u16,
    /// Prometheus (each node answers for itself).
    pub prometheus: u16,
    /// AMQPS and HTTPS, when the cluster serves TLS clients.
    pub amqps: u16,
    pub https: u16,
    /// RabbitMQ's stream protocol (a follower carries its clients to the
    /// leader), and its TLS port when the cluster serves TLS clients.
    pub stream: u16,
    pub stream_tls: u16,
    /// The address it binds and is reached at.
    pub host: String,
    /// The network namespace it runs in, if any.
    pub netns: Option<String>,
    pub dir: PathBuf,
    pub log: PathBuf,
    child: Mutex<Option<Child>>,
    /// SIGSTOPped and not continued.
    stopped: AtomicBool,
    /// Environment variables it is started with (besides RUST_LOG).
    pub env: Mutex<Vec<(String, String)>>,
    /// The binary it runs, if not this build's (or WARREN_BIN).
    pub bin: Mutex<Option<PathBuf>>,
    /// Arguments it is started with besides those every node gets.
    pub args: Mutex<Vec<String>>,
}

/// The cluster.
pub struct Cluster {
    pub nodes: Vec<Node>,
    peers: String,
    /// A config file every node reads, if any.
    config: Option<PathBuf>,
    /// The secret file every node is given, unless the config names one.
    secret: Option<PathBuf>,
    /// Each node opens AMQPS and HTTPS on its own ports.
    client_tls: bool,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` nodes.
    pub fn start(n: usize) -> Cluster {
        Self::start_with(n, "")
    }

    /// Starts `n` nodes reading a config file of `toml` (if not empty).
    pub fn start_with(n: usize, toml: &str) -> Cluster {
        let hosts = vec![("127.0.0.1".to_string(), None); n];
        Self::start_on(&hosts, toml)
    }

    /// Starts `n` nodes reading a config file of `toml` (which has a
    /// `[tls]` certificate), each with AMQPS and HTTPS on ports of its own.
    pub fn start_with_tls_clients(n: usize, toml: &str) -> Cluster {
        let hosts = vec![("127.0.0.1".to_string(), None); n];
        Self::start_on_with(&hosts, toml, true)
    }

    /// Starts a node per (address, network namespace) of `hosts`.
    pub fn start_on(hosts: &[(String, Option<String>)], toml: &str) -> Cluster {
        Self::start_on_with(hosts, toml, false)
    }

    fn start_on_with(hosts: &[(String, Option<String>)], toml: &str, client_tls: bool) -> Cluster {
        Self::start_all(hosts, toml, client_tls, &[])
    }

    /// Starts `n` nodes on loopback, node `i` with the environment
    /// variables `env[i]` (if given).
    pub fn start_with_env(n: usize, env: &[Vec<(String, String)>]) -> Cluster {
        let hosts = vec![("127.0.0.1".to_string(), None); n];
        Self::start_all(&hosts, "", false, env)
    }

    /// Starts `n` nodes on loopback running `bin` (another build).
    pub fn start_binary(n: usize, bin: &std::path::Path) -> Cluster {
        let hosts = vec![("127.0.0.1".to_string(), None); n];
        Self::start_all_of(&hosts, "", false, &[], Some(bin.to_path_buf()))
    }

    fn start_all(
        hosts: &[(String, Option<String>)],
        toml: &str,
        client_tls: bool,
        env: &[Vec<(String, String)>],
    ) -> Cluster {
        Self::start_all_of(hosts, toml, client_tls, env, None)
    }

    fn start_all_of(
        hosts: &[(String, Option<String>)],
        toml: &str,
        client_tls: bool,
        env: &[Vec<(String, String)>],
        bin: Option<PathBuf>,
    ) -> Cluster {
        Self::start_with_spares(hosts, &[], toml, client_tls, env, bin)
    }

    /// Starts a node per entry of `hosts`, as `start_on` does, and makes
    /// (without starting them) a node per entry of `spares`, with the ids
    /// after theirs: nodes that may join later (`spawn_joining`).
    pub fn start_on_with_spares(
        hosts: &[(String, Option<String>)],
        spares: &[(String, Option<String>)],
        toml: &str,
    ) -> Cluster {
        Self::start_with_spares(hosts, spares, toml, false, &[], None)
    }

    fn start_with_spares(
        hosts: &[(String, Option<String>)],
        spares: &[(String, Option<String>)],
        toml: &str,
        client_tls: bool,
        env: &[Vec<(String, String)>],
        bin: Option<PathBuf>,
    ) -> Cluster {
        let n = hosts.len();
        let all: Vec<(String, Option<String>)> = hosts.iter().chain(spares).cloned().collect();
        let hosts = &all[..];
        let tmp = tempfile::tempdir().unwrap();
        let config = (!toml.is_empty()).then(|| {
            let p = tmp.path().join("warren.toml");
            std::fs::write(&p, toml).unwrap();
            p
        });
        // Members share a secret (the toml's, if it names one): a node
        // given none makes its own, which no other member knows.
        let secret = (!toml.contains("secret_file")).then(|| {
            let p = tmp.path().join("cluster-secret");
            std::fs::write(&p, "the members' shared cluster secret\n").unwrap();
            p
        });
        let nodes: Vec<Node> = (1..=hosts.len() as u64)
            .map(|id| Node {
                id,
                amqp: free_port(),
                raft: free_port(),
                http: free_port(),
                prometheus: free_port(),
                amqps: free_port(),
                https: free_port(),
                stream: free_port(),
                stream_tls: free_port(),
                host: hosts[id as usize - 1].0.clone(),
                netns: hosts[id as usize - 1].1.clone(),
                dir: tmp.path().join(format!("d{id}")),
                log: tmp.path().join(format!("n{id}.log")),
                child: Mutex::new(None),
                stopped: AtomicBool::new(false),
                env: Mutex::new(env.get(id as usize - 1).cloned().unwrap_or_default()),
                bin: Mutex::new(bin.clone()),
                args: Mutex::new(Vec::new()),
            })
            .collect();
        let peers = nodes[..n]
            .iter()
            .map(|n| format!("{}={}:{}", n.id, n.host, n.raft))
            .collect::<Vec<_>>()
            .join(",");
        let c = Cluster {
            nodes,
            peers,
            config,
            secret,
            client_tls,
            _tmp: tmp,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    /// Starts node `i` (again); a node that joined later is started as
    /// it was then.
    pub fn spawn(&self, i: usize) {
        let n = &self.nodes[i];
        let listed = self
            .peers
            .split(',')
            .any(|p| p.split('=').next() == Some(n.id.to_string().as_str()));
        if listed {
            let peers = self.peers.clone();
            self.spawn_with_peers(i, &peers);
        } else {
            self.spawn_joining(i);
        }
    }

    fn spawn_with_peers(&self, i: usize, peers: &str) {
        let n = &self.nodes[i];
        let bin: PathBuf = n.bin.lock().unwrap().clone().unwrap_or_else(|| {
            std::env::var("WARREN_BIN")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_warren").into())
                .into()
        });
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd = match &n.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        // A port of its own, so that nodes sharing an address do not
        // share 5552 (the build a rolling upgrade starts from has no such
        // flag).
        if std::env::var_os("WARREN_OLD_BIN")
            .map(PathBuf::from)
            .as_ref()
            != Some(&bin)
        {
            cmd.arg("--stream-port").arg(n.stream.to_string());
            let tls = match self.client_tls {
                true => n.stream_tls.to_string(),
                false => "off".into(),
            };
            cmd.arg("--stream-tls-port").arg(tls);
        }
        if let Some(s) = &self.secret {
            cmd.arg("--cluster-secret-file").arg(s);
        }
        if self.client_tls {
            cmd.arg("--amqps-port").arg(n.amqps.to_string());
            cmd.arg("--management-tls-port").arg(n.https.to_string());
        }
        let child = cmd
            .args(["--bind", &n.host, "--management-bind", &n.host])
            .arg("--prometheus-port")
            .arg(n.prometheus.to_string())
            .args(["--log-level", "info"])
            .arg("--management-port")
            .arg(n.http.to_string())
            .arg("--port")
            .arg(n.amqp.to_string())
            .arg("--node-id")
            .arg(n.id.to_string())
            .arg("--raft-port")
            .arg(n.raft.to_string())
            .arg("--peers")
            .arg(peers)
            .arg("--data-dir")
            .arg(&n.dir)
            .args(n.args.lock().unwrap().clone())
            .env("RUST_LOG", "info,openraft=off")
            .envs(n.env.lock().unwrap().clone())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn warren");
        *n.child.lock().unwrap() = Some(child);
        n.stopped.store(false, Ordering::SeqCst);
    }

    /// SIGKILLs node `i` and reaps it.
    pub fn kill(&self, i: usize) {
        let taken = self.nodes[i].child.lock().unwrap().take();
        if let Some(mut c) = taken {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.nodes[i].stopped.store(false, Ordering::SeqCst);
    }

    /// SIGTERMs node `i` and waits up to `within` for it to exit (then
    /// SIGKILLs it); true if it stopped by itself.
    pub fn terminate(&self, i: usize, within: Duration) -> bool {
        let taken = self.nodes[i].child.lock().unwrap().take();
        let Some(mut c) = taken else { return true };
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }

    /// Sends `sig` to node `i`.
    pub fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = self.nodes[i].child.lock().unwrap().as_ref() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
        self.nodes[i]
            .stopped
            .store(sig == libc::SIGSTOP, Ordering::SeqCst);
    }

    /// Node `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// Whether node `i` runs (and is not stopped).
    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].child.lock().unwrap().is_some()
            && !self.nodes[i].stopped.load(Ordering::SeqCst)
    }

    /// The last term node `i` said it leads, from its log.
    pub fn led_term(&self, i: usize) -> Option<u64> {
        let text = std::fs::read_to_string(&self.nodes[i].log).ok()?;
        text.lines()
            .filter(|l| l.contains("leading: serving clients"))
            .filter_map(|l| l.rsplit("term=").next()?.trim().parse::<u64>().ok())
            .max()
    }

    /// The running node that said last (highest term) it leads.
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.running(i))
            .filter_map(|i| self.led_term(i).map(|t| (t, i)))
            .max()
            .map(|(_, i)| i)
            .filter(|&i| self.newest_term() == self.led_term(i))
    }

    fn newest_term(&self) -> Option<u64> {
        (0..self.nodes.len()).filter_map(|i| self.led_term(i)).max()
    }

    /// Waits for a running node to lead a term above `after`; returns it
    /// and its term.
    pub async fn wait_leader(&self, after: u64, within: Duration) -> (usize, u64) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.leader() {
                let t = self.led_term(i).unwrap_or(0);
                if t > after {
                    return (i, t);
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no new leader within {within:?}; {}",
                self.logs_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Makes node `want` the leader: fails over until it wins.
    pub async fn lead_with(&self, want: usize) {
        let (mut leader, mut term) = self.wait_leader(0, Duration::from_secs(30)).await;
        while leader != want {
            self.kill(leader);
            let (l, t) = self.wait_leader(term, Duration::from_secs(30)).await;
            self.spawn(leader);
            (leader, term) = (l, t);
        }
    }

    /// Whether node `i`'s log has `text`.
    pub fn log_has(&self, i: usize, text: &str) -> bool {
        std::fs::read_to_string(&self.nodes[i].log).is_ok_and(|t| t.contains(text))
    }

    /// http://127.0.0.1:port of node `i`'s management API.
    pub fn api(&self, i: usize) -> String {
        format!("http://{}:{}", self.nodes[i].host, self.nodes[i].http)
    }

    /// Adds a node to this handle (not started): its id is the next one
    /// and it knows only itself (`--peers` "id=addr").
    pub fn add_node(&mut self) -> usize {
        let id = self.nodes.len() as u64 + 1;
        let dir = self._tmp.path().join(format!("d{id}"));
        let log = self._tmp.path().join(format!("n{id}.log"));
        self.nodes.push(Node {
            id,
            amqp: free_port(),
            raft: free_port(),
            http: free_port(),
            prometheus: free_port(),
            amqps: free_port(),
            https: free_port(),
            stream: free_port(),
            stream_tls: free_port(),
            host: "127.0.0.1".into(),
            netns: None,
            dir,
            log,
            child: Mutex::new(None),
            stopped: AtomicBool::new(false),
            env: Mutex::default(),
            bin: Mutex::default(),
            args: Mutex::default(),
        });
        self.nodes.len() - 1
    }

    /// Starts node `i`, a node that joins: its peers are the cluster's
    /// and itself, and its id is not the lowest, so it waits to be added.
    pub fn spawn_joining(&self, i: usize) {
        let n = &self.nodes[i];
        let peers = format!("{},{}={}:{}", self.peers, n.id, n.host, n.raft);
        self.spawn_with_peers(i, &peers);
    }

    /// amqp:// URI of node `i`.
    pub fn uri(&self, i: usize) -> String {
        format!(
            "amqp://guest:guest@{}:{}/%2f",
            self.nodes[i].host, self.nodes[i].amqp
        )
    }

    /// Connects to node `i`, retrying for `within`.
    pub async fn connect(&self, i: usize, within: Duration) -> Option<Connection> {
        let deadline = tokio::time::Instant::now() + within;
        let uri = self.uri(i);
        loop {
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&uri, ConnectionProperties::default()),
            );
            if let Ok(Ok(c)) = attempt.await {
                return Some(c);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of every log.
    pub fn logs_tail(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let text = std::fs::read_to_string(&n.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(15);
            out.push_str(&format!(
                "\n--- node {} ---\n{}",
                n.id,
                lines[from..].join("\n")
            ));
        }
        out
    }

    /// Node `i`'s Prometheus metrics (each node answers for itself).
    pub async fn metrics(&self, i: usize) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.nodes[i].prometheus);
        api::http()
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Fails if any log says "panicked".
    pub fn assert_no_panics(&self) {
        for n in &self.nodes {
            let text = std::fs::read_to_string(&n.log).unwrap_or_default();
            assert!(
                !text.contains("panicked"),
                "node {} panicked:\n{text}",
                n.id
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].stopped.load(Ordering::SeqCst) {
                self.signal(i, libc::SIGCONT);
            }
            self.kill(i);
        }
    }
}

/// `[tls]` for a cluster whose members talk over mutual TLS: a CA and one
/// certificate for 127.0.0.1 with both uses (every member is a server
/// and a client of the others), written into `dir`; the client listeners
/// TLS would open (AMQPS, HTTPS) stay off.
pub fn mutual_tls_config(dir: &std::path::Path) -> String {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "cluster CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, "node");
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let (c, k, a) = (
        dir.join("node.pem"),
        dir.join("node.key"),
        dir.join("ca.pem"),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    std::fs::write(&a, ca.pem()).unwrap();
    format!(
        "amqps_port = \"off\"\nmanagement_tls_port = \"off\"\nprometheus_tls_port = \"off\"\n\
         [tls]\ncertfile = {:?}\nkeyfile = {:?}\ncacertfile = {:?}\n",
        c.display().to_string(),
        k.display().to_string(),
        a.display().to_string()
    )
}

/// The message count of `queue` as node `i` answers a passive declare.
pub async fn count(c: &Cluster, i: usize, queue: &str) -> u32 {
    use lapin::options::QueueDeclareOptions;
    let conn = c
        .connect(i, Duration::from_secs(30))
        .await
        .expect("connect");
    let ch = conn.create_channel().await.unwrap();
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
    q.message_count()
}
