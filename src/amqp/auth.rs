//! SASL PLAIN and AMQPLAIN: turning a `connection.start-ok` response into a
//! user name and password. EXTERNAL (TLS client certificates) is decided
//! in the handshake, which knows the certificate.

/// The mechanisms offered in `connection.start`.
pub const MECHANISMS: &str = "PLAIN AMQPLAIN";
/// ... on a TLS connection whose client presented a verified certificate
/// (EXTERNAL takes the user name from it; see crate::tls::identity).
pub const MECHANISMS_WITH_EXTERNAL: &str = "PLAIN AMQPLAIN EXTERNAL";

/// Credentials a client presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

/// Why a response was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// Not a mechanism we offer.
    UnknownMechanism(String),
    /// The response does not parse for its mechanism.
    Malformed,
}

/// Decodes the SASL response for `mechanism`.
pub fn decode(mechanism: &str, response: &[u8]) -> Result<Credentials, AuthError> {
    match mechanism {
        // authzid \0 authcid \0 password
        "PLAIN" => {
            let mut parts = response.splitn(3, |&b| b == 0);
            let (_authz, user, pass) = match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(u), Some(p)) => (a, u, p),
                _ => return Err(AuthError::Malformed),
            };
            Ok(Credentials {
                user: String::from_utf8_lossy(user).into_owned(),
                password: String::from_utf8_lossy(pass).into_owned(),
            })
        }
        // A field table without its length prefix: LOGIN and PASSWORD.
        "AMQPLAIN" => {
            let mut framed = Vec::with_capacity(response.len() + 4);
            framed.extend_from_slice(&(response.len() as u32).to_be_bytes());
            framed.extend_from_slice(response);
            if crate::wire::table::check_table(&framed) != Ok(framed.len()) {
                return Err(AuthError::Malformed);
            }
            let get = |k: &str| {
                let v = crate::wire::table::get(&framed, k.as_bytes())?;
                Some(String::from_utf8_lossy(v.as_long_str()?).into_owned())
            };
            match (get("LOGIN"), get("PASSWORD")) {
                (Some(user), Some(password)) => Ok(Credentials { user, password }),
                _ => Err(AuthError::Malformed),
            }
        }
        other => Err(AuthError::UnknownMechanism(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain() {
        assert_eq!(
            decode("PLAIN", b"\0guest\0secret"),
            Ok(Credentials {
                user: "guest".into(),
                password: "secret".into()
            })
        );
        assert_eq!(decode("PLAIN", b"guest"), Err(AuthError::Malformed));
    }

    #[test]
    fn amqplain() {
        let mut r = Vec::new();
        for (k, v) in [("LOGIN", "guest"), ("PASSWORD", "pw")] {
            r.push(k.len() as u8);
            r.extend_from_slice(k.as_bytes());
            r.push(b'S');
            r.extend_from_slice(&(v.len() as u32).to_be_bytes());
            r.extend_from_slice(v.as_bytes());
        }
        assert_eq!(
            decode("AMQPLAIN", &r),
            Ok(Credentials {
                user: "guest".into(),
                password: "pw".into()
            })
        );
        assert_eq!(decode("AMQPLAIN", b"\x05LOGIN"), Err(AuthError::Malformed));
    }

    #[test]
    fn unknown_mechanism() {
        assert_eq!(
            decode("EXTERNAL", b""),
            Err(AuthError::UnknownMechanism("EXTERNAL".into()))
        );
    }
}
