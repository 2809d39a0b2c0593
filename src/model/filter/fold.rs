//! Case-insensitive comparisons of advanced string filters that do not lowercase the event's
//! value once per filter and per subscription (issue 20: a 1 MB string against 100
//! subscriptions × 25 filters lowercased 2.5 GB for one publish).
//!
//! Filter values are lowercased once, at subscription time, char by char ([`lower`]); the
//! event's value is lowercased lazily, char by char, only as far as a comparison reads:
//! `StringIn`/`StringNotIn`, `StringBeginsWith` and `StringEndsWith` read at most as many
//! characters as the filter value has (at most 512). `StringContains` must read the whole value:
//! it is lowercased once per event and shared by every filter and subscription ([`Lowered`]).

use std::cell::RefCell;
use std::rc::Rc;

/// `s` lowercased char by char (the same mapping the comparisons below apply to events).
pub(super) fn lower(s: &str) -> String {
    s.chars().flat_map(char::to_lowercase).collect()
}

fn lowered(s: &str) -> impl Iterator<Item = char> + '_ {
    s.chars().flat_map(char::to_lowercase)
}

/// `s`, lowercased, equals `lower_y` (already lowercased).
pub(super) fn eq(s: &str, lower_y: &str) -> bool {
    lowered(s).eq(lower_y.chars())
}

/// `s`, lowercased, starts with `lower_y`.
pub(super) fn starts_with(s: &str, lower_y: &str) -> bool {
    let mut it = lowered(s);
    lower_y.chars().all(|c| it.next() == Some(c))
}

/// `s`, lowercased, ends with `lower_y`.
pub(super) fn ends_with(s: &str, lower_y: &str) -> bool {
    let mut it = s.chars().rev().flat_map(|c| c.to_lowercase().rev());
    lower_y.chars().rev().all(|c| it.next() == Some(c))
}

/// Most values one event keeps lowercased for `StringContains` (more are lowercased each time).
const MAX_MEMO: usize = 64;

/// The lowercased string values of one event, for `StringContains`: computed once per value
/// however many filters and subscriptions read it. Keyed by the value's address and length,
/// which identify it while the event's object is borrowed by the view that owns this memo.
#[derive(Default)]
pub struct Lowered(RefCell<Vec<(usize, usize, Rc<str>)>>);

impl Lowered {
    /// `s` (a string inside the viewed event) lowercased.
    pub(super) fn get(&self, s: &str) -> Rc<str> {
        let key = (s.as_ptr() as usize, s.len());
        if let Some((_, _, v)) = self.0.borrow().iter().find(|(p, l, _)| (*p, *l) == key) {
            return v.clone();
        }
        let v: Rc<str> = lower(s).into();
        let mut memo = self.0.borrow_mut();
        if memo.len() < MAX_MEMO {
            memo.push((key.0, key.1, v.clone()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_match_lowercasing_the_whole_value() {
        for (s, y) in [
            ("ABC", "abc"),
            ("ABCD", "abc"),
            ("XABC", "abc"),
            ("İstanbul", "i̇stanbul"),
            ("STRASSE", "strasse"),
            ("", ""),
            ("A", ""),
        ] {
            let l = lower(s);
            assert_eq!(eq(s, y), l == y, "{s} {y}");
            assert_eq!(starts_with(s, y), l.starts_with(y), "{s} {y}");
            assert_eq!(ends_with(s, y), l.ends_with(y), "{s} {y}");
        }
        let memo = Lowered::default();
        let s = String::from("HeLLo");
        assert_eq!(&*memo.get(&s), "hello");
        assert!(Rc::ptr_eq(&memo.get(&s), &memo.get(&s)), "computed once");
    }
}
