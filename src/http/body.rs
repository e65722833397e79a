//! Request bodies as RabbitMQ reads them: JSON, or nothing (an empty body
//! is an empty object); anything else is 400 {"error": "bad_request",
//! "reason": "not_json"}.
//!
//! A body is read only when the handler asks for it (`object`, `value`),
//! which every handler does after its tag and permission checks: a user
//! who may not make a request never has its body read, let alone parsed
//! (a JSON value is many times the size of its text). A body is capped at
//! `[management] http_max_body_size` (10 MiB by default): a larger one is
//! answered 413, and one that says so in its Content-Length is not read
//! at all.

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_LENGTH;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::Api;

/// A JSON request body, not read yet.
pub struct Body {
    body: axum::body::Body,
    limit: usize,
    /// The Content-Length, if one was given.
    said: Option<u64>,
}

impl Body {
    /// The body, read and parsed.
    pub async fn value(self) -> Result<Value, ApiError> {
        use futures::StreamExt;
        if self.said.is_some_and(|n| n > self.limit as u64) {
            return Err(too_large(self.limit));
        }
        let mut chunks = self.body.into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_request(format!("cannot read the body: {e}")))?;
            if bytes.len() + chunk.len() > self.limit {
                return Err(too_large(self.limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Object(Map::new()));
        }
        serde_json::from_slice(&bytes).map_err(|_| ApiError::bad_request("not_json"))
    }

    /// The body as an object (400 otherwise). As RabbitMQ's decode: null,
    /// true and false stand for an empty object, and a string (JSON
    /// encoded twice) gets its own reason.
    pub async fn object(self) -> Result<Map<String, Value>, ApiError> {
        match self.value().await? {
            Value::Object(m) => Ok(m),
            Value::Null | Value::Bool(_) => Ok(Map::new()),
            Value::String(_) => Err(ApiError::bad_request(
                "invalid payload: the request body JSON-decoded to a string. Is the input \
                 doubly-JSON-encoded?",
            )),
            _ => Err(ApiError::bad_request("not_json")),
        }
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::payload_too_large(format!(
        "the request body is larger than {limit} bytes (management.http_max_body_size)"
    ))
}

impl FromRequest<Arc<Api>> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, api: &Arc<Api>) -> Result<Body, ApiError> {
        let limit = api.broker.config.management.http_max_body_size;
        let said = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        Ok(Body {
            body: req.into_body(),
            limit,
            said,
        })
    }
}
