//! Content types: what the API and the publish parser read from `Content-Type`.

/// A content type's essence: the media type without parameters, lowercased
/// (`Application/JSON; charset=utf-8` → `application/json`).
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether an essence names JSON: `application/json`, `text/json` or any `+json` type.
pub fn is_json(essence: &str) -> bool {
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}
