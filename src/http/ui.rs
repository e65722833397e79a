//! The management web UI: static files built into the binary (ui/ at the
//! repository's root), served at `/` beside the API. The UI is a set of
//! plain ES modules with no build step; it logs in with the API's users and
//! reads and changes everything through the public /api, as any tool does.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// (path under /ui/, content type, contents).
const FILES: &[(&str, &str, &str)] = &[
    ("style.css", "text/css", include_str!("../../ui/style.css")),
    ("js/api.js", JS, include_str!("../../ui/js/api.js")),
    ("js/app.js", JS, include_str!("../../ui/js/app.js")),
    ("js/chart.js", JS, include_str!("../../ui/js/chart.js")),
    ("js/dom.js", JS, include_str!("../../ui/js/dom.js")),
    ("js/list.js", JS, include_str!("../../ui/js/list.js")),
    (
        "js/pages/admin.js",
        JS,
        include_str!("../../ui/js/pages/admin.js"),
    ),
    (
        "js/pages/connections.js",
        JS,
        include_str!("../../ui/js/pages/connections.js"),
    ),
    (
        "js/pages/exchanges.js",
        JS,
        include_str!("../../ui/js/pages/exchanges.js"),
    ),
    (
        "js/pages/federation.js",
        JS,
        include_str!("../../ui/js/pages/federation.js"),
    ),
    (
        "js/pages/overview.js",
        JS,
        include_str!("../../ui/js/pages/overview.js"),
    ),
    (
        "js/pages/queues.js",
        JS,
        include_str!("../../ui/js/pages/queues.js"),
    ),
    (
        "js/pages/shovels.js",
        JS,
        include_str!("../../ui/js/pages/shovels.js"),
    ),
];

const JS: &str = "text/javascript";
const INDEX: &str = include_str!("../../ui/index.html");

/// Nothing from elsewhere: scripts, styles and connections to this origin.
const POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; \
    style-src 'self' 'unsafe-inline'; frame-ancestors 'none'";

fn respond(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The files change only with the binary: revalidate each load.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

async fn index() -> Response {
    respond("text/html; charset=utf-8", INDEX)
}

async fn file(Path(path): Path<String>) -> Response {
    match FILES.iter().find(|(p, _, _)| *p == path) {
        Some((_, kind, body)) => respond(kind, body),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `/`, `/index.html` and `/ui/...`.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/ui/{*path}", get(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_ui_imports_is_served() {
        let served: Vec<&str> = FILES.iter().map(|f| f.0).collect();
        for (path, _, body) in FILES {
            let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
            for line in body.lines().filter(|l| l.starts_with("import ")) {
                let Some(spec) = line.split('"').nth(1) else {
                    continue;
                };
                let mut parts: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
                for s in spec.split('/') {
                    match s {
                        "." => {}
                        ".." => {
                            parts.pop();
                        }
                        s => parts.push(s),
                    }
                }
                let target = parts.join("/");
                assert!(served.contains(&target.as_str()), "{path} imports {spec}");
            }
        }
    }
}
