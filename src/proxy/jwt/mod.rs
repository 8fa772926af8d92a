//! jwt: the `jwt:CLAIM` key source. A Bearer JWT is verified against the gateway's keys (a JWKS,
//! or an HS256 secret) and its claim's string value is the caller's key. Verification is
//! jsonwebtoken's (the signature, the algorithm against the key's type, `iss`, `aud`); `exp` and
//! `nbf` are checked here against the gateway's clock, so that the verified-token memo and the
//! checks agree on time.
//!
//! Pure: [`Keys`] are read from bytes, [`verify`] is given the time; fetching keys is
//! [`source`]'s, remembering verified tokens [`memo`]'s.

pub mod memo;
pub mod source;

use std::sync::Arc;

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// Usable keys of one set at most: a larger set is refused (a key set is a handful of keys; a
/// huge one would make every token without a `kid` cost a verification per key).
pub const MAX_KEYS: usize = 64;

/// One key and the algorithms its type allows.
struct Key {
    kid: Option<String>,
    algs: Vec<Algorithm>,
    key: DecodingKey,
}

/// The keys tokens are verified with.
#[derive(Default)]
pub struct Keys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<_> = self.keys.iter().map(|k| (&k.kid, &k.algs)).collect();
        f.debug_struct("Keys").field("keys", &kids).finish()
    }
}

impl Keys {
    /// A JSON Web Key Set (RFC 7517 §5). Keys this gateway cannot use (another type, curve or
    /// algorithm, `use` other than `sig`, damaged) are left out and named in the second value;
    /// a set with no usable key, or that is not a set, is an error.
    pub fn from_jwks(bytes: &[u8]) -> Result<(Keys, Vec<String>), String> {
        #[derive(serde::Deserialize)]
        struct Set {
            keys: Vec<Value>,
        }
        let set: Set = serde_json::from_slice(bytes)
            .map_err(|e| format!("not a JSON Web Key Set ({{\"keys\": [...]}}): {e}"))?;
        let mut keys = Keys::default();
        let mut skipped = Vec::new();
        for (i, value) in set.keys.into_iter().enumerate() {
            match usable(value) {
                Ok(key) => keys.keys.push(key),
                Err(why) => skipped.push(format!("key {i}: {why}")),
            }
        }
        if keys.keys.is_empty() {
            return Err(match skipped.is_empty() {
                true => "the set has no key".into(),
                false => format!("no usable key ({})", skipped.join("; ")),
            });
        }
        if keys.keys.len() > MAX_KEYS {
            return Err(format!("{} keys: at most {MAX_KEYS}", keys.keys.len()));
        }
        Ok((keys, skipped))
    }

    /// An HS256 secret (`limits.jwt_secret_file`), added to the set.
    pub fn with_secret(mut self, secret: &[u8]) -> Result<Keys, String> {
        // RFC 7518 §3.2: a key of the hash's size at least.
        if secret.len() < 32 {
            return Err(format!(
                "{} bytes: an HS256 secret has 32 at least",
                secret.len()
            ));
        }
        let key = DecodingKey::from_secret(secret).map_err(|e| e.to_string())?;
        self.keys.push(Key {
            kid: None,
            algs: vec![Algorithm::HS256],
            key,
        });
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether a key of this `kid` is in the set.
    pub fn knows(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

/// A JWK as a key, if this gateway can verify with it: RSA (RS256), EC P-256 (ES256), OKP
/// Ed25519 (EdDSA). A key's own `alg` narrows it; `oct` keys are never taken from a set (a
/// secret in a key set is a secret served over HTTP: HS256 only with `limits.jwt_secret_file`).
fn usable(value: Value) -> Result<Key, String> {
    let jwk: Jwk = serde_json::from_value(value).map_err(|e| e.to_string())?;
    if let Some(u) = &jwk.common.public_key_use
        && *u != jsonwebtoken::jwk::PublicKeyUse::Signature
    {
        return Err("its use is not sig".into());
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        AlgorithmParameters::OctetKey(_) => {
            return Err("a secret (oct) key: HS256 only with limits.jwt_secret_file".into());
        }
        _ => return Err("not an RSA, EC P-256 or Ed25519 key".into()),
    };
    let named = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(other) => {
            return Err(format!(
                "its alg {other} is not one this gateway verifies (RS256, ES256, EdDSA)"
            ));
        }
    };
    if named.is_some_and(|named| named != alg) {
        return Err(format!("its alg does not fit its key type ({alg:?})"));
    }
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())?;
    Ok(Key {
        kid: jwk.common.key_id,
        algs: vec![alg],
        key,
    })
}

/// What a token must satisfy beyond its signature, and where its key is.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The claim whose string value is the key: a path into nested objects (`org.id`).
    pub claim: Vec<String>,
    /// Seconds a token is still taken after its `exp`, and before its `nbf`.
    pub leeway_s: u64,
    pub issuer: Option<String>,
    pub audience: Option<String>,
}

impl Rules {
    /// The claim's name as written (`org.id`).
    pub fn claim_name(&self) -> String {
        self.claim.join(".")
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        // Times are checked in `verify`, with the gateway's clock.
        v.validate_exp = false;
        v.validate_nbf = false;
        v.required_spec_claims.clear();
        v.validate_aud = self.audience.is_some();
        // Set, they are required: a token without one is not the issuer's or the audience's.
        if let Some(aud) = &self.audience {
            v.set_audience(&[aud]);
            v.required_spec_claims.insert("aud".into());
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            v.required_spec_claims.insert("iss".into());
        }
        v
    }
}

/// Why a token is not taken: the detail of its 401.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not three base64url parts, or a part that is not JSON.
    Malformed,
    /// `alg: none` (an unsigned token).
    Unsigned,
    /// An algorithm this gateway does not verify, or one its key's type does not allow.
    Algorithm(String),
    /// No key of the set has its `kid` (after a refetch, when one was allowed).
    UnknownKey,
    /// No key is loaded yet (the key set URL has not answered since the start): a 503, the
    /// gateway's failing.
    NoKeys,
    Signature,
    Expired,
    NotYetValid,
    /// No `exp` claim: a token that never expires is not taken.
    NoExpiry,
    Issuer,
    Audience,
    /// The key claim is missing, or not a string, or empty.
    NoClaim,
}

impl Refusal {
    /// The problem detail's sentence.
    pub fn why(&self, claim: &str) -> String {
        match self {
            Refusal::Malformed => "the bearer token is not a JWT".into(),
            Refusal::Unsigned => "the bearer token is not signed (alg none)".into(),
            Refusal::Algorithm(alg) => {
                format!("the bearer token's algorithm {alg} is not accepted for its key")
            }
            Refusal::UnknownKey => "the bearer token is signed by an unknown key".into(),
            Refusal::NoKeys => {
                "the bearer token cannot be checked yet: no signing keys are loaded".into()
            }
            Refusal::Signature => "the bearer token's signature is not valid".into(),
            Refusal::Expired => "the bearer token has expired".into(),
            Refusal::NotYetValid => "the bearer token is not valid yet (nbf)".into(),
            Refusal::NoExpiry => "the bearer token has no exp claim".into(),
            Refusal::Issuer => "the bearer token's issuer is not accepted".into(),
            Refusal::Audience => "the bearer token's audience is not accepted".into(),
            Refusal::NoClaim => format!("the bearer token has no string claim {claim}"),
        }
    }

    /// For the `/status` reasons and logs: one word.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::Unsigned => "unsigned",
            Refusal::Algorithm(_) => "algorithm",
            Refusal::UnknownKey => "unknown_key",
            Refusal::NoKeys => "no_keys",
            Refusal::Signature => "signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::NoExpiry => "no_expiry",
            Refusal::Issuer => "issuer",
            Refusal::Audience => "audience",
            Refusal::NoClaim => "no_claim",
        }
    }
}

/// A token taken: its key, and the second after which it is no longer taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub key: Arc<[u8]>,
    /// `exp` plus the leeway, in seconds since the Unix epoch.
    pub until_s: u64,
}

/// What a request's token gave the `jwt:` source: its key, or why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked(pub Result<Verified, Refusal>);

/// The token's header fields that choose its key.
#[derive(Debug)]
pub struct Head {
    pub alg: String,
    pub kid: Option<String>,
}

/// The header of `token`, read without verifying anything (to choose a key).
pub fn head(token: &[u8]) -> Result<Head, Refusal> {
    let mut parts = token.split(|&b| b == b'.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| Refusal::Malformed)?;
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(Refusal::Malformed);
    };
    let Some(Value::String(alg)) = fields.get("alg") else {
        return Err(Refusal::Malformed);
    };
    if alg.eq_ignore_ascii_case("none") {
        return Err(Refusal::Unsigned);
    }
    let kid = match fields.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(Refusal::Malformed),
    };
    Ok(Head {
        alg: alg.clone(),
        kid,
    })
}

/// Verifies `token` with `keys` under `rules` at `now_s` (seconds since the Unix epoch).
pub fn verify(token: &[u8], keys: &Keys, rules: &Rules, now_s: u64) -> Result<Verified, Refusal> {
    let head = head(token)?;
    let alg: Algorithm = head
        .alg
        .parse()
        .map_err(|_| Refusal::Algorithm(head.alg.clone()))?;
    if keys.is_empty() {
        return Err(Refusal::NoKeys);
    }
    // Its `kid`'s key, or (none named) each key that allows its algorithm.
    let candidates: Vec<&Key> = match &head.kid {
        Some(kid) => {
            let key = keys.keys.iter().find(|k| k.kid.as_deref() == Some(kid));
            key.into_iter().collect()
        }
        None => keys.keys.iter().filter(|k| k.algs.contains(&alg)).collect(),
    };
    let Some(first) = candidates.first() else {
        return Err(match head.kid {
            Some(_) => Refusal::UnknownKey,
            None => Refusal::Algorithm(head.alg),
        });
    };
    if !first.algs.contains(&alg) {
        return Err(Refusal::Algorithm(head.alg));
    }
    let token = std::str::from_utf8(token).map_err(|_| Refusal::Malformed)?;
    let mut refusal = Refusal::Signature;
    for key in &candidates {
        let mut v = rules.validation(alg);
        v.algorithms = key.algs.clone();
        match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &v) {
            Ok(data) => return taken(&data.claims, rules, now_s),
            Err(e) => {
                use jsonwebtoken::errors::ErrorKind as K;
                refusal = match e.kind() {
                    K::InvalidSignature => Refusal::Signature,
                    K::InvalidIssuer => Refusal::Issuer,
                    K::InvalidAudience => Refusal::Audience,
                    K::MissingRequiredClaim(c) if c == "iss" => Refusal::Issuer,
                    K::MissingRequiredClaim(c) if c == "aud" => Refusal::Audience,
                    K::InvalidAlgorithm | K::InvalidAlgorithmName | K::UnsupportedAlgorithm => {
                        Refusal::Algorithm(head.alg.clone())
                    }
                    // A key that cannot verify this token (its type) is the signature's failure.
                    K::InvalidEcdsaKey
                    | K::InvalidEddsaKey
                    | K::InvalidRsaKey(_)
                    | K::InvalidKeyFormat => Refusal::Signature,
                    _ => Refusal::Malformed,
                };
                // Another key may verify it only when the signature was what failed.
                if refusal != Refusal::Signature {
                    return Err(refusal);
                }
            }
        }
    }
    Err(refusal)
}

/// The times and the key claim of a token whose signature, issuer and audience are good.
fn taken(claims: &Map<String, Value>, rules: &Rules, now_s: u64) -> Result<Verified, Refusal> {
    let time = |name: &str| match claims.get(name) {
        None => Ok(None),
        // NumericDate (RFC 7519 §2): seconds, possibly with a fraction.
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|s| *s >= 0.0)
            .map(|s| Some(s as u64))
            .ok_or(Refusal::Malformed),
        Some(_) => Err(Refusal::Malformed),
    };
    let Some(exp) = time("exp")? else {
        return Err(Refusal::NoExpiry);
    };
    let until_s = exp.saturating_add(rules.leeway_s);
    if now_s >= until_s {
        return Err(Refusal::Expired);
    }
    if let Some(nbf) = time("nbf")?
        && now_s.saturating_add(rules.leeway_s) < nbf
    {
        return Err(Refusal::NotYetValid);
    }
    let mut at = claims.get(&rules.claim[0]);
    for step in &rules.claim[1..] {
        at = at.and_then(|v| v.get(step));
    }
    match at {
        Some(Value::String(key)) if !key.is_empty() => Ok(Verified {
            key: Arc::from(key.as_bytes()),
            until_s,
        }),
        _ => Err(Refusal::NoClaim),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const SECRET: &[u8] = b"a secret of thirty-two bytes at least";
    /// A public RSA key (its private half thrown away): a set whose tokens no test can sign.
    const RSA_JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"r1","use":"sig","e":"AQAB","n":"wwS6vxNIdTbWK4iGRsve0UjKcZoP1AB_r78X9KyvXI6dbR2BHcRQBjuqqoNtsKa7Xx-slMfE76RAaXFrIfUSn2RyjQDBGgt22RTiXqOO3uMPjFsfYnc6CGTs3gaC1biCbypknPS4IhnUhZfdsvGUngl0DIVu76u59_761xt0L_RNIfBhC2YNUQPGRD359lE7IP_xTqwFSmr8Vj4QPlSnhuqDpXSC4RcOD51h9GS_fgFmcegwVxHT3GJwmK0WxPhSe_GcPv6e0aaWMwkPGk5tQz_pPETpvtVvdLm4EN20g7JV4TNbMUFlx8xS8H3ntLEGLKHDJ4Ng3MqrTQ5rw_gjDQ"}]}"#;
    const NOW: u64 = 1_800_000_000;

    fn rules() -> Rules {
        Rules {
            claim: vec!["sub".into()],
            leeway_s: 30,
            issuer: None,
            audience: None,
        }
    }

    fn hs(claims: Value) -> String {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap()
    }

    fn keys() -> Keys {
        Keys::default().with_secret(SECRET).unwrap()
    }

    fn check(token: &str, rules: &Rules) -> Result<String, Refusal> {
        verify(token.as_bytes(), &keys(), rules, NOW)
            .map(|v| String::from_utf8(v.key.to_vec()).unwrap())
    }

    #[test]
    fn a_good_token_gives_its_claim_until_exp_and_the_leeway() {
        let r = rules();
        let t = hs(json!({"sub": "k1", "exp": NOW + 60}));
        assert_eq!(check(&t, &r), Ok("k1".into()));
        let v = verify(t.as_bytes(), &keys(), &r, NOW).unwrap();
        assert_eq!(v.until_s, NOW + 90);
        let t = hs(json!({"sub": "k1", "exp": NOW - 29}));
        assert_eq!(check(&t, &r), Ok("k1".into()), "within the leeway");
        let t = hs(json!({"sub": "k1", "exp": NOW - 30}));
        assert_eq!(check(&t, &r), Err(Refusal::Expired));
        let t = hs(json!({"sub": "k1"}));
        assert_eq!(check(&t, &r), Err(Refusal::NoExpiry));
        let t = hs(json!({"sub": "k1", "exp": NOW + 60, "nbf": NOW + 31}));
        assert_eq!(check(&t, &r), Err(Refusal::NotYetValid));
        let t = hs(json!({"sub": "k1", "exp": NOW + 60, "nbf": NOW + 30}));
        assert_eq!(check(&t, &r), Ok("k1".into()));
        let t = hs(json!({"sub": "k1", "exp": "soon"}));
        assert_eq!(check(&t, &r), Err(Refusal::Malformed));
    }

    #[test]
    fn the_claim_is_a_path_to_a_string() {
        let r = Rules {
            claim: vec!["org".into(), "id".into()],
            ..rules()
        };
        let t = hs(json!({"org": {"id": "acme"}, "exp": NOW + 60}));
        assert_eq!(check(&t, &r), Ok("acme".into()));
        for claims in [
            json!({"org": {"id": 7}, "exp": NOW + 60}),
            json!({"org": {"id": ""}, "exp": NOW + 60}),
            json!({"org": "acme", "exp": NOW + 60}),
            json!({"exp": NOW + 60}),
        ] {
            assert_eq!(
                check(&hs(claims.clone()), &r),
                Err(Refusal::NoClaim),
                "{claims}"
            );
        }
        assert_eq!(
            Refusal::NoClaim.why(&r.claim_name()),
            "the bearer token has no string claim org.id"
        );
    }

    #[test]
    fn issuer_and_audience_are_checked_when_set() {
        let r = Rules {
            issuer: Some("https://idp.test".into()),
            audience: Some("api".into()),
            ..rules()
        };
        let good =
            json!({"sub": "k1", "exp": NOW + 60, "iss": "https://idp.test", "aud": ["x", "api"]});
        assert_eq!(check(&hs(good), &r), Ok("k1".into()));
        let t = hs(json!({"sub": "k1", "exp": NOW + 60, "iss": "https://evil.test", "aud": "api"}));
        assert_eq!(check(&t, &r), Err(Refusal::Issuer));
        let t = hs(json!({"sub": "k1", "exp": NOW + 60, "iss": "https://idp.test", "aud": "web"}));
        assert_eq!(check(&t, &r), Err(Refusal::Audience));
        let t = hs(json!({"sub": "k1", "exp": NOW + 60, "iss": "https://idp.test"}));
        assert_eq!(check(&t, &r), Err(Refusal::Audience), "no audience");
        let t = hs(json!({"sub": "k1", "exp": NOW + 60, "aud": "api"}));
        assert_eq!(check(&t, &r), Err(Refusal::Issuer), "no issuer");
    }

    #[test]
    fn unsigned_forged_and_confused_tokens_are_refused() {
        let r = rules();
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let claims = b64(json!({"sub": "k1", "exp": NOW + 60}));
        for alg in ["none", "None", "NONE"] {
            let t = format!("{}.{claims}.", b64(json!({"alg": alg})));
            assert_eq!(check(&t, &r), Err(Refusal::Unsigned), "{alg}");
        }
        let t = format!("{}.{claims}.c2ln", b64(json!({"alg": "XS999"})));
        assert_eq!(check(&t, &r), Err(Refusal::Algorithm("XS999".into())));
        // Another secret's signature.
        let other = encode(
            &Header::default(),
            &json!({"sub": "k1", "exp": NOW + 60}),
            &EncodingKey::from_secret(b"another secret of thirty-two bytes!!").unwrap(),
        )
        .unwrap();
        assert_eq!(check(&other, &r), Err(Refusal::Signature));
        // The payload changed under a good signature.
        let good = hs(json!({"sub": "k1", "exp": NOW + 60}));
        let mut parts: Vec<&str> = good.split('.').collect();
        let changed = b64(json!({"sub": "k2", "exp": NOW + 60}));
        parts[1] = &changed;
        assert_eq!(check(&parts.join("."), &r), Err(Refusal::Signature));
        for bad in ["", "a.b", "a.b.c.d", "!!.e30.", "e30.e30.e30"] {
            assert_eq!(check(bad, &r), Err(Refusal::Malformed), "{bad:?}");
        }
        // HS256 against a set of RSA keys: the public key is never taken as a secret.
        let (rsa, skipped) = Keys::from_jwks(RSA_JWKS.as_bytes()).unwrap();
        assert!(skipped.is_empty());
        let hs_of = |kid: &str| {
            let h = Header {
                kid: Some(kid.into()),
                ..Header::default()
            };
            let claims = json!({"sub": "k1", "exp": NOW + 60});
            encode(&h, &claims, &EncodingKey::from_secret(SECRET).unwrap()).unwrap()
        };
        let t = hs_of("r1");
        assert_eq!(
            verify(t.as_bytes(), &rsa, &r, NOW),
            Err(Refusal::Algorithm("HS256".into()))
        );
        let t = hs_of("r2");
        assert_eq!(
            verify(t.as_bytes(), &rsa, &r, NOW),
            Err(Refusal::UnknownKey)
        );
        assert_eq!(
            verify(t.as_bytes(), &Keys::default(), &r, NOW),
            Err(Refusal::NoKeys)
        );
    }

    #[test]
    fn a_key_set_keeps_the_keys_it_can_use() {
        let mixed = r#"{"keys":[
            {"kty":"oct","k":"c2VjcmV0"},
            {"kty":"EC","crv":"P-384","x":"AA","y":"AA"},
            {"kty":"RSA","use":"enc","e":"AQAB","n":"AQAB"},
            {"kty":"RSA","alg":"RS512","e":"AQAB","n":"AQAB"},
            {"kty":"what"}
        ]}"#;
        let e = Keys::from_jwks(mixed.as_bytes()).unwrap_err();
        assert!(
            e.starts_with("no usable key (key 0: a secret (oct) key"),
            "{e}"
        );
        for (bad, says) in [
            ("[]", "not a JSON Web Key Set"),
            ("{\"keys\":[]}", "the set has no key"),
            ("{", "not a JSON Web Key Set"),
        ] {
            let e = Keys::from_jwks(bad.as_bytes()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let with_rsa = RSA_JWKS.replace("]}", r#",{"kty":"oct","k":"c2VjcmV0"}]}"#);
        let (keys, skipped) = Keys::from_jwks(with_rsa.as_bytes()).unwrap();
        assert_eq!((keys.len(), skipped.len()), (1, 1));
        assert!(keys.knows("r1") && !keys.knows("r2"));
        assert!(Keys::default().with_secret(b"short").is_err());
    }
}
