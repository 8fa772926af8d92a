//! snapshot: a validated catalog built into what the request path reads (routes, limits,
//! version), swapped in whole. Building checks everything first and reports every problem.

use std::collections::HashMap;
use std::path::Path;

use super::CatalogVersion;
use super::{CatalogDoc, CatalogError, MAX_CATALOG_BYTES, Problem};
use crate::router::{RouteMatch, RouteTable, Template};

/// One endpoint of a snapshot, with what the request path needs precomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `METHOD /template`, as in the catalog (method upper-cased). Used as the policy name in
    /// rate-limit headers and as the endpoint part of counter keys.
    pub name: String,
    /// The upper-cased method, forwarded instead of the client's spelling.
    pub method: http::Method,
    pub default_limit: Option<u64>,
}

/// What the catalog says about one (API key, endpoint) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitLookup {
    /// The key is not in the catalog.
    UnknownKey,
    /// The key is known but has no limit (and the endpoint no default) here.
    NoLimit,
    /// Requests per 60 seconds.
    Limit(u64),
}

/// API key bytes -> its (endpoint index, limit) pairs, sorted by endpoint index.
///
/// foldhash, seeded per process, rather than SipHash: looked up on every request, and only the
/// catalog inserts into it, so a client cannot grow it or choose colliding keys to slow it down.
type KeyLimits = HashMap<Box<[u8]>, Box<[(u32, u64)]>, foldhash::fast::RandomState>;

/// An immutable, validated catalog version: routes, limits and version, swapped in as one.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub version: CatalogVersion,
    /// The document this snapshot was built from (diffs apply to it).
    doc: std::sync::Arc<CatalogDoc>,
    routes: RouteTable,
    endpoints: Vec<Endpoint>,
    keys: KeyLimits,
    /// Fields of the document quotagate does not know (ignored; logged once when served).
    unknown_fields: Vec<String>,
}

impl Snapshot {
    /// Parses and validates a DynLimits catalog. `source` names it in errors.
    pub fn from_json(source: &str, json: &[u8]) -> Result<Snapshot, CatalogError> {
        let (doc, unknown) = CatalogDoc::parse_reporting(source, json)?;
        Ok(Snapshot::build(source, doc)?.with_unknown_fields(unknown))
    }

    /// Records the fields of the document that quotagate does not know.
    pub fn with_unknown_fields(mut self, unknown: Vec<String>) -> Snapshot {
        self.unknown_fields = unknown;
        self
    }

    /// The fields of the document quotagate does not know, by path (`apilimit`).
    pub fn unknown_fields(&self) -> &[String] {
        &self.unknown_fields
    }

    /// Validates a document and builds its snapshot. `source` names it in errors.
    pub fn build(source: &str, doc: CatalogDoc) -> Result<Snapshot, CatalogError> {
        build(doc).map_err(|problems| CatalogError {
            source: source.to_owned(),
            problems,
        })
    }

    pub fn doc(&self) -> &std::sync::Arc<CatalogDoc> {
        &self.doc
    }

    /// Reads, parses and validates a catalog file.
    pub fn load_file(path: &Path) -> Result<Snapshot, CatalogError> {
        let source = path.display().to_string();
        let one = |reason: String| CatalogError {
            source: source.clone(),
            problems: vec![Problem {
                at: String::new(),
                reason,
            }],
        };
        let meta = std::fs::metadata(path).map_err(|e| CatalogError::unreadable(&source, &e))?;
        if meta.len() > MAX_CATALOG_BYTES {
            return Err(one(format!(
                "it is {} bytes; the largest catalog accepted is {MAX_CATALOG_BYTES} bytes",
                meta.len()
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| CatalogError::unreadable(&source, &e))?;
        Snapshot::from_json(&source, &bytes)
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Finds the endpoint of a request.
    pub fn route(&self, method: &str, path: &crate::path::NormalPath) -> Option<RouteMatch> {
        self.routes.lookup(method, path)
    }

    /// The limit of `key` on `endpoint`.
    pub fn limit(&self, key: &[u8], endpoint: usize) -> LimitLookup {
        let Some(limits) = self.keys.get(key) else {
            return LimitLookup::UnknownKey;
        };
        let own = u32::try_from(endpoint)
            .ok()
            .and_then(|ep| limits.binary_search_by_key(&ep, |&(e, _)| e).ok())
            .map(|i| limits[i].1);
        match own.or_else(|| self.endpoints.get(endpoint).and_then(|e| e.default_limit)) {
            Some(rl) => LimitLookup::Limit(rl),
            None => LimitLookup::NoLimit,
        }
    }
}

fn index(i: i64, len: usize, what: &str) -> Result<usize, String> {
    match usize::try_from(i) {
        Ok(u) if u < len => Ok(u),
        _ => Err(format!(
            "index {i} is out of range ({what} has {len} entries)"
        )),
    }
}

fn limit_value(rl: i64) -> Result<u64, String> {
    u64::try_from(rl).map_err(|_| format!("limit {rl} is negative"))
}

fn build(raw: CatalogDoc) -> Result<Snapshot, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut problem = |at: String, reason: String| problems.push(Problem { at, reason });

    let mut templates = Vec::with_capacity(raw.endpoints.len());
    let mut endpoints = Vec::with_capacity(raw.endpoints.len());
    for (i, ep) in raw.endpoints.iter().enumerate() {
        let m = index(ep.m, raw.methods.len(), "methods")
            .map_err(|r| problem(format!("endpoints[{i}].m"), r));
        let p = index(ep.p, raw.paths.len(), "paths")
            .map_err(|r| problem(format!("endpoints[{i}].p"), r));
        let default_limit = match ep.default_rl.map(limit_value).transpose() {
            Ok(d) => d,
            Err(r) => {
                problem(format!("endpoints[{i}].default_rl"), r);
                None
            }
        };
        if let (Ok(m), Ok(p)) = (m, p) {
            let parsed = Template::parse(&raw.methods[m], &raw.paths[p])
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    http::Method::from_bytes(t.method.as_bytes())
                        .map(|m| (t, m))
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok((t, method)) => {
                    endpoints.push(Endpoint {
                        name: format!("{} {}", t.method, t.path),
                        method,
                        default_limit,
                    });
                    templates.push((i, t));
                }
                Err(r) => problem(format!("endpoints[{i}]"), r),
            }
        }
    }

    let mut keys: KeyLimits =
        HashMap::with_capacity_and_hasher(raw.apilimits.len(), Default::default());
    let mut first_seen: HashMap<&str, usize> = HashMap::with_capacity(raw.apilimits.len());
    for (k, entry) in raw.apilimits.iter().enumerate() {
        if entry.key.is_empty() {
            problem(format!("apilimits[{k}].key"), "the API key is empty".into());
            continue;
        }
        if let Some(first) = first_seen.insert(&entry.key, k) {
            problem(
                format!("apilimits[{k}].key"),
                format!("duplicate API key (also apilimits[{first}])"),
            );
            continue;
        }
        let mut limits: Vec<(u32, u64)> = Vec::with_capacity(entry.limits.len());
        let mut eps_seen: HashMap<u32, usize> = HashMap::new();
        for (j, l) in entry.limits.iter().enumerate() {
            let at = format!("apilimits[{k}].limits[{j}]");
            let ep = index(l.ep, raw.endpoints.len(), "endpoints")
                .map_err(|r| problem(format!("{at}.ep"), r));
            let rl = limit_value(l.rl).map_err(|r| problem(format!("{at}.rl"), r));
            if let (Ok(ep), Ok(rl)) = (ep, rl) {
                let ep = ep as u32;
                if let Some(prev) = eps_seen.insert(ep, j) {
                    problem(
                        format!("{at}.ep"),
                        format!("endpoint {ep} already has a limit for this key (limits[{prev}])"),
                    );
                } else {
                    limits.push((ep, rl));
                }
            }
        }
        limits.sort_unstable_by_key(|&(ep, _)| ep);
        keys.insert(entry.key.as_bytes().into(), limits.into_boxed_slice());
    }

    // Route conflicts are only meaningful once every endpoint parsed.
    let mut routes = RouteTable::default();
    if templates.len() == raw.endpoints.len() {
        let raw_index: Vec<usize> = templates.iter().map(|(i, _)| *i).collect();
        match RouteTable::build(templates.into_iter().map(|(_, t)| t).collect()) {
            Ok(t) => routes = t,
            Err(conflicts) => {
                for (i, reason) in conflicts {
                    problem(format!("endpoints[{}]", raw_index[i]), reason);
                }
            }
        }
    }

    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Snapshot {
        version: raw.version.clone().unwrap_or_default(),
        doc: std::sync::Arc::new(raw),
        routes,
        endpoints,
        keys,
        unknown_fields: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ApiLimits, LimitDef};
    use crate::path::{EscapedSlashes, normalize};

    const GOOD: &str = r#"{
        "version": {"semver": "v1", "hash": "h1", "released": "2020-04-12T23:20:50.52Z"},
        "methods": ["GET", "post"],
        "paths": ["/users/{id}/prefs", "/users"],
        "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 1, "default_rl": 7}],
        "apilimits": [
            {"key": "k1", "limits": [{"ep": 0, "rl": 20}, {"ep": 1, "rl": 5}]},
            {"key": "k2", "limits": [{"ep": 0, "rl": 0}]}
        ]
    }"#;

    fn problems(json: &str) -> Vec<String> {
        Snapshot::from_json("t.json", json.as_bytes())
            .unwrap_err()
            .problems
            .into_iter()
            .map(|p| format!("{}: {}", p.at, p.reason))
            .collect()
    }

    #[test]
    fn loads_a_good_catalog_and_answers_limits() {
        let s = Snapshot::from_json("t.json", GOOD.as_bytes()).unwrap();
        assert_eq!(s.version.hash, "h1");
        let path = normalize("/users/9/prefs", EscapedSlashes::Reject).unwrap();
        let r = s.route("GET", &path).unwrap();
        assert_eq!(s.endpoints()[r.endpoint].name, "GET /users/{id}/prefs");
        assert_eq!(s.limit(b"k1", 0), LimitLookup::Limit(20));
        assert_eq!(s.limit(b"k2", 0), LimitLookup::Limit(0));
        assert_eq!(s.limit(b"k2", 1), LimitLookup::Limit(7), "endpoint default");
        assert_eq!(
            s.limit(b"nobody", 1),
            LimitLookup::UnknownKey,
            "defaults never apply to unknown keys"
        );
        let s2 = Snapshot::from_json("t", br#"{"methods":["GET"],"paths":["/a"],"endpoints":[{"p":0,"m":0}],"apilimits":[{"key":"k","limits":[]}]}"#).unwrap();
        assert_eq!(s2.limit(b"k", 0), LimitLookup::NoLimit);
    }

    #[test]
    fn every_problem_is_reported_with_its_location() {
        let got = problems(
            r#"{
            "methods": ["GET"],
            "paths": ["/a", "/b/{x}"],
            "endpoints": [{"p": 2, "m": 0}, {"p": 0, "m": -1}, {"p": 1, "m": 0, "default_rl": -3}],
            "apilimits": [
                {"key": "k", "limits": [{"ep": 3, "rl": 1}, {"ep": 2, "rl": -5}]},
                {"key": "k", "limits": []},
                {"key": "", "limits": []},
                {"key": "j", "limits": [{"ep": 2, "rl": 1}, {"ep": 2, "rl": 2}]}
            ]
        }"#,
        );
        let want = [
            "endpoints[0].p: index 2 is out of range (paths has 2 entries)",
            "endpoints[1].m: index -1 is out of range (methods has 1 entries)",
            "endpoints[2].default_rl: limit -3 is negative",
            "apilimits[0].limits[0].ep: index 3 is out of range (endpoints has 3 entries)",
            "apilimits[0].limits[1].rl: limit -5 is negative",
            "apilimits[1].key: duplicate API key (also apilimits[0])",
            "apilimits[2].key: the API key is empty",
            "apilimits[3].limits[1].ep: endpoint 2 already has a limit for this key (limits[0])",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn off_by_one_index_is_an_error_not_a_panic() {
        // DynLimits checks `p > len` and crashes on `p == len`.
        let got = problems(
            r#"{"methods":["GET"],"paths":["/a"],"endpoints":[{"p":1,"m":0}],"apilimits":[]}"#,
        );
        assert_eq!(
            got,
            ["endpoints[0].p: index 1 is out of range (paths has 1 entries)"]
        );
    }

    #[test]
    fn duplicate_and_conflicting_routes_are_refused() {
        let got = problems(
            r#"{"methods":["GET","get"],"paths":["/a/{x}","/A/{y}/"],
                "endpoints":[{"p":0,"m":0},{"p":1,"m":1}],"apilimits":[]}"#,
        );
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with("endpoints[1]: GET /A/{y}/ is the same route as endpoint 0"),
            "{got:?}"
        );
    }

    #[test]
    fn bad_templates_and_methods_are_refused() {
        let got = problems(
            r#"{"methods":["GET","B AD"],"paths":["nope","/ok"],"endpoints":[{"p":0,"m":0},{"p":1,"m":1}],"apilimits":[]}"#,
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("endpoints[0]: path \"nope\" must start with '/'"));
        assert!(got[1].contains("not a valid HTTP method"));
    }

    #[test]
    fn syntax_errors_and_wrong_types_are_problems() {
        let got = problems(r#"{"methods": ["GET"],}"#);
        assert!(
            got[0].starts_with(": not a valid catalog document"),
            "{got:?}"
        );
        let got = problems(r#"{"endpoints": [{"p": "x", "m": 0}]}"#);
        assert!(got[0].contains("not a valid catalog document"));
        let got = problems(r#"[1, 2]"#);
        assert!(got[0].contains("not a valid catalog document"));
    }

    #[test]
    fn diffs_carry_key_changes_and_apply_back() {
        let a = CatalogDoc::parse("a", GOOD.as_bytes()).unwrap();
        let mut b = a.clone();
        b.version = Some(CatalogVersion {
            semver: "v2".into(),
            hash: "h2".into(),
            released: None,
        });
        b.apilimits[0].limits[0].rl = 99; // k1 changed
        b.apilimits.remove(1); // k2 removed
        b.apilimits.push(ApiLimits {
            key: "k3".into(),
            limits: vec![LimitDef { ep: 1, rl: 4 }],
        });
        let d = a.diff_to(&b).unwrap();
        assert_eq!(d.from, "h1");
        assert_eq!(
            d.apilimits
                .iter()
                .map(|k| k.key.as_str())
                .collect::<Vec<_>>(),
            ["k1", "k3"]
        );
        assert_eq!(d.removed_keys, ["k2"]);
        assert_eq!(a.apply(&d), b);
        let mut c = a.clone();
        c.paths.push("/more".into());
        assert!(a.diff_to(&c).is_none(), "endpoints changed: no diff");
    }

    #[test]
    fn empty_catalog_is_valid() {
        let s = Snapshot::from_json(
            "t",
            br#"{"methods": [], "paths": [], "endpoints": [], "apilimits": []}"#,
        )
        .unwrap();
        assert_eq!(s.key_count(), 0);
    }

    #[test]
    fn required_fields_are_required_and_unknown_ones_reported() {
        // A typo of a field every DynLimits catalog has is an error, not an empty catalog.
        let typo = br#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 0, "m": 0}], "apilimit": []}"#;
        let e = Snapshot::from_json("t", typo).unwrap_err();
        assert!(e.to_string().contains("missing field `apilimits`"), "{e}");
        let extra = br#"{"methods": ["GET"], "paths": ["/a"], "endpoints": [{"p": 0, "m": 0, "defualt_rl": 3}],
            "apilimits": [{"key": "k", "limits": [], "note": "x"}], "owner": "team"}"#;
        let s = Snapshot::from_json("t", extra).unwrap();
        assert_eq!(
            s.unknown_fields(),
            ["endpoints.0.defualt_rl", "apilimits.0.note", "owner"]
        );
    }

    #[test]
    fn display_lists_every_problem() {
        let e = Snapshot::from_json(
            "cat.json",
            br#"{"methods":[],"paths":[],"endpoints":[{"p":0,"m":0}],"apilimits":[]}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "catalog cat.json is invalid (2 problems):\n  endpoints[0].m: index 0 is out of range (methods has 0 entries)\n  endpoints[0].p: index 0 is out of range (paths has 0 entries)"
        );
    }
}
