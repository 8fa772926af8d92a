//! digest: API keys known by their digests, so that nothing quotagate keeps or writes holds a key.
//!
//! A catalog entry names its caller by `key` (the key itself, as DynLimits does) or by `key_digest`:
//! `sha256:<64 hex>` (SHA-256 of the key's bytes) or `hmac-sha256:<64 hex>` (HMAC-SHA256 under the
//! gateway's key secret, for keys short enough that a SHA-256 could be searched). Either way the key
//! table holds only digests: a plain `key` is held as its SHA-256, so that it and its `sha256:`
//! form are one caller with one set of counters. A request's key is digested to be looked up
//! ([`Digests`]), and its counters are named by a [`KeyId`] taken from the digest it was found by.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::{KeyInit, Mac};
use sha2::{Digest as _, Sha256};

/// A digest's form in a catalog: `sha256:` or `hmac-sha256:`, then 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    Sha256,
    HmacSha256,
}

impl Form {
    pub fn prefix(self) -> &'static str {
        match self {
            Form::Sha256 => "sha256:",
            Form::HmacSha256 => "hmac-sha256:",
        }
    }
}

/// 32 bytes that stand for an API key: its SHA-256, or its HMAC-SHA256 under a key secret.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyDigest(pub [u8; 32]);

impl KeyDigest {
    /// The SHA-256 of `key`'s bytes.
    pub fn sha256(key: &[u8]) -> KeyDigest {
        KeyDigest(Sha256::digest(key).into())
    }

    /// Reads `sha256:<hex>` or `hmac-sha256:<hex>` (64 lowercase hex digits); the `Err` says
    /// what is wrong with it, for a problem located at the entry's `key_digest`.
    pub fn parse(s: &str) -> Result<(Form, KeyDigest), String> {
        let (form, hex) = if let Some(hex) = s.strip_prefix(Form::Sha256.prefix()) {
            (Form::Sha256, hex)
        } else if let Some(hex) = s.strip_prefix(Form::HmacSha256.prefix()) {
            (Form::HmacSha256, hex)
        } else {
            return Err(format!(
                "{s:?} is not a key digest: expected sha256:<64 hex digits> or \
                 hmac-sha256:<64 hex digits> (quotagate key-digest prints them)"
            ));
        };
        let digits = hex.as_bytes();
        let lower_hex = |c: &u8| c.is_ascii_digit() || (b'a'..=b'f').contains(c);
        if digits.len() != 64 || !digits.iter().all(lower_hex) {
            return Err(format!(
                "{s:?} is not a key digest: after {:?} come exactly 64 lowercase hex digits \
                 (it has {} characters)",
                form.prefix(),
                hex.chars().count()
            ));
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            *o = nibble(pair[0]) << 4 | nibble(pair[1]);
        }
        Ok((form, KeyDigest(out)))
    }

    /// `<prefix><64 hex>`, as a catalog writes it.
    pub fn display(&self, form: Form) -> String {
        let mut s = String::with_capacity(form.prefix().len() + 64);
        s.push_str(form.prefix());
        for b in self.0 {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 15)]));
        }
        s
    }

    /// The identifier its counters are named by.
    pub fn id(&self) -> KeyId {
        let mut id = [0u8; 16];
        id.copy_from_slice(&self.0[..16]);
        KeyId(id)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        _ => c - b'a' + 10,
    }
}

/// What a key's counters are named by in any store: the first 128 bits of the digest the catalog
/// knows it by (a plain `key`'s SHA-256), never the key. 128 bits: two keys of a catalog share
/// counters only if two of its digests agree in their first half, which no catalog of fewer than
/// 2^50 keys is expected to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; 16]);

impl KeyId {
    /// 32 lowercase hex digits.
    pub fn hex(&self) -> [u8; 32] {
        // A byte's two digits at once: every counted request names its counters by these.
        const PAIRS: [[u8; 2]; 256] = {
            let mut pairs = [[0u8; 2]; 256];
            let mut b = 0;
            while b < 256 {
                pairs[b] = [HEX[b >> 4], HEX[b & 15]];
                b += 1;
            }
            pairs
        };
        let mut out = [0u8; 32];
        for (o, b) in out.chunks_exact_mut(2).zip(self.0) {
            o.copy_from_slice(&PAIRS[usize::from(b)]);
        }
        out
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&self.hex()).unwrap_or_default())
    }
}

/// The gateway's key secrets (`catalog.key_secret_file`): the current one, and while keys are
/// rotated the previous one, each kept as HMAC-SHA256's keyed state (its pads hashed once).
#[derive(Clone)]
pub struct KeySecrets {
    secrets: Vec<hmac::Hmac<Sha256>>,
    /// Told apart from every other set made by this process (see [`Digests`]).
    generation: u64,
}

impl std::fmt::Debug for KeySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySecrets({} secrets, ***)", self.secrets.len())
    }
}

impl KeySecrets {
    /// The secrets of a key secret file: its first line is the current secret, a second line
    /// the previous one; each line's bytes (without its line ending) are the secret. The `Err`
    /// says what is wrong, never a secret's bytes.
    pub fn from_file_text(text: &[u8]) -> Result<Arc<KeySecrets>, String> {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        let lines: Vec<&[u8]> = text
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .collect();
        match lines.as_slice() {
            [cur] | [cur, _] if cur.is_empty() => {
                Err("its first line (the secret) is empty".into())
            }
            [_, []] => Err("its second line (the previous secret) is empty".into()),
            [_] | [_, _] => {
                static GENERATIONS: AtomicU64 = AtomicU64::new(1);
                let secrets = lines
                    .iter()
                    .map(|s| hmac::Hmac::<Sha256>::new_from_slice(s))
                    .collect::<Result<_, _>>()
                    .map_err(|_| "a secret cannot key HMAC-SHA256".to_owned())?;
                Ok(Arc::new(KeySecrets {
                    secrets,
                    generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
                }))
            }
            _ => Err(format!(
                "it has {} lines; it holds the secret, and while keys are rotated the previous \
                 one on a second line",
                lines.len()
            )),
        }
    }

    /// No secret, for reading a catalog without matching its keys (`quotagate catalog-server`
    /// serves catalogs whose secrets only the gateways hold): `hmac-sha256` digests are then
    /// accepted as well-formed and never match a key, and a `key` and its HMAC cannot be told
    /// to be one key.
    pub fn unknown() -> Arc<KeySecrets> {
        Arc::new(KeySecrets {
            secrets: Vec::new(),
            generation: 0,
        })
    }

    /// How many secrets (1, or 2 while keys are rotated).
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `key`'s HMAC-SHA256 under secret `i` (0: the current one).
    pub fn hmac(&self, i: usize, key: &[u8]) -> Option<KeyDigest> {
        let mut mac = self.secrets.get(i)?.clone();
        mac.update(key);
        Some(KeyDigest(mac.finalize().into_bytes().into()))
    }
}

/// Most digests a key is looked up by: its SHA-256, then its HMAC under each secret.
pub const MAX_DIGESTS: usize = 3;

/// The digests a presented key is looked up by, in order: its SHA-256, then (when `secrets` is
/// given) its HMAC under each secret.
///
/// Remembered per thread for the last keys seen (a direct-mapped memo of [`MEMO_WAYS`] keys of
/// up to [`MEMO_KEY_BYTES`] bytes, each used only for the very same key bytes and secrets): a
/// digest costs more than the rest of a lookup (a SHA-256 is ~1,900 instructions in software,
/// an HMAC twice that; docs/architecture.md), and callers come back. A longer key, or one that
/// pushes another out, is digested again: the memo changes the cost, never the answer (a test
/// holds the two paths equal).
pub fn digests(key: &[u8], secrets: Option<&KeySecrets>) -> Digests {
    if key.len() > MEMO_KEY_BYTES {
        return Digests::compute(key, secrets);
    }
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        let way = &mut memo[way_of(key)];
        let generation = secrets.map_or(0, |s| s.generation);
        if way.len as usize != key.len()
            || &way.key[..key.len()] != key
            || way.generation != generation
        {
            way.digests = Digests::compute(key, secrets);
            way.key[..key.len()].copy_from_slice(key);
            way.len = key.len() as u8;
            way.generation = generation;
        }
        way.digests
    })
}

/// Keys remembered per thread ([`digests`]).
pub const MEMO_WAYS: usize = 64;
/// The longest key remembered: API keys are mostly 20 to 64 bytes.
pub const MEMO_KEY_BYTES: usize = 64;

struct Way {
    key: [u8; MEMO_KEY_BYTES],
    len: u8,
    generation: u64,
    digests: Digests,
}

thread_local! {
    // 64 ways of ~180 bytes: ~11 KiB a thread that looks keys up.
    static MEMO: std::cell::RefCell<Box<[Way; MEMO_WAYS]>> = std::cell::RefCell::new(Box::new(
        std::array::from_fn(|_| Way {
            key: [0; MEMO_KEY_BYTES],
            // No key is this long, so no way starts out matching one.
            len: u8::MAX,
            generation: 0,
            digests: Digests::default(),
        }),
    ));
}

/// A way by the key's length and its last 8 bytes: keys are mostly random, and keys chosen to
/// share a way only cost the digests the memo would have saved.
fn way_of(key: &[u8]) -> usize {
    let mut tail = [0u8; 8];
    let n = key.len().min(8);
    tail[..n].copy_from_slice(&key[key.len() - n..]);
    let mixed = (u64::from_le_bytes(tail) ^ key.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 58) as usize % MEMO_WAYS
}

/// A key's digests ([`digests`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    all: [KeyDigest; MAX_DIGESTS],
    len: u8,
}

impl Digests {
    /// [`digests`] without the memo.
    pub fn compute(key: &[u8], secrets: Option<&KeySecrets>) -> Digests {
        let mut out = Digests::default();
        out.all[0] = KeyDigest::sha256(key);
        out.len = 1;
        for i in 0..secrets.map_or(0, |s| s.len().min(MAX_DIGESTS - 1)) {
            if let Some(d) = secrets.and_then(|s| s.hmac(i, key)) {
                out.all[usize::from(out.len)] = d;
                out.len += 1;
            }
        }
        out
    }

    pub fn as_slice(&self) -> &[KeyDigest] {
        &self.all[..usize::from(self.len)]
    }

    /// The key's SHA-256 (always the first).
    pub fn sha256(&self) -> KeyDigest {
        self.all[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &KeyDigest) -> String {
        d.display(Form::Sha256)["sha256:".len()..].to_owned()
    }

    #[test]
    fn sha256_matches_nist_vectors() {
        // FIPS 180-2 examples (NIST CSRC): "abc", the empty string, and the 448-bit message.
        assert_eq!(
            hex(&KeyDigest::sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&KeyDigest::sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&KeyDigest::sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let s = KeySecrets::from_file_text(b"Jefe\n").unwrap();
        assert_eq!(
            hex(&s.hmac(0, b"what do ya want for nothing?").unwrap()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 1: key 0x0b x 20, data "Hi There".
        let s = KeySecrets::from_file_text(&[0x0b; 20]).unwrap();
        assert_eq!(
            hex(&s.hmac(0, b"Hi There").unwrap()),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
    }

    #[test]
    fn digests_parse_in_their_one_form_and_print_back() {
        let d = KeyDigest::sha256(b"abc");
        let written = d.display(Form::Sha256);
        assert_eq!(KeyDigest::parse(&written).unwrap(), (Form::Sha256, d));
        let h = d.display(Form::HmacSha256);
        assert_eq!(KeyDigest::parse(&h).unwrap(), (Form::HmacSha256, d));
        for bad in [
            "",
            "abc",
            "sha256:",
            "sha1:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "SHA256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a",
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015adf",
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015aé",
            " sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ] {
            assert!(KeyDigest::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            String::from_utf8(d.id().hex().to_vec()).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223"
        );
    }

    #[test]
    fn secret_files_hold_one_or_two_secrets() {
        let one = KeySecrets::from_file_text(b"s3cret\n").unwrap();
        assert_eq!(one.len(), 1);
        let two = KeySecrets::from_file_text(b"new\r\nold").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(
            two.hmac(1, b"k"),
            KeySecrets::from_file_text(b"old").unwrap().hmac(0, b"k")
        );
        for bad in [&b""[..], b"\n", b"\nS0LD", b"SN3W\n\n", b"SN3W\nS0LD\nSX"] {
            let e = KeySecrets::from_file_text(bad).unwrap_err();
            assert!(!e.contains("SN3W") && !e.contains("S0LD"), "{e}");
        }
        assert!(!format!("{one:?}").contains("s3cret"));
    }

    #[test]
    fn the_memo_answers_as_the_digests_themselves() {
        let a = KeySecrets::from_file_text(b"a\nb").unwrap();
        let b = KeySecrets::from_file_text(b"a").unwrap();
        let long = vec![b'x'; MEMO_KEY_BYTES + 1];
        // Enough keys to push each other out of every way, each asked several times and under
        // each set of secrets.
        let keys: Vec<Vec<u8>> = (0..MEMO_WAYS * 3)
            .map(|i| format!("key-{i}").into_bytes())
            .chain([long, b"".to_vec(), vec![0; MEMO_KEY_BYTES]])
            .collect();
        for _ in 0..3 {
            for key in &keys {
                for secrets in [None, Some(&*a), Some(&*b)] {
                    assert_eq!(
                        digests(key, secrets),
                        Digests::compute(key, secrets),
                        "{key:?}"
                    );
                }
            }
        }
        assert_eq!(digests(b"k", Some(&a)).as_slice().len(), 3);
        assert_eq!(digests(b"k", None).as_slice().len(), 1);
    }
}
