//! The cluster secret every member proves on the Raft port before it may
//! send a Raft message or carry a client (link.rs), as Erlang's cookie
//! guards RabbitMQ's nodes. It is `[cluster] secret_file` if given, else
//! the one this node generated into its data dir at its first start
//! (mode 0600): a cluster never runs with its port open to whoever
//! connects.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rand::RngCore;

use crate::config::{read_secret, ClusterConfig};

/// The generated secret's file in the data dir.
pub const FILE: &str = "cluster-secret";

/// This node's cluster secret.
pub fn load(cfg: &ClusterConfig, data_dir: &Path) -> Result<Vec<u8>, String> {
    if let Some(path) = &cfg.secret_file {
        return read_secret(path);
    }
    let path = data_dir.join(FILE);
    if !path.exists() {
        make(&path)?;
        tracing::warn!(
            "no cluster secret was given: generated one in {} (mode 0600). Every member must \
             hold the same secret: copy this file to the other members and start each with \
             --cluster-secret-file FILE ([cluster] secret_file); members with another secret \
             are refused",
            path.display()
        );
    }
    read_secret(&path)
}

/// Writes 32 random bytes, as hex, to a new file only its owner reads.
fn make(path: &Path) -> Result<(), String> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let fail =
        |e: std::io::Error| format!("cannot write a cluster secret to {}: {e}", path.display());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    f.write_all(format!("{text}\n").as_bytes()).map_err(fail)?;
    f.sync_all().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_a_secret_makes_one_once_readable_only_by_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cfg = ClusterConfig::default();
        let first = load(&cfg, dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        let mode = std::fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            load(&cfg, dir.path()).unwrap(),
            first,
            "kept, not made again"
        );
        let given = dir.path().join("given");
        std::fs::write(&given, "a secret the operator chose\n").unwrap();
        let cfg = ClusterConfig {
            secret_file: Some(given),
            ..ClusterConfig::default()
        };
        assert_eq!(
            load(&cfg, dir.path()).unwrap(),
            b"a secret the operator chose"
        );
    }
}
