//! `disk_free_limit`: the free space under which the free-disk alarm is
//! raised, as RabbitMQ's `disk_free_limit.absolute` (bytes, or with a
//! unit: "50MB", "2GiB") or `disk_free_limit.relative` (a multiple of the
//! machine's memory). In the TOML file: `disk_free_limit = 50000000`,
//! `disk_free_limit = "2GB"` or `disk_free_limit = { mem_relative = 1.5 }`;
//! on the command line `--disk-free-limit 2GB` or
//! `--disk-free-limit mem_relative:1.5`.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// RabbitMQ's default: 50 MB.
pub const DEFAULT_DISK_FREE_LIMIT: u64 = 50_000_000;

/// The free-disk alarm's threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DiskFreeLimit {
    /// This many bytes.
    Absolute(u64),
    /// This multiple of the machine's memory.
    MemRelative(f64),
}

impl Default for DiskFreeLimit {
    fn default() -> Self {
        DiskFreeLimit::Absolute(DEFAULT_DISK_FREE_LIMIT)
    }
}

impl DiskFreeLimit {
    /// The limit in bytes, on a machine with `memory` bytes of RAM.
    pub fn bytes(&self, memory: Option<u64>) -> Result<u64, String> {
        match *self {
            DiskFreeLimit::Absolute(n) => Ok(n),
            DiskFreeLimit::MemRelative(f) => {
                memory.map(|m| (m as f64 * f) as u64).ok_or_else(|| {
                    "disk_free_limit mem_relative: cannot read the machine's memory; give an \
                 absolute limit"
                        .to_string()
                })
            }
        }
    }

    /// Refuses a limit that cannot work.
    pub fn check(&self) -> Result<(), String> {
        match *self {
            DiskFreeLimit::MemRelative(f) if !(f.is_finite() && f > 0.0 && f <= 100.0) => Err(
                format!("disk_free_limit mem_relative must be above 0 and at most 100, not {f}"),
            ),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for DiskFreeLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskFreeLimit::Absolute(n) => write!(f, "{n}"),
            DiskFreeLimit::MemRelative(r) => write!(f, "mem_relative:{r}"),
        }
    }
}

/// Bytes from "50000000", "50MB", "2GiB", "512k" (RabbitMQ's units: k, K,
/// kiB, KiB, M, MiB, G, GiB and T, TiB count in 1024s; kB, KB, MB, GB, TB
/// in 1000s).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (bytes, or a number and a unit: 50MB, 2GiB)"))?;
    let scale: u64 = match unit.trim() {
        "" => 1,
        "k" | "K" | "kiB" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "'{s}': unknown unit '{other}' (k, M, G, T, kB, MB, GB, TB, kiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("'{s}' is too large"))
}

impl FromStr for DiskFreeLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<DiskFreeLimit, String> {
        let limit =
            match s.trim().strip_prefix("mem_relative:") {
                Some(r) => DiskFreeLimit::MemRelative(r.trim().parse().map_err(|_| {
                    format!("'{s}': mem_relative takes a number (mem_relative:1.5)")
                })?),
                None => DiskFreeLimit::Absolute(parse_bytes(s)?),
            };
        limit.check()?;
        Ok(limit)
    }
}

impl<'de> Deserialize<'de> for DiskFreeLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DiskFreeLimit, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DiskFreeLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes (50000000), a size (\"50MB\") or { mem_relative = 1.5 }")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DiskFreeLimit, E> {
                Ok(DiskFreeLimit::Absolute(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DiskFreeLimit, E> {
                u64::try_from(v)
                    .map(DiskFreeLimit::Absolute)
                    .map_err(|_| E::custom("disk_free_limit cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DiskFreeLimit, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<DiskFreeLimit, A::Error> {
                let mut relative = None;
                while let Some(key) = m.next_key::<String>()? {
                    match key.as_str() {
                        "mem_relative" => relative = Some(m.next_value::<f64>()?),
                        "absolute" => match m.next_value::<DiskFreeLimit>()? {
                            abs @ DiskFreeLimit::Absolute(_) => return Ok(abs),
                            _ => return Err(de::Error::custom("absolute takes bytes or a size")),
                        },
                        other => {
                            return Err(de::Error::unknown_field(
                                other,
                                &["mem_relative", "absolute"],
                            ))
                        }
                    }
                }
                let limit = DiskFreeLimit::MemRelative(
                    relative.ok_or_else(|| de::Error::missing_field("mem_relative"))?,
                );
                limit.check().map_err(de::Error::custom)?;
                Ok(limit)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_rabbitmq_writes_them() {
        assert_eq!(parse_bytes("50000000"), Ok(50_000_000));
        assert_eq!(parse_bytes("50MB"), Ok(50_000_000));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert!(parse_bytes("5 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999TB").is_err());
        assert_eq!(
            "mem_relative:1.5".parse::<DiskFreeLimit>(),
            Ok(DiskFreeLimit::MemRelative(1.5))
        );
        assert!("mem_relative:0".parse::<DiskFreeLimit>().is_err());
    }

    #[derive(Deserialize)]
    struct File {
        disk_free_limit: DiskFreeLimit,
    }

    fn from_toml(s: &str) -> Result<DiskFreeLimit, String> {
        toml::from_str::<File>(s)
            .map(|f| f.disk_free_limit)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn in_the_file() {
        assert_eq!(
            from_toml("disk_free_limit = 1000"),
            Ok(DiskFreeLimit::Absolute(1000))
        );
        assert_eq!(
            from_toml("disk_free_limit = \"1GB\""),
            Ok(DiskFreeLimit::Absolute(1_000_000_000))
        );
        assert_eq!(
            from_toml("disk_free_limit = { mem_relative = 2.0 }"),
            Ok(DiskFreeLimit::MemRelative(2.0))
        );
        assert_eq!(
            from_toml("disk_free_limit = { absolute = \"2MB\" }"),
            Ok(DiskFreeLimit::Absolute(2_000_000))
        );
        assert!(from_toml("disk_free_limit = -1").is_err());
        assert!(from_toml("disk_free_limit = { relative = 1.0 }").is_err());
        assert!(from_toml("disk_free_limit = { mem_relative = -1.0 }").is_err());
    }
}
