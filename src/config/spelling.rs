//! Settings that are not in the table, and the table's key closest to each: what `check-config`
//! reports and start-up warns about (`broker__defaultMaxDeliveryAtempts`: did you mean
//! `broker__defaultMaxDeliveryAttempts`?).
//!
//! Keys are compared as the loader reads them: `:` as `__`, in any case. Distance is the optimal
//! string alignment distance (insertions, deletions, substitutions and swaps of two neighbouring
//! letters, one edit each) to every key of [`SETTINGS`](super::SETTINGS), so a setting added to
//! the table is suggested without being listed here.
//!
//! The environment holds many variables that are not gridlet's (`PATH`, other programs'
//! `OTEL_*`). A variable counts as a misspelled setting when it is in a section the table has
//! (`inbound__…`, `broker__…`: everything there is gridlet's), or when it is within a typo's
//! reach of a key (a misspelled section, `OTEL_EXPORTER_OTLP_ENDPIONT`, single underscores).

use super::settings::Key;
use std::fmt;

/// A variable that looks like a setting but is none: the name as given, and the closest key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// The variable's name as given.
    pub key: String,
    /// The table's key closest to it, when one is close enough to be a suggestion.
    pub closest: Option<Key>,
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.closest {
            Some(k) => write!(f, "{} (did you mean {}?)", self.key, k.name()),
            None => write!(f, "{} (no setting is spelled like it)", self.key),
        }
    }
}

/// Edits a variable outside gridlet's sections may be from a key and still count as a
/// misspelling of it: one per eight characters, at least one, at most three. Tight, so that
/// other programs' variables (`OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`, five edits from the traces
/// endpoint) are left alone.
fn typo_reach(len: usize) -> usize {
    (len / 8).clamp(1, 3)
}

/// Edits a variable inside one of gridlet's sections may be from a key for that key to be
/// suggested: a third of its length, at least three.
fn suggestion_reach(len: usize) -> usize {
    (len / 3).max(3)
}

/// `name` (normalised: `__` separators, lower case) if it is a misspelled setting. `in_section`:
/// its first part names a section of the table.
pub(super) fn unknown(given: &str, name: &str, in_section: bool) -> Option<UnknownKey> {
    let nearest = closest(name);
    let len = name.chars().count();
    let reach = if in_section {
        suggestion_reach(len)
    } else {
        typo_reach(len)
    };
    let closest = nearest.filter(|(_, d)| *d <= reach).map(|(k, _)| k);
    (in_section || closest.is_some()).then(|| UnknownKey {
        key: given.to_string(),
        closest,
    })
}

/// The key nearest to `name` (normalised) and its distance; the first in table order on a tie.
fn closest(name: &str) -> Option<(Key, usize)> {
    let name: Vec<char> = name.chars().collect();
    Key::ALL
        .iter()
        .map(|k| {
            let canon: Vec<char> = k.name().to_ascii_lowercase().chars().collect();
            (*k, distance(&name, &canon))
        })
        .min_by_key(|(_, d)| *d)
}

/// Optimal string alignment distance between `a` and `b`.
fn distance(a: &[char], b: &[char]) -> usize {
    // Three rows of the classic table: two back (for swaps), the previous, the current.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            cur[j] = d;
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(a: &str, b: &str) -> usize {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        distance(&a, &b)
    }

    #[test]
    fn distance_counts_each_edit_once() {
        assert_eq!(d("", ""), 0);
        assert_eq!(d("abc", ""), 3);
        assert_eq!(d("", "ab"), 2);
        assert_eq!(d("kitten", "sitting"), 3);
        assert_eq!(d("attempts", "atempts"), 1);
        assert_eq!(d("endpoint", "endpiont"), 1, "a swap is one edit");
        assert_eq!(d("tlspolicies", "tlspolicy"), 3);
    }

    fn check(given: &str) -> Option<UnknownKey> {
        let name = given.replace(':', "__").to_ascii_lowercase();
        let in_section = name.split_once("__").is_some_and(|(s, _)| {
            Key::ALL
                .iter()
                .any(|k| k.name().to_ascii_lowercase().starts_with(&format!("{s}__")))
        });
        unknown(given, &name, in_section)
    }

    #[test]
    fn misspellings_name_the_key_they_meant() {
        for (given, meant) in [
            (
                "inbound__serverAuth__tlsPolicies",
                Key::inbound__serverAuth__tlsPolicy,
            ),
            (
                "INBOUND:SERVERAUTH:TLSPOLCY",
                Key::inbound__serverAuth__tlsPolicy,
            ),
            (
                "inbund__serverAuth__tlsPolicy",
                Key::inbound__serverAuth__tlsPolicy,
            ),
            (
                "inbound_serverAuth_tlsPolicy",
                Key::inbound__serverAuth__tlsPolicy,
            ),
            (
                "broker__defaultMaxDeliveryAtempts",
                Key::broker__defaultMaxDeliveryAttempts,
            ),
            (
                "OTEL_EXPORTER_OTLP_ENDPIONT",
                Key::OTEL_EXPORTER_OTLP_ENDPOINT,
            ),
        ] {
            let u = check(given).unwrap_or_else(|| panic!("{given} passed as not a setting"));
            assert_eq!(u.closest, Some(meant), "{given}");
            assert_eq!(u.key, given);
            assert!(u.to_string().contains(meant.name()), "{u}");
        }
    }

    #[test]
    fn other_programs_variables_are_left_alone_and_far_ones_get_no_suggestion() {
        for other in [
            "PATH",
            "HOME",
            "RUST_LOG",
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "OTEL_TRACES_EXPORTER",
            "OTEL_LOGS_EXPORTER",
            "SUBSCRIBER_PORT",
        ] {
            assert_eq!(check(other), None, "{other}");
        }
        let far = check("broker__somethingElseEntirely").expect("in a known section");
        assert_eq!(far.closest, None);
        assert!(far.to_string().contains("no setting"), "{far}");
    }
}
