//! Request bodies as RabbitMQ reads them: JSON, or nothing (an empty body
//! is an empty object); anything else is 400 {"error": "bad_request",
//! "reason": "not_json"}. Bodies are capped (the router's body limit,
//! `MAX_BODY`), so a request cannot make the broker hold an unbounded
//! amount of memory.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde_json::{Map, Value};

use super::error::ApiError;

/// The largest request body accepted (definitions files included).
pub const MAX_BODY: usize = 64 << 20;

/// A JSON request body.
pub struct Body(pub Value);

impl Body {
    /// The body as an object (400 otherwise).
    pub fn object(self) -> Result<Map<String, Value>, ApiError> {
        match self.0 {
            Value::Object(m) => Ok(m),
            _ => Err(ApiError::bad_request("not_json")),
        }
    }
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Body, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("cannot read the body: {e}")))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Body(Value::Object(Map::new())));
        }
        serde_json::from_slice(&bytes)
            .map(Body)
            .map_err(|_| ApiError::bad_request("not_json"))
    }
}
