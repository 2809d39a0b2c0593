//! Shared access signatures as data: when one expires. Event Hubs / Service Bus tokens carry
//! `se` in Unix seconds, Storage SAS queries in ISO 8601 UTC.

/// When a shared access signature expires (Unix seconds), from its `se`: Unix seconds in an
/// Event Hubs / Service Bus token (`SharedAccessSignature sr=…&se=1700000000&…`), an ISO 8601
/// UTC time in a Storage SAS (`se=2026-11-25T20:00:00Z`, `YYYY-MM-DD` or without seconds).
pub fn expiry(token: &str) -> Option<u64> {
    let rest = token
        .strip_prefix("SharedAccessSignature ")
        .unwrap_or(token);
    let se = rest
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| kv.strip_prefix("se="))?;
    let se = percent_encoding::percent_decode_str(se)
        .decode_utf8()
        .ok()?;
    if let Ok(n) = se.parse::<u64>() {
        return Some(n);
    }
    // YYYY-MM-DD[Thh:mm[:ss[.f]]Z]
    let (date, time) = se.split_once('T').unwrap_or((&se, "00:00:00Z"));
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, mo, day) = (d.next()??, d.next()??, d.next()??);
    let time = time.strip_suffix('Z')?;
    let mut t = time.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let mi: i64 = t.next()?.parse().ok()?;
    let sec: i64 = t
        .next()
        .map_or(Some(0), |x| x.split('.').next()?.parse().ok())?;
    // Years past 9999 are no date anyone writes, and would overflow the arithmetic below.
    if !(0..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&day)
        || h > 23
        || mi > 59
        || sec > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + sec).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sas_expiry_reads_both_forms() {
        assert_eq!(
            expiry("SharedAccessSignature sr=a&sig=b&se=1700000000&skn=c"),
            Some(1_700_000_000)
        );
        assert_eq!(
            expiry("sv=1&se=2023-11-14T22:13:20Z&sig=x"),
            Some(1_700_000_000)
        );
        assert_eq!(
            expiry("sv=1&se=2023-11-14T22%3A13%3A20Z&sig=x"),
            Some(1_700_000_000)
        );
        assert_eq!(expiry("se=1970-01-02&sig=x"), Some(86_400));
        assert_eq!(expiry("se=2023-11-14T22:13Z"), Some(1_699_999_980));
        assert_eq!(expiry("sv=1&sig=x"), None);
        assert_eq!(expiry("se=2023-13-01T00:00:00Z"), None);
    }
}
