//! API errors as RabbitMQ's management API returns them: a status and a
//! JSON body {"error", "reason"}. Authorisation failures are 401
//! "not_authorised" as in RabbitMQ (not 403); a failed login is 401
//! "not_authorized" with a WWW-Authenticate challenge.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// A refused request.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: &'static str,
    /// A string, or as RabbitMQ prints an Erlang tuple: a list
    /// (["not_boolean","yes"]).
    pub reason: Value,
    /// Whether to ask for credentials (a failed or missing login).
    challenge: bool,
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    fn new(status: StatusCode, error: &'static str, reason: impl Into<String>) -> ApiError {
        ApiError {
            status,
            error,
            reason: Value::String(reason.into()),
            challenge: false,
        }
    }

    /// 404 Object Not Found.
    pub fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "Object Not Found", "Not Found")
    }

    /// 400 with `reason`.
    pub fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", reason)
    }

    /// 400 with an Erlang term for reason, as RabbitMQ renders a tuple:
    /// a JSON list.
    pub fn bad_request_term(reason: Value) -> ApiError {
        ApiError {
            reason,
            ..ApiError::bad_request("")
        }
    }

    /// 401: logged in, but not allowed (RabbitMQ's "not_authorised").
    pub fn not_authorised(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "not_authorised", reason)
    }

    /// 401: no or wrong credentials.
    pub fn login_failed() -> ApiError {
        ApiError {
            challenge: true,
            ..ApiError::new(StatusCode::UNAUTHORIZED, "not_authorized", "Login failed")
        }
    }

    /// 500 with `reason`.
    pub fn internal(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", reason)
    }

    /// 503 for a failed health check is not an ApiError (it has its own
    /// body); this is for a service that cannot answer.
    pub fn unavailable(reason: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            reason,
        )
    }

    /// 403: a request the API does not serve (a foreign origin).
    pub fn forbidden(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", reason)
    }

    /// 415: a body that is not JSON.
    pub fn unsupported_media_type(reason: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            reason,
        )
    }

    /// 413: a request body over the configured limit.
    pub fn payload_too_large(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", reason)
    }

    /// 422: a request that cannot apply to the entity as it is now.
    pub fn unprocessable(reason: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable_entity",
            reason,
        )
    }

    /// 405 with `reason`.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "Method Not Allowed",
        )
    }
}

/// A vhost operation refused: the AMQP reply the same refusal would get,
/// as RabbitMQ's API words it (400 for most, 404 for a missing entity, 401
/// for access).
impl From<crate::vhost::Error> for ApiError {
    fn from(e: crate::vhost::Error) -> ApiError {
        use crate::vhost::error::Kind;
        match e.kind {
            Kind::NotFound => ApiError::new(StatusCode::NOT_FOUND, "not_found", e.text),
            // RabbitMQ's API says no more (the why goes to its log).
            Kind::AccessRefused => {
                tracing::info!("management API request refused: {}", e.text);
                ApiError::not_authorised("Access refused.")
            }
            Kind::Internal => ApiError::internal(e.text),
            _ => ApiError::bad_request(e.text),
        }
    }
}

impl From<crate::access::Error> for ApiError {
    fn from(e: crate::access::Error) -> ApiError {
        match e {
            crate::access::Error::NoUser(_) => ApiError::not_found(),
            crate::access::Error::Invalid(why) => ApiError::bad_request(why),
            crate::access::Error::Store(e) => ApiError::internal(e.to_string()),
        }
    }
}

impl From<crate::store::Error> for ApiError {
    fn from(e: crate::store::Error) -> ApiError {
        ApiError::internal(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.error, "reason": self.reason});
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.challenge {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"RabbitMQ Management\""),
            );
        }
        r
    }
}
