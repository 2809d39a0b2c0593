//! Keys repeated in any case within one object of an event, at any depth reached through
//! object members (what filters and delivery attributes can name): the full parse's check
//! ([`super::unique_keys`], binary mode's `data`).

/// Two keys of one object equal in any case: their paths (dotted, from the event's top level).
#[derive(Debug)]
pub(super) struct Repeated {
    /// The first one given.
    pub earlier: String,
    /// The one that repeats it.
    pub later: String,
    /// Below the top level.
    pub nested: bool,
}

/// The first key of JSON `text` (a value) repeated in any case within one object, at any depth
/// reached through object members, with paths under `prefix`.
pub(super) fn repeated_key_under(
    text: &str,
    prefix: &str,
) -> Result<Option<Repeated>, serde_json::Error> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    struct Seed<'p> {
        path: &'p str,
        found: &'p mut Option<Repeated>,
    }
    impl<'de> DeserializeSeed<'de> for Seed<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Seed<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashMap::<String, String>::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let path = if self.path.is_empty() {
                    key.to_string()
                } else {
                    format!("{}.{key}", self.path)
                };
                if self.found.is_some() {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                map.next_value_seed(Seed {
                    path: &path,
                    found: &mut *self.found,
                })?;
                if self.found.is_some() {
                    continue;
                }
                match seen.entry(fold(&key)) {
                    std::collections::hash_map::Entry::Occupied(e) => {
                        *self.found = Some(Repeated {
                            earlier: e.get().clone(),
                            later: path,
                            nested: !self.path.is_empty(),
                        })
                    }
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(path);
                    }
                }
            }
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            // Filters do not name members of objects inside arrays.
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    fn fold(key: &str) -> String {
        if key.is_ascii() {
            key.to_ascii_lowercase()
        } else {
            key.to_uppercase().to_lowercase()
        }
    }
    let mut found = None;
    let mut de = serde_json::Deserializer::from_str(text);
    Seed {
        path: prefix,
        found: &mut found,
    }
    .deserialize(&mut de)?;
    Ok(found)
}
