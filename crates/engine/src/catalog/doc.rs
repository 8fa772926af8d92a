//! doc: the catalog document as it travels (DynLimits' `APIIndexedLimits` JSON and our additive
//! fields), and the diff protocol between two versions of it (`docs/catalog-protocol.md`).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{CatalogError, Problem};

/// `version` of a DynLimits catalog. All fields optional; DynLimits' example catalogs have none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogVersion {
    #[serde(default)]
    pub semver: String,
    #[serde(default)]
    pub hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<String>,
}

/// A catalog document as written: the DynLimits `APIIndexedLimits` JSON, not yet validated.
///
/// The fields every DynLimits catalog has are required, so a misspelt one (`apilimit`) is an error
/// rather than an empty catalog. Unknown fields are reported ([`CatalogDoc::parse_reporting`]) and
/// otherwise ignored, so catalogs from newer servers still load.
///
/// `K` is what `apilimits` is read as: the keys themselves, or (a first pass over a large
/// catalog, whose keys are then read straight into its key table) only how many there are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogDoc<K = Vec<ApiLimits>> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<CatalogVersion>,
    pub methods: Vec<String>,
    pub paths: Vec<String>,
    pub endpoints: Vec<EndpointDef>,
    pub apilimits: K,
    /// Limits per client address for requests without an API key (`limits.anonymous =
    /// "by_address"`). Our extension.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anonymous: Vec<LimitDef>,
    /// The time zone of calendar limits that name none (an IANA name). Default: `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// Named sets of endpoints (indices into `endpoints`) that a key's limit may pool
    /// (`"group": "search"`); `"*"`, every endpoint, needs no entry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, Vec<i64>>,
}

/// Unknown field paths reported per document at most; the rest are counted.
pub const MAX_UNKNOWN_REPORTED: usize = 20;

// Indices and limits are read as i64 so that a negative value is a validation problem with a
// location, not an opaque parse error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointDef {
    pub p: i64,
    pub m: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_rl: Option<i64>,
    /// Several default windows (`[{"rl": 10, "w": 1}, {"rl": 600}]`); `ep` is not used here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default_limits: Vec<DefaultLimitDef>,
    /// Units of every limit one request uses. Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<serde_json::Number>,
    /// Where its responses report what a request cost: `{"header": NAME}` or `{"json": PATH}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_from: Option<CostFromDef>,
}

/// An endpoint's `cost_from`, as written: exactly one of its fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostFromDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
}

/// One default window of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultLimitDef {
    pub rl: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
}

/// One caller's limits. It is named by `key` (the API key itself, as DynLimits does) or by
/// `key_digest` (`sha256:<hex>` or `hmac-sha256:<hex>`, see [`super::KeyDigest`]), never both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiLimits {
    /// Empty when the entry is named by its digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_digest: Option<String>,
    pub limits: Vec<LimitDef>,
}

impl ApiLimits {
    /// What the entry is named by, as written: its `key`, or its `key_digest`.
    pub fn name(&self) -> EntryName<'_> {
        match &self.key_digest {
            Some(d) if self.key.is_empty() => EntryName::Digest(d),
            _ => EntryName::Key(&self.key),
        }
    }
}

/// What a catalog entry is named by, as written ([`ApiLimits::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryName<'a> {
    Key(&'a str),
    Digest(&'a str),
}

// `w` is read as a JSON number, so that 1.5 or -1 is a validation problem that names the field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitDef {
    /// The endpoint (an index into `endpoints`); a pool names a `group` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ep: Option<i64>,
    /// A pool: every request of the key to any endpoint of this group (a name in `groups`, or
    /// `"*"` for every endpoint) counts here. In place of `ep`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Units per window (or period). Every limit has it but a concurrency limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rl: Option<i64>,
    /// A concurrency limit: at most this many requests of the key in flight at once, in place
    /// of `rl` (and of `w` or `period`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<i64>,
    /// Window in seconds, 1 to 86400. Default: 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w: Option<serde_json::Number>,
    /// Counted, never refuses. Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<bool>,
    /// A calendar quota: `hour`, `day`, `week` or `month`, in place of `w`. Read as a string so
    /// that an unknown period is a problem that names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// The zone of a calendar quota's periods (an IANA name). Default: the catalog's `tz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// A request this limit would refuse waits up to this many milliseconds (0 to 60000) for
    /// room instead of a 429. An API key's limits only. Default: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<i64>,
}

/// What changed in the API keys' limits between two catalog versions whose methods, paths and
/// endpoints are the same (`GET /catalog_diff`, see `docs/catalog-protocol.md`).
///
/// `K` is what `apilimits` holds: the keys' limits as values, or (a server's answer) as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogDiff<K = Vec<ApiLimits>> {
    /// The version hash the diff starts from.
    pub from: String,
    /// The version the diff leads to.
    pub version: CatalogVersion,
    /// Keys that are new or whose limits changed, with all their limits.
    #[serde(default)]
    pub apilimits: K,
    /// Keys that are gone (entries that named them by `key`).
    #[serde(default)]
    pub removed_keys: Vec<String>,
    /// Keys that are gone, by the `key_digest` their entries named them by.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_key_digests: Vec<String>,
}

impl CatalogDoc {
    /// Parses a document; `source` names it in errors.
    pub fn parse(source: &str, json: &[u8]) -> Result<CatalogDoc, CatalogError> {
        CatalogDoc::parse_reporting(source, json).map(|(doc, _)| doc)
    }

    /// Parses a document and lists the fields it has that quotagate does not know (their paths,
    /// such as `apilimit` or `endpoints[0].default_r`, at most [`MAX_UNKNOWN_REPORTED`] of them,
    /// then a count of the rest).
    ///
    /// A document that does not parse is one problem located at the JSON path of the value at
    /// fault (`apilimits[0].limits[0].w: invalid type: string "abc", expected a number at line 1
    /// column 80`), followed by the unknown fields met before it: a misspelt required field
    /// (`limit` for `limits`) is then named as unknown beside the missing one.
    pub fn parse_reporting(
        source: &str,
        json: &[u8],
    ) -> Result<(CatalogDoc, Vec<String>), CatalogError> {
        let mut unknown = UnknownFields::default();
        let doc = parse_doc(source, json, &mut unknown, |_| true)?;
        Ok((doc, unknown.into_list()))
    }
}

/// The fields of a document that quotagate does not know, by path: the first
/// [`MAX_UNKNOWN_REPORTED`], then how many more. Read in two passes, a catalog lists those
/// outside `apilimits` first.
#[derive(Debug, Default)]
pub struct UnknownFields {
    listed: Vec<String>,
    more: usize,
}

impl UnknownFields {
    pub(super) fn note(&mut self, path: &serde_ignored::Path) {
        if self.listed.len() < MAX_UNKNOWN_REPORTED {
            self.listed.push(json_path(path));
        } else {
            self.more += 1;
        }
    }

    /// The paths, then `and N more` if there were more.
    pub fn into_list(mut self) -> Vec<String> {
        if self.more > 0 {
            self.listed.push(format!("and {} more", self.more));
        }
        self.listed
    }
}

/// Parses a document, noting in `unknown` the fields it does not know that `report` accepts.
pub(super) fn parse_doc<T: serde::de::DeserializeOwned>(
    source: &str,
    json: &[u8],
    unknown: &mut UnknownFields,
    report: impl Fn(&serde_ignored::Path) -> bool,
) -> Result<T, CatalogError> {
    let mut track = serde_path_to_error::Track::new();
    let mut de = serde_json::Deserializer::from_slice(json);
    let parsed = serde_ignored::deserialize(
        serde_path_to_error::Deserializer::new(&mut de, &mut track),
        |path| {
            if report(&path) {
                unknown.note(&path);
            }
        },
    )
    .and_then(|doc| de.end().map(|()| doc));
    parsed.map_err(|e| {
        // `?` stands for a segment the parser could not name (a syntax error in a key).
        let at = track.path().to_string();
        let at = at.trim_end_matches(".?").trim_end_matches('?');
        let mut problems = vec![Problem {
            at: if at == "." {
                String::new()
            } else {
                at.to_owned()
            },
            reason: format!("not a valid catalog document: {e}"),
        }];
        let met = std::mem::take(&mut unknown.listed);
        problems.extend(met.into_iter().map(|at| Problem {
            at,
            reason: "unknown field (a misspelling?)".to_owned(),
        }));
        CatalogError {
            source: source.to_owned(),
            problems,
        }
    })
}

impl<K> CatalogDoc<K> {
    pub fn hash(&self) -> &str {
        self.version.as_ref().map_or("", |v| v.hash.as_str())
    }
}

impl CatalogDoc {
    /// The diff from `self` to `newer`, or `None` when their endpoints, anonymous limits, default
    /// zone or groups differ (a client then needs the whole catalog).
    pub fn diff_to(&self, newer: &CatalogDoc) -> Option<CatalogDiff> {
        if (
            &self.methods,
            &self.paths,
            &self.endpoints,
            &self.anonymous,
            &self.tz,
            &self.groups,
        ) != (
            &newer.methods,
            &newer.paths,
            &newer.endpoints,
            &newer.anonymous,
            &newer.tz,
            &newer.groups,
        ) {
            return None;
        }
        let old: HashMap<EntryName, &ApiLimits> =
            self.apilimits.iter().map(|a| (a.name(), a)).collect();
        let kept: HashSet<EntryName> = newer.apilimits.iter().map(ApiLimits::name).collect();
        let removed = || {
            self.apilimits
                .iter()
                .map(ApiLimits::name)
                .filter(|n| !kept.contains(n))
        };
        Some(CatalogDiff {
            from: self.hash().to_owned(),
            version: newer.version.clone().unwrap_or_default(),
            apilimits: newer
                .apilimits
                .iter()
                .filter(|a| old.get(&a.name()) != Some(a))
                .cloned()
                .collect(),
            removed_keys: removed()
                .filter_map(|n| match n {
                    EntryName::Key(k) => Some(k.to_owned()),
                    EntryName::Digest(_) => None,
                })
                .collect(),
            removed_key_digests: removed()
                .filter_map(|n| match n {
                    EntryName::Digest(d) => Some(d.to_owned()),
                    EntryName::Key(_) => None,
                })
                .collect(),
        })
    }
}

impl CatalogDoc {
    /// This document with `diff` applied. The caller checks that `diff.from` is this version.
    pub fn apply(&self, diff: &CatalogDiff) -> CatalogDoc {
        let changed: HashMap<EntryName, &ApiLimits> =
            diff.apilimits.iter().map(|a| (a.name(), a)).collect();
        let removed: HashSet<EntryName> = (diff.removed_keys.iter())
            .map(|k| EntryName::Key(k))
            .chain(
                diff.removed_key_digests
                    .iter()
                    .map(|d| EntryName::Digest(d)),
            )
            .collect();
        let present: HashSet<EntryName> = self.apilimits.iter().map(ApiLimits::name).collect();
        let mut apilimits: Vec<ApiLimits> = self
            .apilimits
            .iter()
            .filter(|a| !removed.contains(&a.name()))
            .map(|a| {
                changed
                    .get(&a.name())
                    .map_or_else(|| a.clone(), |c| (*c).clone())
            })
            .collect();
        apilimits.extend(
            diff.apilimits
                .iter()
                .filter(|a| !present.contains(&a.name()))
                .cloned(),
        );
        CatalogDoc {
            version: Some(diff.version.clone()),
            methods: self.methods.clone(),
            paths: self.paths.clone(),
            endpoints: self.endpoints.clone(),
            apilimits,
            anonymous: self.anonymous.clone(),
            tz: self.tz.clone(),
            groups: self.groups.clone(),
        }
    }
}

/// A path as serde_ignored reports it, written the way problems are located:
/// `endpoints[0].default_r`.
fn json_path(path: &serde_ignored::Path) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", json_path(parent)),
        Path::Map { parent, key } => match json_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => json_path(parent),
    }
}
