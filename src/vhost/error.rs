//! `vhost::Error`: what a vhost operation refuses, in RabbitMQ's words.
//! The kind says what went wrong; the AMQP layer picks the reply code for
//! each kind in one place (amqp/error.rs), as RabbitMQ's map_exception.

use std::fmt;

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No such exchange or queue.
    NotFound,
    /// Not allowed on this entity (a reserved name, the default exchange,
    /// an internal exchange).
    AccessRefused,
    /// Another connection's exclusive queue.
    ResourceLocked,
    /// Not equivalent, in use, not empty, a bad argument, a limit reached.
    PreconditionFailed,
    /// An exchange type that does not exist.
    CommandInvalid,
    /// The store failed, or a plugin misbehaved.
    Internal,
    /// The vhost was deleted.
    Gone,
}

/// A refused vhost operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: Kind,
    /// RabbitMQ's text, without the reply-code name.
    pub text: String,
}

macro_rules! constructors {
    ($($name:ident => $kind:ident),* $(,)?) => {
        impl Error {
            $(
                #[doc = concat!("An error of kind `", stringify!($kind), "`.")]
                pub fn $name(text: impl fmt::Display) -> Self {
                    Error { kind: Kind::$kind, text: text.to_string() }
                }
            )*
        }
    };
}

constructors! {
    not_found => NotFound,
    access_refused => AccessRefused,
    resource_locked => ResourceLocked,
    precondition_failed => PreconditionFailed,
    command_invalid => CommandInvalid,
    internal => Internal,
    gone => Gone,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Error {}

impl From<crate::store::Error> for Error {
    fn from(e: crate::store::Error) -> Self {
        Error::internal(format!("store: {e}"))
    }
}

/// Result of a vhost operation.
pub type Result<T> = std::result::Result<T, Error>;
