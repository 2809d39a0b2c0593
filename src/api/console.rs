//! The operator console's files, served at `/console` (docs/CONSOLE.md).
//!
//! Every file is compiled into the binary (`include_str!`): no CDN, no build step, nothing read
//! from disk. The files hold no data and need no credential; everything the page shows comes
//! from the management API, called by the page with the operator's credential in a header
//! (`aeg-sas-key`, kept in the tab's `sessionStorage`) or with the browser's client certificate,
//! and checked by [`super::auth::require`] like any other call. So a publish-only, receive-only
//! or metrics-only credential gets the same 403s in the console as with curl, and no cookie is
//! ever involved (nothing for a cross-site request to ride on).
//!
//! Every answer carries a strict Content-Security-Policy: scripts and styles only from these
//! files (no inline script or style, no `eval`), requests only to this origin, no framing.

use super::AppState;
use crate::error::ApiError;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The policy every console answer carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The console's files: name, content type, content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("console/console.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("console/favicon.svg"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("console/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("console/api.js"),
    ),
    (
        "ui.js",
        "text/javascript; charset=utf-8",
        include_str!("console/ui.js"),
    ),
    (
        "overview.js",
        "text/javascript; charset=utf-8",
        include_str!("console/overview.js"),
    ),
    (
        "topics.js",
        "text/javascript; charset=utf-8",
        include_str!("console/topics.js"),
    ),
    (
        "subscription.js",
        "text/javascript; charset=utf-8",
        include_str!("console/subscription.js"),
    ),
    (
        "tail.js",
        "text/javascript; charset=utf-8",
        include_str!("console/tail.js"),
    ),
];

/// `GET /console` and `/console/`: the page.
pub(super) async fn index(State(s): State<AppState>) -> Response {
    file(&s, "index.html")
}

/// `GET /console/{file}`.
pub(super) async fn asset(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    file(&s, &name)
}

fn file(s: &AppState, name: &str) -> Response {
    let found = FILES.iter().find(|(n, _, _)| *n == name);
    let Some((_, content_type, body)) = found.filter(|_| s.broker.config().console.enabled) else {
        return ApiError::not_found("NotFound", "no such route").into_response();
    };
    let mut r = (*body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
