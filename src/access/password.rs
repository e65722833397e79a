//! Password hashes in RabbitMQ's format, so that users exported from
//! RabbitMQ log in with their old passwords and users exported from Warren
//! import into RabbitMQ: base64 of a 4-octet salt followed by
//! H(salt ++ password), where H is SHA-256 (rabbit_password_hashing_sha256,
//! RabbitMQ's default and Warren's), SHA-512 or MD5 (read on import only).
//! A user record without an algorithm is MD5, as RabbitMQ reads it.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use md5::Md5;
use rand::RngCore;
use sha2::{Digest, Sha256, Sha512};

/// A hashing algorithm, by RabbitMQ's module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// rabbit_password_hashing_sha256.
    #[default]
    Sha256,
    /// rabbit_password_hashing_sha512.
    Sha512,
    /// rabbit_password_hashing_md5 (also what a record without one means).
    Md5,
}

impl Algorithm {
    /// The algorithm RabbitMQ names `name`; None for one it does not know.
    /// An empty name is what a record without `hashing_algorithm` has.
    pub fn parse(name: &str) -> Option<Algorithm> {
        match name {
            "rabbit_password_hashing_sha256" => Some(Algorithm::Sha256),
            "rabbit_password_hashing_sha512" => Some(Algorithm::Sha512),
            "rabbit_password_hashing_md5" | "" => Some(Algorithm::Md5),
            _ => None,
        }
    }

    /// RabbitMQ's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "rabbit_password_hashing_sha256",
            Algorithm::Sha512 => "rabbit_password_hashing_sha512",
            Algorithm::Md5 => "rabbit_password_hashing_md5",
        }
    }

    fn digest(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        fn run<D: Digest>(salt: &[u8], password: &[u8]) -> Vec<u8> {
            let mut d = D::new();
            d.update(salt);
            d.update(password);
            d.finalize().to_vec()
        }
        match self {
            Algorithm::Sha256 => run::<Sha256>(salt, password),
            Algorithm::Sha512 => run::<Sha512>(salt, password),
            Algorithm::Md5 => run::<Md5>(salt, password),
        }
    }
}

/// The salt length RabbitMQ uses.
const SALT: usize = 4;

/// The hash of `password` with a fresh random salt.
pub fn hash(algorithm: Algorithm, password: &str) -> String {
    let mut salt = [0u8; SALT];
    rand::thread_rng().fill_bytes(&mut salt);
    hash_with_salt(algorithm, salt, password)
}

/// The hash of `password` with `salt`.
pub fn hash_with_salt(algorithm: Algorithm, salt: [u8; SALT], password: &str) -> String {
    let mut out = salt.to_vec();
    out.extend(algorithm.digest(&salt, password.as_bytes()));
    STANDARD.encode(out)
}

/// Whether `password` matches `stored` (a hash in RabbitMQ's format). A
/// hash that is not base64, or too short to hold a salt, matches nothing.
pub fn verify(algorithm: Algorithm, stored: &str, password: &str) -> bool {
    let Ok(raw) = STANDARD.decode(stored.trim()) else {
        return false;
    };
    if raw.len() <= SALT {
        return false;
    }
    let (salt, want) = raw.split_at(SALT);
    let got = algorithm.digest(salt, password.as_bytes());
    // Length first, then every octet, so the time does not say where a
    // guess went wrong.
    got.len() == want.len() && got.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Whether `stored` decodes as a hash of `algorithm`'s length.
pub fn well_formed(algorithm: Algorithm, stored: &str) -> bool {
    let want = SALT + algorithm.digest(b"", b"").len();
    STANDARD
        .decode(stored.trim())
        .is_ok_and(|raw| raw.len() == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Vectors from RabbitMQ's password guide and its users' scripts.
    #[test]
    fn rabbitmqs_own_examples_verify() {
        let sha256 = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR";
        assert_eq!(
            hash_with_salt(Algorithm::Sha256, [0x90, 0x8d, 0xc6, 0x0a], "test12"),
            sha256
        );
        assert!(verify(Algorithm::Sha256, sha256, "test12"));
        assert!(!verify(Algorithm::Sha256, sha256, "test13"));
        let md5 = "ytUIm8s3AnKsXQjptplKFytfVxI=";
        assert_eq!(
            hash_with_salt(Algorithm::Md5, [0xca, 0xd5, 0x08, 0x9b], "simon"),
            md5
        );
        assert!(verify(Algorithm::parse("").unwrap(), md5, "simon"));
    }

    #[test]
    fn fresh_hashes_verify_and_bad_ones_match_nothing() {
        for a in [Algorithm::Sha256, Algorithm::Sha512, Algorithm::Md5] {
            let h = hash(a, "s3cret");
            assert!(well_formed(a, &h));
            assert!(verify(a, &h, "s3cret"));
            assert!(!verify(a, &h, ""));
            assert_eq!(Algorithm::parse(a.name()), Some(a));
        }
        assert!(!verify(Algorithm::Sha256, "not base64!", "x"));
        assert!(!verify(Algorithm::Sha256, "AAAA", "x"));
        assert!(!well_formed(
            Algorithm::Sha512,
            &hash(Algorithm::Sha256, "x")
        ));
        assert_eq!(Algorithm::parse("rabbit_password_hashing_bcrypt"), None);
    }
}
