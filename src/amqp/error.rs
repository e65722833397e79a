//! `ProtocolError`: the one place that knows AMQP reply codes and decides
//! whether an error closes the channel (soft) or the whole connection (hard).
//! Domain errors (`vhost::Error`, `store::Error`) convert into it here.

use std::fmt;

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::ShortString;

/// AMQP 0-9-1 reply codes, as RabbitMQ uses them.
pub mod code {
    pub const REPLY_SUCCESS: u16 = 200;
    pub const NO_ROUTE: u16 = 312;
    pub const CONNECTION_FORCED: u16 = 320;
    pub const ACCESS_REFUSED: u16 = 403;
    pub const NOT_FOUND: u16 = 404;
    pub const RESOURCE_LOCKED: u16 = 405;
    pub const PRECONDITION_FAILED: u16 = 406;
    pub const FRAME_ERROR: u16 = 501;
    pub const SYNTAX_ERROR: u16 = 502;
    pub const COMMAND_INVALID: u16 = 503;
    pub const CHANNEL_ERROR: u16 = 504;
    pub const UNEXPECTED_FRAME: u16 = 505;
    pub const RESOURCE_ERROR: u16 = 506;
    pub const NOT_ALLOWED: u16 = 530;
    pub const NOT_IMPLEMENTED: u16 = 540;
    pub const INTERNAL_ERROR: u16 = 541;
}

/// The reply-code names RabbitMQ prefixes to its reply texts.
fn code_name(code: u16) -> &'static str {
    match code {
        code::NO_ROUTE => "NO_ROUTE",
        code::CONNECTION_FORCED => "CONNECTION_FORCED",
        code::ACCESS_REFUSED => "ACCESS_REFUSED",
        code::NOT_FOUND => "NOT_FOUND",
        code::RESOURCE_LOCKED => "RESOURCE_LOCKED",
        code::PRECONDITION_FAILED => "PRECONDITION_FAILED",
        code::FRAME_ERROR => "FRAME_ERROR",
        code::SYNTAX_ERROR => "SYNTAX_ERROR",
        code::COMMAND_INVALID => "COMMAND_INVALID",
        code::CHANNEL_ERROR => "CHANNEL_ERROR",
        code::UNEXPECTED_FRAME => "UNEXPECTED_FRAME",
        code::RESOURCE_ERROR => "RESOURCE_ERROR",
        code::NOT_ALLOWED => "NOT_ALLOWED",
        code::NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
        code::INTERNAL_ERROR => "INTERNAL_ERROR",
        _ => "ERROR",
    }
}

/// An error to report to the peer with `channel.close` or `connection.close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    /// The AMQP reply code.
    pub code: u16,
    /// The reply text, `"NOT_FOUND - no queue 'q' in vhost '/'"` style.
    pub text: String,
    /// Class of the method that failed (0 when none).
    pub class_id: u16,
    /// Method that failed (0 when none).
    pub method_id: u16,
    /// Whether this error closes the connection rather than the channel.
    pub hard: bool,
}

impl ProtocolError {
    /// An error with `code`; soft or hard follows from the code, as in
    /// RabbitMQ's `rabbit_binary_generator:map_exception`.
    pub fn new(code: u16, detail: impl fmt::Display) -> Self {
        let hard = !matches!(
            code,
            code::NO_ROUTE
                | code::ACCESS_REFUSED
                | code::NOT_FOUND
                | code::RESOURCE_LOCKED
                | code::PRECONDITION_FAILED
        );
        ProtocolError {
            code,
            text: format!("{} - {}", code_name(code), detail),
            class_id: 0,
            method_id: 0,
            hard,
        }
    }

    /// Names the method that failed.
    pub fn on(mut self, class_id: u16, method_id: u16) -> Self {
        if self.class_id == 0 {
            self.class_id = class_id;
            self.method_id = method_id;
        }
        self
    }

    /// Makes this error close the connection whatever its code.
    pub fn hard(mut self) -> Self {
        self.hard = true;
        self
    }

    pub fn not_found(detail: impl fmt::Display) -> Self {
        Self::new(code::NOT_FOUND, detail)
    }
    pub fn access_refused(detail: impl fmt::Display) -> Self {
        Self::new(code::ACCESS_REFUSED, detail)
    }
    pub fn resource_locked(detail: impl fmt::Display) -> Self {
        Self::new(code::RESOURCE_LOCKED, detail)
    }
    pub fn precondition_failed(detail: impl fmt::Display) -> Self {
        Self::new(code::PRECONDITION_FAILED, detail)
    }
    pub fn frame_error(detail: impl fmt::Display) -> Self {
        Self::new(code::FRAME_ERROR, detail)
    }
    pub fn syntax_error(detail: impl fmt::Display) -> Self {
        Self::new(code::SYNTAX_ERROR, detail)
    }
    pub fn command_invalid(detail: impl fmt::Display) -> Self {
        Self::new(code::COMMAND_INVALID, detail)
    }
    pub fn channel_error(detail: impl fmt::Display) -> Self {
        Self::new(code::CHANNEL_ERROR, detail)
    }
    pub fn unexpected_frame(detail: impl fmt::Display) -> Self {
        Self::new(code::UNEXPECTED_FRAME, detail)
    }
    pub fn not_allowed(detail: impl fmt::Display) -> Self {
        Self::new(code::NOT_ALLOWED, detail)
    }
    pub fn not_implemented(detail: impl fmt::Display) -> Self {
        Self::new(code::NOT_IMPLEMENTED, detail)
    }
    pub fn internal(detail: impl fmt::Display) -> Self {
        Self::new(code::INTERNAL_ERROR, detail)
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}.{}): {}",
            self.code, self.class_id, self.method_id, self.text
        )
    }
}

impl std::error::Error for ProtocolError {}

/// The one place a vhost error's kind becomes a reply code.
impl From<crate::vhost::Error> for ProtocolError {
    fn from(e: crate::vhost::Error) -> Self {
        use crate::vhost::error::Kind;
        let code = match e.kind {
            Kind::NotFound => code::NOT_FOUND,
            Kind::AccessRefused => code::ACCESS_REFUSED,
            Kind::ResourceLocked => code::RESOURCE_LOCKED,
            Kind::PreconditionFailed => code::PRECONDITION_FAILED,
            Kind::CommandInvalid => code::COMMAND_INVALID,
            Kind::Internal => code::INTERNAL_ERROR,
            Kind::Gone => code::CONNECTION_FORCED,
        };
        ProtocolError::new(code, e.text)
    }
}

impl From<crate::store::Error> for ProtocolError {
    fn from(e: crate::store::Error) -> Self {
        ProtocolError::internal(format!("store: {e}"))
    }
}

/// Result of a channel or connection method handler.
pub type Result<T> = std::result::Result<T, ProtocolError>;

/// The connection.close method for a hard error.
pub fn close_method(e: &ProtocolError) -> AMQPClass {
    AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
        reply_code: e.code,
        reply_text: ShortString::from(truncate(&e.text)),
        class_id: e.class_id,
        method_id: e.method_id,
    }))
}

/// Reply texts are short strings: at most 255 bytes, cut at a char boundary.
pub fn truncate(s: &str) -> String {
    if s.len() <= 255 {
        return s.to_string();
    }
    let mut end = 255;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_and_hard_follow_the_code() {
        assert!(!ProtocolError::not_found("x").hard);
        assert!(!ProtocolError::precondition_failed("x").hard);
        assert!(!ProtocolError::access_refused("x").hard);
        assert!(!ProtocolError::resource_locked("x").hard);
        assert!(ProtocolError::frame_error("x").hard);
        assert!(ProtocolError::channel_error("x").hard);
        assert!(ProtocolError::not_allowed("x").hard);
        assert!(ProtocolError::not_implemented("x").hard);
        assert!(ProtocolError::access_refused("x").hard().hard);
    }

    #[test]
    fn text_carries_the_code_name() {
        let e = ProtocolError::not_found("no queue 'q' in vhost '/'").on(50, 10);
        assert_eq!(e.text, "NOT_FOUND - no queue 'q' in vhost '/'");
        assert_eq!((e.class_id, e.method_id), (50, 10));
    }
}
