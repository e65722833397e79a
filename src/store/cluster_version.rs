//! The cluster version committed in the log (op.rs `LEVEL`): the newest
//! kind of operation every member applies. Kept in the definitions tree,
//! so a snapshot carries it; it only goes up.

use super::op::LEVEL;
use super::{Error, Result, Store};

const KEY: &[u8] = b"meta\0cluster_version";

/// The version the applied state records (1 when none was ever raised:
/// what every build applies).
pub(super) fn read(tree: &sled::Tree) -> Result<u32> {
    match tree.get(KEY)? {
        None => Ok(1),
        Some(v) => {
            let raw: [u8; 4] = v
                .as_ref()
                .try_into()
                .map_err(|_| Error::Corrupt("the cluster version record".into()))?;
            Ok(u32::from_be_bytes(raw))
        }
    }
}

/// Applies `Op::ClusterVersion`. A version above what this build applies
/// stops it: the leader raised it only because this member said it
/// applies it, so a different build now runs on this data.
pub(super) fn raise(tree: &sled::Tree, level: u32) -> Result<()> {
    if level > LEVEL {
        return Err(Error::Version(format!(
            "the cluster moved to version {level}; this build applies up to {LEVEL}: \
             run a newer build"
        )));
    }
    if level > read(tree)? {
        tree.insert(KEY, &level.to_be_bytes()[..])?;
    }
    Ok(())
}

impl Store {
    /// The cluster version committed (1 on a single node).
    pub fn cluster_version(&self) -> Result<u32> {
        read(&self.defs)
    }

    /// Raises the cluster version to `level` (every member said it applies
    /// it) and waits for the commit.
    pub async fn raise_cluster_version(&self, level: u32) -> Result<()> {
        self.submit(&super::op::Op::ClusterVersion { level })?;
        self.sync().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goes_up_only_and_not_past_this_build() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let t = db.open_tree("d").unwrap();
        assert_eq!(read(&t).unwrap(), 1);
        raise(&t, LEVEL).unwrap();
        raise(&t, 1).unwrap();
        assert_eq!(read(&t).unwrap(), LEVEL);
        assert!(raise(&t, LEVEL + 1).is_err());
        assert_eq!(read(&t).unwrap(), LEVEL);
    }
}
