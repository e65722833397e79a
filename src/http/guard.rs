//! What every request passes before a handler, and what every answer of
//! the API carries: the defences against a page elsewhere driving a
//! browser that is logged in to the API (cross-site requests), as
//! RabbitMQ's API has them.
//!
//! - A request with a body must say it is JSON (415 otherwise): a form or
//!   a text/plain body, which a page may send anywhere without asking,
//!   changes nothing.
//! - A request whose Origin is not the API's own (scheme, host and port as
//!   the Host header names them) is refused with 403 unless the origin is
//!   in `[management] cors_allow_origins`; an allowed one gets CORS
//!   headers, and its preflight (OPTIONS) an answer.
//! - Answers of /api carry `Cache-Control: no-store` (the definitions
//!   export holds password hashes) and `X-Content-Type-Options: nosniff`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN,
    TRANSFER_ENCODING, VARY, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::Api;

/// The methods the API answers, for a preflight.
const METHODS: &str = "GET, HEAD, PUT, POST, DELETE, OPTIONS";

/// The middleware (axum::middleware::from_fn_with_state).
pub async fn guard(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    let settings = &api.broker.config.management;
    let origin = req.headers().get(ORIGIN).cloned();
    let foreign = origin
        .as_ref()
        .filter(|o| !same_origin(o.to_str().unwrap_or(""), req.headers()));
    if let Some(o) = foreign {
        let text = String::from_utf8_lossy(o.as_bytes());
        if !settings.allows_origin(&text) {
            return ApiError::forbidden(format!(
                "a request from the origin '{text}' is refused: the API serves its own origin \
                 and those in [management] cors_allow_origins"
            ))
            .into_response();
        }
        if req.method() == Method::OPTIONS
            && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD)
        {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            cors(h, o);
            h.insert(
                ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(METHODS),
            );
            if let Some(asked) = req.headers().get(ACCESS_CONTROL_REQUEST_HEADERS) {
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
            }
            h.insert(ACCESS_CONTROL_MAX_AGE, settings.cors_max_age.into());
            return r;
        }
    }
    if has_body(req.headers()) && !is_json(req.headers()) {
        return ApiError::unsupported_media_type(
            "a request body must be JSON, sent with Content-Type: application/json",
        )
        .into_response();
    }
    let api_path = req.uri().path().starts_with("/api");
    let allowed = foreign.cloned();
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    if api_path {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    }
    if let Some(o) = &allowed {
        cors(h, o);
    }
    r
}

/// The headers that let a browser on an allowed origin read an answer.
fn cors(h: &mut HeaderMap, origin: &HeaderValue) {
    h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    h.insert(
        ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    h.append(VARY, HeaderValue::from_static("Origin"));
}

/// Whether `origin` (scheme://host[:port]) names the host the request was
/// sent to.
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
}

/// Whether the request carries a body (a length above 0, or chunks).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// Whether the body says it is JSON (parameters such as charset aside).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn origins_bodies_and_types() {
        let h = headers(&[(HOST, "broker:15672")]);
        assert!(same_origin("http://broker:15672", &h));
        assert!(same_origin("https://BROKER:15672", &h));
        assert!(!same_origin("http://broker:15673", &h));
        assert!(!same_origin("http://evil.example", &h));
        assert!(!same_origin("null", &h));
        assert!(!has_body(&headers(&[(CONTENT_LENGTH, "0")])));
        assert!(has_body(&headers(&[(CONTENT_LENGTH, "12")])));
        assert!(has_body(&headers(&[(TRANSFER_ENCODING, "chunked")])));
        assert!(is_json(&headers(&[(
            CONTENT_TYPE,
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[(CONTENT_TYPE, "text/plain")])));
        assert!(!is_json(&headers(&[(
            CONTENT_TYPE,
            "application/x-www-form-urlencoded"
        )])));
        assert!(!is_json(&HeaderMap::new()));
    }
}
