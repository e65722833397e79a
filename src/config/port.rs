//! A listener's port: a number (0 = any free port) or off, as every
//! listener takes it: `--management-port off` on the command line,
//! `management_port = false` (or "off") in the TOML file.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// Where a listener listens, or that it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// This port (0: any free one).
    On(u16),
    /// No listener.
    Off,
}

impl Port {
    /// The port, if the listener is on.
    pub fn get(self) -> Option<u16> {
        match self {
            Port::On(p) => Some(p),
            Port::Off => None,
        }
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::On(p) => write!(f, "{p}"),
            Port::Off => f.write_str("off"),
        }
    }
}

impl FromStr for Port {
    type Err = String;

    fn from_str(s: &str) -> Result<Port, String> {
        match s {
            "off" | "false" | "none" => Ok(Port::Off),
            n => n
                .parse()
                .map(Port::On)
                .map_err(|_| format!("'{s}' is not a port (0-65535) or off")),
        }
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Port, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number, or false / \"off\"")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Port, E> {
                match b {
                    false => Ok(Port::Off),
                    true => Err(E::custom("true is not a port; give the number")),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Port, E> {
                u16::try_from(n)
                    .map(Port::On)
                    .map_err(|_| E::custom(format!("{n} is not a port (0-65535)")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Port, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Port, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_off_parse_from_flags_and_toml() {
        assert_eq!("0".parse::<Port>(), Ok(Port::On(0)));
        assert_eq!("off".parse::<Port>(), Ok(Port::Off));
        assert!("70000".parse::<Port>().is_err());
        #[derive(Deserialize)]
        struct T {
            p: Port,
        }
        let t: T = toml::from_str("p = false").unwrap();
        assert_eq!(t.p, Port::Off);
        let t: T = toml::from_str("p = 15672").unwrap();
        assert_eq!(t.p, Port::On(15672));
        assert!(toml::from_str::<T>("p = -1").is_err());
    }
}
