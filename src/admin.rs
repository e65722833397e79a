//! `warren cluster ...`: membership through any member's management API
//! (status, add, remove, replace), and the promotion of a stopped node to
//! the only voter of its cluster (a two-node mirror that lost a node).

use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::config::command::{Api, ClusterCommand};

/// How long `replace` waits for the new node to catch up and vote.
const CATCH_UP: Duration = Duration::from_secs(600);

/// Runs `cmd`; what it prints goes to stdout, an error is returned.
pub fn run(cmd: ClusterCommand) -> Result<(), String> {
    match cmd {
        ClusterCommand::Status(api) => {
            let status = Client::new(&api)?.call("GET", "/api/cluster", None)?;
            print(&status);
            Ok(())
        }
        ClusterCommand::Add { id, raft, api } => {
            Client::new(&api)?.add(id, &raft)?;
            println!("node {id} ({raft}) is a voting member");
            Ok(())
        }
        ClusterCommand::Remove { id, api } => {
            let path = format!("/api/cluster/members/{id}");
            Client::new(&api)?.call("DELETE", &path, None)?;
            println!("node {id} left the cluster");
            Ok(())
        }
        ClusterCommand::Replace {
            old,
            new,
            raft,
            api,
        } => {
            let client = Client::new(&api)?;
            client.add(new, &raft)?;
            println!("node {new} ({raft}) is a voting member");
            client.call("DELETE", &format!("/api/cluster/members/{old}"), None)?;
            println!("node {old} left the cluster");
            Ok(())
        }
        ClusterCommand::Promote { data_dir, node_id } => promote(&data_dir, node_id),
    }
}

fn print(v: &Value) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(_) => println!("{v}"),
    }
}

/// Makes the stopped node in `dir` the only voter of its cluster.
fn promote(dir: &std::path::Path, id: u64) -> Result<(), String> {
    if !dir.join("db").exists() && !dir.join("conf").exists() {
        return Err(format!("{} holds no Warren store", dir.display()));
    }
    // sled locks its directory: a running node's store does not open.
    let replica = crate::store::raft::Replica::open(dir, 16 << 20).map_err(|e| {
        format!(
            "cannot open the store in {} (stop the node first): {e}",
            dir.display()
        )
    })?;
    let index = replica.promote(id, &answers)?;
    println!(
        "node {id} is now the only voter (log index {index}); start it with its usual flags: \
         it leads alone. Never promote the other node: start it again only with an empty \
         data directory, then add it (warren cluster add)."
    );
    Ok(())
}

/// Whether something accepts a TCP connection at `addr` (host:port)
/// within two seconds: a member that still runs.
fn answers(addr: &str) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    let Ok(addrs) = addr.to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
}

/// A member's management API.
struct Client {
    agent: ureq::Agent,
    url: String,
    auth: String,
}

impl Client {
    fn new(api: &Api) -> Result<Client, String> {
        // Adding a node answers once it caught up: that may take a while.
        let mut b = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(CATCH_UP);
        if let Some(ca) = &api.ca {
            b = b.tls_config(crate::tls::client_trusting(ca)?);
        }
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", api.user, api.password));
        Ok(Client {
            agent: b.build(),
            url: api.url.trim_end_matches('/').to_string(),
            auth: format!("Basic {token}"),
        })
    }

    /// One request; the JSON answer (null when empty), or what went wrong.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let req = self
            .agent
            .request(method, &format!("{}{path}", self.url))
            .set("Authorization", &self.auth);
        let res = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let text = match res {
            Ok(r) => r.into_string().map_err(|e| e.to_string())?,
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                let reason = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("reason").and_then(Value::as_str).map(String::from))
                    .unwrap_or(text);
                return Err(format!("{method} {path}: {code} {reason}"));
            }
            Err(e) => return Err(format!("{method} {path}: {e}")),
        };
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| format!("{method} {path}: {e}"))
    }

    /// Adds node `id` and waits until it votes.
    fn add(&self, id: u64, raft: &str) -> Result<(), String> {
        let path = format!("/api/cluster/members/{id}");
        self.call("PUT", &path, Some(json!({ "raft": raft })))?;
        let deadline = Instant::now() + CATCH_UP;
        loop {
            let status = self.call("GET", "/api/cluster", None)?;
            let voter = status["members"].as_array().is_some_and(|ms| {
                ms.iter()
                    .any(|m| m["id"].as_u64() == Some(id) && m["voter"] == Value::Bool(true))
            });
            if voter {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("node {id} did not become a voter in time"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}
