//! Masking credentials in text meant for people (logs, `GET`, the module twin, `check-config`):
//! the one rule for URLs, used for destination URLs and the telemetry endpoints alike. A helper
//! with no knowledge of the domain (layer 0), so configuration can use it too.

/// What a secret is replaced by.
pub const MASK: &str = "***";

/// Whether a URL path segment looks like a token (Slack, Teams and Discord webhook URLs carry
/// their keys in the path): at least 16 characters of the kinds tokens use, with digits or
/// both letter cases (`order-created-events` stays readable, `IncomingWebhook` is shorter).
pub fn token_like(segment: &str) -> bool {
    let b = segment.as_bytes();
    let charset = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || b"-_.@=~+%".contains(c));
    let digit = b.iter().any(u8::is_ascii_digit);
    let mixed = b.iter().any(u8::is_ascii_uppercase) && b.iter().any(u8::is_ascii_lowercase);
    b.len() >= 16 && charset && (digit || mixed)
}

/// `path` with every token-like segment replaced by `***`.
pub fn mask_path(path: &str) -> String {
    path.split('/')
        .map(|s| if token_like(s) { MASK } else { s })
        .collect::<Vec<_>>()
        .join("/")
}

/// `url` with its password (or a lone user name), every query value but `api-version` and every
/// token-like path segment ([`mask_path`]) replaced by `***`, the rest of the text unchanged; anything that does not parse
/// as a URL is masked whole.
pub fn mask_url(url: &str) -> String {
    if url::Url::parse(url).is_err() {
        return MASK.into();
    }
    let (rest, fragment) = match url.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (url, None),
    };
    let (head, query) = match rest.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (rest, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, after)) => {
            let end = after.find('/').unwrap_or(after.len());
            let (authority, path) = after.split_at(end);
            let authority = match authority.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _)) => format!("{user}:{MASK}@{host}"),
                    None => format!("{MASK}@{host}"),
                },
                None => authority.to_string(),
            };
            format!("{scheme}://{authority}{}", mask_path(path))
        }
        None => head.to_string(),
    };
    if let Some(q) = query {
        let masked: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                // Every value: a list of secret names always misses one (`sas`, `hmac`, …).
                Some((k, _)) if !k.eq_ignore_ascii_case("api-version") => format!("{k}={MASK}"),
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&masked.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Whether `url` carries a credential: anything [`mask_url`] would hide (user info, a query
/// value other than `api-version`, a token-like path segment).
pub fn carries_credentials(url: &str) -> bool {
    mask_url(url) != url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_carries_credentials_when_masking_would_change_it() {
        for yes in [
            "https://h/api?code=FUNCTIONKEY",
            "https://user:pw@h/",
            "https://user@h/",
            "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX1",
            "https://h/?api-version=1&sig=x",
        ] {
            assert!(carries_credentials(yes), "{yes}");
        }
        for no in [
            "https://h/hook",
            "https://h:8443/api/events?api-version=2018-01-01",
            "https://h/order-created-events",
        ] {
            assert!(!carries_credentials(no), "{no}");
        }
    }
}
