//! rewrite: a catalog document with every `key` replaced by its `key_digest`, byte for byte
//! otherwise (`quotagate key-digest --catalog`), so that a catalog kept in version control
//! changes by those lines only.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::digest::{Form, KeyDigest, KeySecrets};

#[derive(Deserialize)]
struct Doc<'a> {
    #[serde(borrow)]
    apilimits: Vec<Entry<'a>>,
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(borrow, default)]
    key: Option<&'a RawValue>,
    #[serde(borrow, default)]
    key_digest: Option<&'a RawValue>,
}

/// `json` with each `apilimits` entry's `"key": "<key>"` written `"key_digest": "<digest>"`:
/// `sha256:`, or with `secrets` `hmac-sha256:` under the first (current) one. Everything else,
/// spacing included, is left as it was. The `Err` says where the document is at fault, never a
/// key.
pub fn digest_keys(json: &[u8], secrets: Option<&KeySecrets>) -> Result<Vec<u8>, String> {
    let doc: Doc = serde_json::from_slice(json).map_err(|e| format!("not a catalog: {e}"))?;
    let mut out = Vec::with_capacity(json.len() + doc.apilimits.len() * 80);
    let mut copied = 0;
    for (k, entry) in doc.apilimits.iter().enumerate() {
        let Some(key) = entry.key else { continue };
        if entry.key_digest.is_some() {
            return Err(format!(
                "apilimits[{k}]: an entry names its key by \"key\" or by \"key_digest\", not both"
            ));
        }
        let Ok(plain) = serde_json::from_str::<String>(key.get()) else {
            return Err(format!("apilimits[{k}].key: not a string"));
        };
        if plain.is_empty() {
            return Err(format!("apilimits[{k}].key: the API key is empty"));
        }
        let digest = match secrets {
            Some(s) => s
                .hmac(0, plain.as_bytes())
                .ok_or("the key secret file holds no secret")?
                .display(Form::HmacSha256),
            None => KeyDigest::sha256(plain.as_bytes()).display(Form::Sha256),
        };
        // The value is a slice of `json`: where it starts, and the field's name before it.
        let at = key.get().as_ptr() as usize - json.as_ptr() as usize;
        let before = json[..at].trim_ascii_end();
        let name = before
            .strip_suffix(b":")
            .map(<[u8]>::trim_ascii_end)
            .filter(|b| b.ends_with(br#""key""#))
            .ok_or_else(|| format!("apilimits[{k}]: the field name \"key\" is written escaped"))?;
        let name_at = name.len() - br#""key""#.len();
        out.extend_from_slice(&json[copied..name_at]);
        out.extend_from_slice(br#""key_digest""#);
        out.extend_from_slice(&json[name.len()..at]);
        out.push(b'"');
        out.extend_from_slice(digest.as_bytes());
        out.push(b'"');
        copied = at + key.get().len();
    }
    out.extend_from_slice(&json[copied..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_digests_and_nothing_else_changes() {
        let json = br#"{"version": {"semver": "v1"},
  "apilimits": [
    {"key" :  "alice", "limits": [{"ep": 0, "rl": 5}]},
    {"key_digest": "sha256:00", "limits": []},
    {"limits": [], "key": "b\u006fb"}
  ],
  "paths": ["/a"], "key": "top-level, left alone"}"#;
        let out = String::from_utf8(digest_keys(json, None).unwrap()).unwrap();
        let alice = KeyDigest::sha256(b"alice").display(Form::Sha256);
        let bob = KeyDigest::sha256(b"bob").display(Form::Sha256);
        let want = format!(
            r#"{{"version": {{"semver": "v1"}},
  "apilimits": [
    {{"key_digest" :  "{alice}", "limits": [{{"ep": 0, "rl": 5}}]}},
    {{"key_digest": "sha256:00", "limits": []}},
    {{"limits": [], "key_digest": "{bob}"}}
  ],
  "paths": ["/a"], "key": "top-level, left alone"}}"#
        );
        assert_eq!(out, want);
        let s = KeySecrets::from_file_text(b"s").unwrap();
        let out = String::from_utf8(digest_keys(json, Some(&s)).unwrap()).unwrap();
        let keyed = s.hmac(0, b"alice").unwrap().display(Form::HmacSha256);
        assert!(
            out.contains(&format!(r#""key_digest" :  "{keyed}""#)),
            "{out}"
        );
        assert!(!out.contains("alice"));
    }

    #[test]
    fn what_cannot_be_rewritten_is_named_without_its_key() {
        for (json, want) in [
            (&br#"{"apilimits": 1}"#[..], "not a catalog"),
            (
                br#"{"apilimits": [{"key": "sekrit", "key_digest": "x"}]}"#,
                "apilimits[0]: an entry names its key",
            ),
            (
                br#"{"apilimits": [{"key": 7}]}"#,
                "apilimits[0].key: not a string",
            ),
            (
                br#"{"apilimits": [{"key": ""}]}"#,
                "apilimits[0].key: the API key is empty",
            ),
            (
                br#"{"apilimits": [{"\u006bey": "sekrit"}]}"#,
                "the field name \"key\" is written escaped",
            ),
        ] {
            let e = digest_keys(json, None).unwrap_err();
            assert!(e.contains(want) && !e.contains("sekrit"), "{e}");
        }
    }
}
