//! read: a document's keys read one at a time, for catalogs of millions of keys.
//!
//! Parsed whole, a key's limits take about a kilobyte as [`ApiLimits`] values before they are
//! checked and shrunk to a key table entry of about 60 bytes: a million keys peaked at 1.1 GB
//! for 0.1 GB kept. So a catalog (or a diff) is read twice: first everything but `apilimits`,
//! which is only counted ([`Counted`]), then `apilimits` alone ([`each_key`]), each entry handed
//! over as soon as it is read and dropped after. Each pass reports the unknown fields of its own
//! part. A diff is read in one pass as it arrives ([`read_diff`]), so that not even its bytes are
//! held whole.

use std::fmt;

use serde::de::{Deserialize, Visitor};
use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess};

use super::digest::KeyDigest;
use super::doc::{UnknownFields, parse_doc};
use super::keys::Named;
use super::{ApiLimits, CatalogDoc, CatalogError, CatalogVersion, Problem};

/// `apilimits` in the first pass: how many entries it has, each skipped unread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted(pub usize);

impl<'de> Deserialize<'de> for Counted {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Counted, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = Counted;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of API keys' limits")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Counted, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Counted(n))
            }
        }
        d.deserialize_seq(Count)
    }
}

impl CatalogDoc<Counted> {
    /// The first pass over a document (see [`Counted`]): everything but its keys, which are
    /// counted; the fields it does not know outside `apilimits` go to `unknown`. A document that
    /// does not parse is reported as [`CatalogDoc::parse_reporting`] reports it.
    pub fn parse_head(
        source: &str,
        json: &[u8],
        unknown: &mut UnknownFields,
    ) -> Result<CatalogDoc<Counted>, CatalogError> {
        parse_doc(source, json, unknown, |p| !in_keys(p)).map_err(|head| {
            // Entries are skipped unread here: only a whole read locates a problem within one.
            match CatalogDoc::parse_reporting(source, json) {
                Err(whole) => whole,
                Ok(_) => head,
            }
        })
    }
}

/// Whether `path` is within the document's `apilimits`.
pub(super) fn in_keys(path: &serde_ignored::Path) -> bool {
    use serde_ignored::Path;
    let mut top = None;
    let mut at = path;
    loop {
        at = match at {
            Path::Root => return top == Some("apilimits"),
            Path::Map { parent, key } => {
                top = Some(key.as_str());
                parent
            }
            Path::Seq { parent, .. }
            | Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => parent,
        }
    }
}

/// Reads the `apilimits` of `json` (a catalog or a diff, already read once whole by
/// [`Counted`]'s pass) and hands each entry to `each` with its index, in order, until `each`
/// returns false. With `unknown`, the fields an entry has that quotagate does not know are noted
/// there. `false`: `each` stopped, or an entry did not parse (a whole read then says where).
pub fn each_key(
    json: &[u8],
    unknown: Option<&mut UnknownFields>,
    mut each: impl FnMut(usize, ApiLimits) -> bool,
) -> bool {
    let mut de = serde_json::Deserializer::from_slice(json);
    let read = match unknown {
        Some(unknown) => Document(&mut each).deserialize(serde_ignored::Deserializer::new(
            &mut de,
            &mut |path: serde_ignored::Path| {
                if in_keys(&path) {
                    unknown.note(&path);
                }
            },
        )),
        None => Document(&mut each).deserialize(&mut de),
    };
    read.is_ok()
}

/// The document, of which only `apilimits` is read.
struct Document<'a, F>(&'a mut F);

impl<'de, F: FnMut(usize, ApiLimits) -> bool> DeserializeSeed<'de> for Document<'_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(usize, ApiLimits) -> bool> Visitor<'de> for Document<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a catalog document")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(field) = map.next_key::<String>()? {
            if field == "apilimits" {
                map.next_value_seed(Entries(&mut *self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// `apilimits`, each entry handed over as it is read.
struct Entries<'a, F>(&'a mut F);

impl<'de, F: FnMut(usize, ApiLimits) -> bool> DeserializeSeed<'de> for Entries<'_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(usize, ApiLimits) -> bool> Visitor<'de> for Entries<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of API keys' limits")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut k = 0;
        while let Some(entry) = seq.next_element::<ApiLimits>()? {
            if !(self.0)(k, entry) {
                return Err(A::Error::custom("stopped"));
            }
            k += 1;
        }
        Ok(())
    }
}

/// What a diff read by [`read_diff`] does with its keys, as they are read.
pub(super) trait DiffSink {
    /// `apilimits[k]`.
    fn set(&mut self, k: usize, entry: ApiLimits);
    /// One of `removed_keys` or `removed_key_digests`, named as the diff names it.
    fn remove(&mut self, key: Named);
}

/// Reads the diff `json` (the answer's body as it arrives) in one pass, handing its keys to
/// `sink` in the order they are written, and returns its `from` and `version`. A diff that does
/// not parse is one problem, located at the JSON path of the value at fault.
pub(super) fn read_diff(
    json: impl std::io::Read,
    sink: &mut impl DiffSink,
) -> Result<(String, CatalogVersion), Problem> {
    let mut de =
        serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(64 << 10, json));
    let mut track = serde_path_to_error::Track::new();
    let read = Diff { sink }
        .deserialize(serde_path_to_error::Deserializer::new(&mut de, &mut track))
        .and_then(|head| de.end().map(|()| head));
    read.map_err(|e| {
        let at = track.path().to_string();
        let at = at.trim_end_matches(".?").trim_end_matches('?');
        Problem {
            at: if at == "." {
                String::new()
            } else {
                at.to_owned()
            },
            reason: format!("not a valid catalog diff: {e}"),
        }
    })
}

/// A diff, its keys handed to a sink.
struct Diff<'a, S> {
    sink: &'a mut S,
}

impl<'de, S: DiffSink> DeserializeSeed<'de> for Diff<'_, S> {
    type Value = (String, CatalogVersion);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, S: DiffSink> Visitor<'de> for Diff<'_, S> {
    type Value = (String, CatalogVersion);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a catalog diff")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut from, mut version) = (None, None);
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "from" => from = Some(map.next_value::<String>()?),
                "version" => version = Some(map.next_value::<CatalogVersion>()?),
                "apilimits" => map.next_value_seed(Entries(&mut |k, entry| {
                    self.sink.set(k, entry);
                    true
                }))?,
                "removed_keys" => map.next_value_seed(Removed(&mut *self.sink, false))?,
                "removed_key_digests" => map.next_value_seed(Removed(&mut *self.sink, true))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((
            from.ok_or_else(|| A::Error::missing_field("from"))?,
            version.ok_or_else(|| A::Error::missing_field("version"))?,
        ))
    }
}

/// `removed_keys` (false) or `removed_key_digests` (true), each handed over as it is read.
struct Removed<'a, S>(&'a mut S, bool);

impl<'de, S: DiffSink> DeserializeSeed<'de> for Removed<'_, S> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, S: DiffSink> Visitor<'de> for Removed<'_, S> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self.1 {
            false => "an array of API keys",
            true => "an array of key digests",
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(key) = seq.next_element::<std::borrow::Cow<'de, str>>()? {
            match self.1 {
                false => self.0.remove(Named::Plain(key.as_bytes())),
                true => {
                    let digest = KeyDigest::parse(&key).map_err(A::Error::custom)?.1;
                    self.0.remove(Named::Digest(&digest));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pass_counts_keys_and_the_second_hands_them_over_in_order() {
        let json = br#"{"apilimits": [{"key": "a", "limits": []},
            {"key": "b", "limits": [{"ep": 0, "rl": 1, "typo": 2}]}], "methods": ["GET"]}"#;
        #[derive(serde::Deserialize)]
        struct Head {
            apilimits: Counted,
        }
        let head: Head = serde_json::from_slice(json).unwrap();
        assert_eq!(head.apilimits, Counted(2));
        let mut seen = Vec::new();
        let mut unknown = UnknownFields::default();
        assert!(each_key(json, Some(&mut unknown), |k, e| {
            seen.push((k, e.key));
            true
        }));
        assert_eq!(seen, [(0, "a".to_owned()), (1, "b".to_owned())]);
        assert_eq!(unknown.into_list(), ["apilimits[1].limits[0].typo"]);
        assert!(!each_key(json, None, |_, _| false), "stopped at the first");
        assert!(!each_key(
            br#"{"apilimits": [{"key": 1}]}"#,
            None,
            |_, _| true
        ));
    }
}
