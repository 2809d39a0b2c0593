//! The one-pass path of publish parsing: an event's top-level members read straight from its
//! text (already validated by serde_json), without building a `Value`. Whatever [`fast`]
//! accepts, the full parse in the parent module accepts with the same body, id, subject and
//! type; anything unusual is left to the full parse (`None`).

use super::*;

/// The top-level string fields the schemas read, in the order [`fast`] destructures them.
const EVENT_GRID_FIELDS: &[&str] = &[
    "id",
    "subject",
    "eventType",
    "eventTime",
    "dataVersion",
    "topic",
    "metadataVersion",
];
const CUSTOM_FIELDS: &[&str] = &["id", "subject", "eventType"];
const CLOUD_EVENT_FIELDS: &[&str] = &["id", "subject", "type", "source", "specversion"];
const MAX_FIELDS: usize = 7;
/// Top-level members the pass compares for repeats; an event with more takes the full parse.
const MAX_MEMBERS: usize = 32;

/// Validate and describe one event from a single borrowed pass over its top-level object (a scan
/// of text serde_json has already validated; `data` and every other member are skipped, not
/// built). `None` when the event needs the full
/// parse: it is not a well-formed object of the schema, or it has something the borrowed pass
/// leaves to the full parse (escapes, deep nesting, nulls, duplicate keys, keys in another
/// case, non-string values for the fields above). Whatever this accepts, the full parse accepts
/// with the same body, id, subject and type.
pub(super) fn fast(input: &PublishInput<'_>, raw: &RawValue) -> Option<IncomingEvent> {
    let text = raw.get();
    if !simple_text(text.as_bytes()) {
        return None;
    }
    let names = match input.schema {
        EventSchema::EventGrid => EVENT_GRID_FIELDS,
        EventSchema::Custom => CUSTOM_FIELDS,
        EventSchema::CloudEventV1_0 => CLOUD_EVENT_FIELDS,
    };
    let fields = top_level(text, names)?;
    let source = sub_bytes(input.body, text);
    let range = |v: Option<&str>| {
        v.and_then(|v| {
            let start = (v.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
            Some((start, start + v.len()))
        })
    };
    let (id, body, subject, event_type) = match (input.schema, fields) {
        (
            EventSchema::EventGrid,
            [Some(id), subject @ Some(_), event_type @ Some(_), Some(_), Some(_), topic, mv, ..],
        ) => {
            let topic_present = match topic {
                None => false,
                Some(t) if t.eq_ignore_ascii_case(input.topic) => true,
                Some(_) => return None,
            };
            let mv_present = match mv {
                None => false,
                Some("1") => true,
                Some(_) => return None,
            };
            let body = if topic_present && mv_present {
                Bytes::copy_from_slice(text.as_bytes())
            } else {
                splice(text, (!topic_present).then_some(input.topic), !mv_present).ok()?
            };
            (id, body, subject, event_type)
        }
        (EventSchema::Custom, [id, subject, event_type, ..]) => (
            id.unwrap_or_default(),
            Bytes::copy_from_slice(text.as_bytes()),
            subject,
            event_type,
        ),
        (
            EventSchema::CloudEventV1_0,
            [Some(id), subject, event_type @ Some(_), Some(_), Some("1.0"), ..],
        ) if !id.is_empty() => (
            id,
            Bytes::copy_from_slice(text.as_bytes()),
            subject,
            event_type,
        ),
        _ => return None,
    };
    Some(IncomingEvent {
        body,
        id: id.to_string(),
        keys: ViewKeys::Text {
            subject: range(subject),
            event_type: range(event_type),
        },
        object: LazyObject::from_json(source),
        trace: None,
    })
}

/// No backslash (so every string ends at the next `"`, and no `\u` surrogate that the full parse
/// rejects goes unchecked) and well below the full parse's nesting limit (128).
fn simple_text(text: &[u8]) -> bool {
    let mut opened = 0;
    for i in memchr::memchr3_iter(b'\\', b'{', b'[', text) {
        opened += 1;
        if text.get(i) == Some(&b'\\') || opened >= 100 {
            return false;
        }
    }
    true
}

/// `part` (a slice of `whole`) as a `Bytes` sharing `whole`'s buffer.
fn sub_bytes(whole: &Bytes, part: &str) -> Bytes {
    let start = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
    match start.checked_add(part.len()) {
        Some(end) if end <= whole.len() => whole.slice(start..end),
        _ => Bytes::copy_from_slice(part.as_bytes()),
    }
}

/// Read the members named in `names` (exact case, string values, each at most once) of the JSON
/// object `text` into the matching slots of the result, skipping all other members. `text` must
/// be one JSON value that serde_json has already accepted and that holds no backslash (so every
/// string ends at the next `"`); `None` when it is not an object or a member is not as above,
/// or when two keys are equal in any case (the full parse refuses those, naming the key), a key
/// is not ASCII (case folding left to the full parse) or there are more than [`MAX_MEMBERS`].
fn top_level<'a>(text: &'a str, names: &[&str]) -> Option<[Option<&'a str>; MAX_FIELDS]> {
    let b = text.as_bytes();
    let mut out = [None; MAX_FIELDS];
    let mut seen: [&str; MAX_MEMBERS] = [""; MAX_MEMBERS];
    let mut n_seen = 0;
    let mut bloom = 0u64;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(out);
    }
    loop {
        let (key, next) = string_at(text, i)?;
        // Repeats in any case: a 64-bit filter on (length, first byte folded) sends only
        // likely repeats to the comparisons, so a typical event pays a few instructions a key.
        let bit = fold_bit(key);
        if bloom & bit != 0 && seen[..n_seen].iter().any(|k| k.eq_ignore_ascii_case(key)) {
            return None;
        }
        // Not `str::is_ascii`: on keys this short its setup cost ~1,000 instructions an event.
        if n_seen == MAX_MEMBERS || key.bytes().fold(0, |a, b| a | b) >= 0x80 {
            return None;
        }
        bloom |= bit;
        seen[n_seen] = key;
        n_seen += 1;
        i = skip_ws(b, next);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let slot = names
            .iter()
            .zip(out.iter_mut())
            .find(|(n, _)| n.eq_ignore_ascii_case(key));
        i = match slot {
            // An object's keys are compared too, at every depth (as filters read them).
            None if b.get(i) == Some(&b'{') => unique_object(text, i)?,
            None => skip_value(b, i)?,
            Some((name, slot)) => {
                if *name != key || slot.is_some() {
                    return None;
                }
                let (value, next) = string_at(text, i)?;
                *slot = Some(value);
                next
            }
        };
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(out),
            _ => return None,
        }
    }
}

/// The index after the object starting at `i`, when no two of its keys are equal in any case,
/// nor those of any object under its members (objects inside arrays are skipped, as filters do
/// not name them). `None` for a repeat (the full parse refuses it, naming the path), a key that
/// is not ASCII (case folding left to the full parse), or anything unexpected.
fn unique_object(text: &str, mut i: usize) -> Option<usize> {
    let b = text.as_bytes();
    let mut keys = Keys::default();
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        let (key, next) = string_at(text, i)?;
        if !keys.insert(key) {
            return None;
        }
        i = skip_ws(b, next);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        i = if b.get(i) == Some(&b'{') {
            unique_object(text, i)?
        } else {
            skip_value(b, i)?
        };
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return keys.unique().then_some(i + 1),
            _ => return None,
        }
    }
}

/// An object's keys, checked for repeats in any ASCII case: the first [`MAX_MEMBERS`] through
/// the 64-bit filter as they come, the rest (an object with many members) sorted once at the
/// end.
#[derive(Default)]
struct Keys<'a> {
    seen: [&'a str; MAX_MEMBERS],
    n: usize,
    bloom: u64,
    more: Vec<&'a str>,
}

impl<'a> Keys<'a> {
    /// Add `key`; `false` when it repeats one of the first keys or is not ASCII.
    fn insert(&mut self, key: &'a str) -> bool {
        if key.bytes().fold(0, |a, b| a | b) >= 0x80 {
            return false;
        }
        if self.n < MAX_MEMBERS {
            let bit = fold_bit(key);
            if self.bloom & bit != 0
                && self.seen[..self.n]
                    .iter()
                    .any(|k| k.eq_ignore_ascii_case(key))
            {
                return false;
            }
            self.bloom |= bit;
            self.seen[self.n] = key;
            self.n += 1;
        } else {
            self.more.push(key);
        }
        true
    }

    /// No repeats among all the keys (only objects with more than [`MAX_MEMBERS`] have work
    /// left here).
    fn unique(mut self) -> bool {
        if self.more.is_empty() {
            return true;
        }
        self.more.extend_from_slice(&self.seen);
        fn lower(k: &str) -> impl Iterator<Item = u8> + '_ {
            k.bytes().map(|c| c.to_ascii_lowercase())
        }
        self.more.sort_unstable_by(|a, b| lower(a).cmp(lower(b)));
        !self
            .more
            .windows(2)
            .any(|w| w[0].eq_ignore_ascii_case(w[1]))
    }
}

/// One bit of 64 from a key's length and first byte, the same for every ASCII case of the key.
fn fold_bit(key: &str) -> u64 {
    let first = key.as_bytes().first().map_or(0, |b| b | 0x20);
    1u64 << ((key.len() as u32)
        .wrapping_mul(5)
        .wrapping_add(u32::from(first))
        & 63)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The string starting with the `"` at `i` (without quotes) and the index after its closing
/// quote.
fn string_at(text: &str, i: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let start = i + 1;
    let len = memchr::memchr(b'"', b.get(start..)?)?;
    Some((text.get(start..start + len)?, start + len + 1))
}

/// The index after the value starting at `i`.
fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    loop {
        match b.get(i) {
            Some(b'"') => {
                i += 1;
                i += memchr::memchr(b'"', b.get(i..)?)? + 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            Some(b'{' | b'[') => {
                depth += 1;
                i += 1;
            }
            Some(b'}' | b']') => {
                // At depth 0 this closes the enclosing object: the (scalar) value ended before.
                if depth == 0 {
                    return Some(i);
                }
                depth -= 1;
                i += 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            Some(b',') if depth == 0 => return Some(i),
            Some(b' ' | b'\t' | b'\n' | b'\r') if depth == 0 => return Some(i),
            Some(_) => i += 1,
            None => return (depth == 0).then_some(i),
        }
    }
}
