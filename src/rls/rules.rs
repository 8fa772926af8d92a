//! rules: envoyproxy/ratelimit's YAML rule files, read as they are, and which rule a descriptor
//! matches. Pure: the files' text comes in, a [`RuleSet`] or every problem found goes out.
//!
//! A file is one `domain` with nested `descriptors` (`key`, optional `value`, optional
//! `rate_limit`, nested `descriptors`). A descriptor's entries walk down the tree one level per
//! entry: at each level the entry's exact (key, value) is tried first, then wildcard values
//! (`value: prefix*`, every `*` matching any run of characters) in file order, then the key alone.
//! A rule applies only if it sits at the level of the descriptor's last entry, as in
//! envoyproxy/ratelimit's `GetLimit`.
//!
//! Differences from envoyproxy/ratelimit, on purpose: (key, value) pairs are compared as pairs,
//! not joined with `_` (so key `a_b` with no value and key `a` value `b` are two rules, not a
//! duplicate); `quota_mode` is refused (not implemented).

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

/// Largest rule file read. Default: 4 MiB.
pub const MAX_RULE_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Deepest descriptor nesting accepted (entries per descriptor that can match). Default: 32.
pub const MAX_DEPTH: usize = 32;

/// A rule's time unit, with its window length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// envoyproxy/ratelimit's spelling (case does not matter).
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The window length: envoyproxy/ratelimit's `UnitToDivider` (a month is 30 days, a year 365).
    pub fn seconds(self) -> u32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The number Envoy's protos give this unit.
    pub fn proto(self) -> super::proto::Unit {
        use super::proto::Unit as P;
        match self {
            Unit::Second => P::Second,
            Unit::Minute => P::Minute,
            Unit::Hour => P::Hour,
            Unit::Day => P::Day,
            Unit::Week => P::Week,
            Unit::Month => P::Month,
            Unit::Year => P::Year,
        }
    }

    /// From Envoy's protos (a descriptor's limit override); `None` for UNKNOWN or a number it
    /// does not define.
    pub fn from_proto(n: i32) -> Option<Unit> {
        use super::proto::Unit as P;
        Some(match P::try_from(n).ok()? {
            P::Unknown => return None,
            P::Second => Unit::Second,
            P::Minute => Unit::Minute,
            P::Hour => Unit::Hour,
            P::Day => Unit::Day,
            P::Week => Unit::Week,
            P::Month => Unit::Month,
            P::Year => Unit::Year,
        })
    }
}

/// What a matched rule says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `rate_limit.name` (empty: none).
    pub name: String,
    /// `None`: `unlimited`.
    pub limit: Option<(u32, Unit)>,
    pub shadow: bool,
    /// Names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    /// `<domain>.<key>[_<value>]...` as written in the file: the rule's metric name.
    pub path: String,
    /// The descriptor's `metadata`: sent to Envoy's next filters when the rule passes a
    /// request (`rls.response_dynamic_metadata`).
    pub metadata: Option<std::sync::Arc<serde_json::Map<String, Value>>>,
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct Node {
    /// key -> value ("" for a descriptor without one) -> level.
    exact: HashMap<String, HashMap<String, usize>>,
    /// Wildcard values, in file order.
    wildcards: Vec<Wildcard>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty()
    }
}

#[derive(Debug)]
struct Wildcard {
    key: String,
    /// As written (`files*`).
    value: String,
    /// The pieces between the stars.
    parts: Vec<String>,
    /// `share_threshold`: every value it matches counts in one counter, named by the pattern.
    share: bool,
    level: usize,
}

#[derive(Debug)]
struct Level {
    rule: Option<Rule>,
    below: Node,
}

/// One domain's rules.
#[derive(Debug, Default)]
pub struct Domain {
    levels: Vec<Level>,
    top: Node,
}

/// A rule a descriptor matched, and how its counter is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'a> {
    pub rule: &'a Rule,
    /// Per entry, when some entry matched a `share_threshold` wildcard: the pattern that stands
    /// for its value in the counter's name. Empty otherwise (no allocation).
    share: Vec<Option<&'a str>>,
}

impl Found<'_> {
    /// The value entry `i` counts under: its own, or the shared wildcard pattern.
    pub fn counted_value<'v>(&'v self, i: usize, value: &'v str) -> &'v str {
        self.share.get(i).copied().flatten().unwrap_or(value)
    }
}

impl Domain {
    /// The rule `entries` (key, value) match, if any.
    pub fn find<'a>(&'a self, entries: &[(&str, &str)]) -> Option<Found<'a>> {
        let mut node = &self.top;
        let mut share = Vec::new();
        for (i, &(k, v)) in entries.iter().enumerate() {
            let values = node.exact.get(k);
            let next = match values.and_then(|m| m.get(v)) {
                Some(&l) => l,
                None => match node
                    .wildcards
                    .iter()
                    .find(|w| w.key == k && quotagate_engine::glob::matches(&w.parts, v))
                {
                    Some(w) => {
                        if w.share {
                            share.resize(entries.len(), None);
                            share[i] = Some(w.value.as_str());
                        }
                        w.level
                    }
                    None => *values?.get("")?,
                },
            };
            let level = &self.levels[next];
            if i + 1 == entries.len() {
                return level.rule.as_ref().map(|rule| Found { rule, share });
            }
            if level.below.is_empty() {
                return None;
            }
            node = &level.below;
        }
        None
    }
}

/// Every domain's rules.
#[derive(Debug, Default)]
pub struct RuleSet {
    domains: HashMap<String, Domain>,
}

impl RuleSet {
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Every rule, with its domain's name.
    pub fn rules(&self) -> impl Iterator<Item = (&str, &Rule)> {
        self.domains.iter().flat_map(|(name, d)| {
            d.levels
                .iter()
                .filter_map(move |l| l.rule.as_ref().map(|r| (name.as_str(), r)))
        })
    }

    /// Reads rule files (`(name, text)`, names used in problems). Every problem of every file is
    /// listed; one is enough to refuse the whole set. A domain defined in two files is refused,
    /// unless `merge` (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`): then its descriptors are
    /// one tree, where a descriptor defined twice is refused as within one file.
    pub fn parse(files: &[(String, String)], merge: bool) -> Result<RuleSet, Problems> {
        let mut set = RuleSet::default();
        let mut problems = Problems::default();
        let mut seen: HashMap<String, &str> = HashMap::new();
        for (file, text) in files {
            let mut p = FileProblems {
                file,
                list: &mut problems.0,
            };
            let before = p.list.len();
            let earlier = |name: &str| match merge {
                true => set.domains.remove(name),
                false => None,
            };
            let Some((name, domain)) = parse_file(text, &mut p, earlier) else {
                continue;
            };
            if merge {
                if p.list.len() == before {
                    set.domains.insert(name, domain);
                }
                continue;
            }
            if let Some(first) = seen.get(name.as_str()) {
                p.push(
                    "domain",
                    format!("domain '{name}' is also defined in {first}"),
                );
            } else if !name.is_empty() {
                seen.insert(name.clone(), file);
            }
            if p.list.len() == before {
                set.domains.insert(name, domain);
            }
        }
        if problems.0.is_empty() {
            Ok(set)
        } else {
            Err(problems)
        }
    }
}

/// Every problem found in a set of rule files, one line each: `<file>: <where>: <what>`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<String>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

struct FileProblems<'a> {
    file: &'a str,
    list: &'a mut Vec<String>,
}

impl FileProblems<'_> {
    fn push(&mut self, at: &str, what: impl fmt::Display) {
        self.list.push(format!("{}: {at}: {what}", self.file));
    }
}

/// Parses one file: its domain name and tree (meaningful only if no problem was pushed), or
/// `None` when it is not a mapping at all. `earlier`: the tree its domain's descriptors are
/// added to, given its name (`None`: a new one).
fn parse_file(
    text: &str,
    p: &mut FileProblems<'_>,
    earlier: impl FnOnce(&str) -> Option<Domain>,
) -> Option<(String, Domain)> {
    let doc: Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            // The parser's message spans lines (a snippet of the file): its first says it all.
            let e = e.to_string();
            p.push(
                "file",
                format_args!("not YAML: {}", e.lines().next().unwrap_or_default()),
            );
            return None;
        }
    };
    let Some(root) = doc.as_object() else {
        p.push("file", "must be a mapping with 'domain' and 'descriptors'");
        return None;
    };
    unknown_keys(root, &["domain", "descriptors"], "", p);
    let name = match root.get("domain").map(scalar) {
        Some(Some(d)) if !d.is_empty() => d,
        _ => {
            p.push("domain", "missing or empty");
            String::new()
        }
    };
    let mut domain = earlier(&name).unwrap_or_default();
    let mut top = std::mem::take(&mut domain.top);
    if let Some(list) = root.get("descriptors") {
        descriptors(list, "descriptors", &name, 1, &mut domain, &mut top, p);
    }
    domain.top = top;
    Some((name, domain))
}

const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "quota_mode",
];
const RATE_LIMIT_KEYS: &[&str] = &["requests_per_unit", "unit", "unlimited", "name", "replaces"];

/// Reads one `descriptors` list into `node`, its levels into `domain`.
fn descriptors(
    list: &Value,
    at: &str,
    parent: &str,
    depth: usize,
    domain: &mut Domain,
    node: &mut Node,
    p: &mut FileProblems<'_>,
) {
    let Some(items) = list.as_array() else {
        if !list.is_null() {
            p.push(at, "must be a list");
        }
        return;
    };
    if depth > MAX_DEPTH {
        p.push(at, format_args!("nested deeper than {MAX_DEPTH} levels"));
        return;
    }
    for (i, item) in items.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let Some(d) = item.as_object() else {
            p.push(&at, "must be a mapping");
            continue;
        };
        unknown_keys(d, DESCRIPTOR_KEYS, &at, p);
        let key = match d.get("key").map(scalar) {
            Some(Some(k)) if !k.is_empty() => k,
            _ => {
                p.push(&at, "descriptor has an empty or missing key");
                continue;
            }
        };
        let value = match d.get("value").map(scalar) {
            None | Some(Some(_)) => d.get("value").and_then(scalar).unwrap_or_default(),
            Some(None) => {
                p.push(&format!("{at}.value"), "must be a string");
                String::new()
            }
        };
        let path = if value.is_empty() {
            format!("{parent}.{key}")
        } else {
            format!("{parent}.{key}_{value}")
        };
        let flag = |name: &str, p: &mut FileProblems<'_>| match d.get(name) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                p.push(&format!("{at}.{name}"), "must be true or false");
                false
            }
        };
        let shadow = flag("shadow_mode", p);
        let detailed_metric = flag("detailed_metric", p);
        let value_to_metric = flag("value_to_metric", p);
        let share = flag("share_threshold", p);
        if flag("quota_mode", p) {
            p.push(
                &format!("{at}.quota_mode"),
                "quota_mode is not supported by quotagate",
            );
        }
        if share && !value.contains('*') {
            p.push(
                &format!("{at}.share_threshold"),
                format_args!("share_threshold needs a wildcard value, '{path}' has none"),
            );
        }
        let metadata = match d.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) if m.is_empty() => None,
            Some(Value::Object(m)) => Some(std::sync::Arc::new(m.clone())),
            Some(_) => {
                p.push(&format!("{at}.metadata"), "must be a mapping");
                None
            }
        };
        let rule = d.get("rate_limit").and_then(|r| {
            rate_limit(r, &format!("{at}.rate_limit"), p).map(|(name, limit, replaces)| Rule {
                name,
                limit,
                shadow,
                replaces,
                detailed_metric,
                value_to_metric,
                path: path.clone(),
                metadata: metadata.clone(),
            })
        });
        let index = domain.levels.len();
        domain.levels.push(Level {
            rule,
            below: Node::default(),
        });
        if value.contains('*') {
            if node
                .wildcards
                .iter()
                .any(|w| w.key == key && w.value == value)
            {
                p.push(&at, format_args!("duplicate descriptor '{path}'"));
            }
            node.wildcards.push(Wildcard {
                parts: value.split('*').map(str::to_owned).collect(),
                key,
                value,
                share,
                level: index,
            });
        } else if node
            .exact
            .entry(key)
            .or_default()
            .insert(value, index)
            .is_some()
        {
            p.push(&at, format_args!("duplicate descriptor '{path}'"));
        }
        if let Some(below) = d.get("descriptors") {
            let mut child = Node::default();
            descriptors(
                below,
                &format!("{at}.descriptors"),
                &path,
                depth + 1,
                domain,
                &mut child,
                p,
            );
            domain.levels[index].below = child;
        }
    }
}

/// A `rate_limit` mapping read: (name, limit or `None` for unlimited, names it replaces).
type RateLimitField = (String, Option<(u32, Unit)>, Vec<String>);

/// A `rate_limit` mapping.
fn rate_limit(r: &Value, at: &str, p: &mut FileProblems<'_>) -> Option<RateLimitField> {
    let Some(r) = r.as_object() else {
        p.push(at, "must be a mapping");
        return None;
    };
    unknown_keys(r, RATE_LIMIT_KEYS, at, p);
    let name = r.get("name").and_then(scalar).unwrap_or_default();
    let unlimited = matches!(r.get("unlimited"), Some(Value::Bool(true)));
    let unit = r.get("unit").map(|u| (scalar(u).unwrap_or_default(), u));
    let limit = match (unlimited, unit) {
        (true, Some((u, _))) if Unit::parse(&u).is_some() => {
            p.push(&format!("{at}.unit"), "should not be given with unlimited");
            None
        }
        (true, _) => None,
        (false, unit) => {
            let u = unit.map(|(u, _)| u).unwrap_or_default();
            let unit = Unit::parse(&u);
            if unit.is_none() {
                p.push(
                    &format!("{at}.unit"),
                    format_args!("invalid rate limit unit '{u}'"),
                );
            }
            let n = match r.get("requests_per_unit") {
                None => Some(0),
                Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()),
            };
            if n.is_none() {
                p.push(
                    &format!("{at}.requests_per_unit"),
                    "must be a whole number from 0 to 4294967295",
                );
            }
            Some((n?, unit?))
        }
    };
    let mut replaces = Vec::new();
    match r.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, e) in list.iter().enumerate() {
                let at = format!("{at}.replaces[{i}]");
                match e.get("name").and_then(scalar) {
                    Some(n) if n.is_empty() => p.push(&at, "should not have an empty name"),
                    Some(n) if n == name => p.push(
                        &at,
                        "replaces should not contain the name of the same descriptor",
                    ),
                    Some(n) => replaces.push(n),
                    None => p.push(&at, "must be a mapping with a 'name'"),
                }
            }
        }
        Some(_) => p.push(&format!("{at}.replaces"), "must be a list"),
    }
    if unlimited || limit.is_some() {
        Some((name, limit, replaces))
    } else {
        None
    }
}

fn unknown_keys(
    map: &serde_json::Map<String, Value>,
    known: &[&str],
    at: &str,
    p: &mut FileProblems<'_>,
) {
    for k in map.keys().filter(|k| !known.contains(&k.as_str())) {
        let at = if at.is_empty() { "file" } else { at };
        p.push(at, format_args!("unknown key '{k}'"));
    }
}

/// A YAML scalar as text (YAML's `value: 42` is the string "42", as Go's yaml reads it).
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(files: &[&str]) -> Result<RuleSet, Problems> {
        let files: Vec<(String, String)> = files
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("f{i}.yaml"), t.to_string()))
            .collect();
        RuleSet::parse(&files, false)
    }

    fn find<'a>(s: &'a RuleSet, domain: &str, entries: &[(&str, &str)]) -> Option<&'a str> {
        s.domain(domain)?
            .find(entries)
            .map(|f| f.rule.path.as_str())
    }

    #[test]
    fn merged_domains_are_one_tree_where_a_descriptor_is_still_defined_once() {
        let files = |texts: &[&str]| -> Vec<(String, String)> {
            texts
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("f{i}.yaml"), t.to_string()))
                .collect()
        };
        let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
        let b = "domain: d\ndescriptors:\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: hour, requests_per_unit: 2}\n";
        let other = "domain: e\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
        let s = RuleSet::parse(&files(&[a, other, b]), true).unwrap();
        assert_eq!(s.domain_count(), 2);
        assert_eq!(find(&s, "d", &[("a", "x")]), Some("d.a"));
        assert_eq!(find(&s, "d", &[("b", ""), ("c", "y")]), Some("d.b.c"));
        assert_eq!(find(&s, "e", &[("a", "x")]), Some("e.a"));
        let err = RuleSet::parse(&files(&[a, a]), true).unwrap_err();
        assert_eq!(
            err.0,
            ["f1.yaml: descriptors[0]: duplicate descriptor 'd.a'"]
        );
        let err = RuleSet::parse(&files(&[a, b]), false).unwrap_err();
        assert_eq!(
            err.0,
            ["f1.yaml: domain: domain 'd' is also defined in f0.yaml"]
        );
    }

    /// envoyproxy/ratelimit's README example, abridged: the exact value first, then wildcards,
    /// then the key alone, and a rule only at the depth of the last entry.
    #[test]
    fn matching_follows_envoyproxy_ratelimit() {
        let s = set(&["
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: user*
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: database
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: remote_address
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 10}
"])
        .unwrap();
        assert_eq!(
            find(&s, "mongo_cps", &[("database", "users")]),
            Some("mongo_cps.database_users")
        );
        assert_eq!(
            find(&s, "mongo_cps", &[("database", "user1")]),
            Some("mongo_cps.database_user*")
        );
        assert_eq!(
            find(&s, "mongo_cps", &[("database", "other")]),
            Some("mongo_cps.database")
        );
        assert_eq!(
            find(
                &s,
                "mongo_cps",
                &[("remote_address", "1.2.3.4"), ("path", "/a")]
            ),
            Some("mongo_cps.remote_address.path")
        );
        assert_eq!(
            find(&s, "mongo_cps", &[("remote_address", "1.2.3.4")]),
            None
        );
        assert_eq!(
            find(&s, "mongo_cps", &[("database", "users"), ("path", "/a")]),
            None,
            "a rule applies at the depth of the last entry only"
        );
        assert_eq!(find(&s, "other", &[("database", "users")]), None);
    }

    #[test]
    fn shared_wildcards_name_one_counter() {
        let s = set(&["
domain: d
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 10}
"])
        .unwrap();
        let f = s
            .domain("d")
            .unwrap()
            .find(&[("path", "/files/a")])
            .unwrap();
        assert_eq!(f.counted_value(0, "/files/a"), "/files/*");
    }

    #[test]
    fn every_problem_is_listed_with_where_it_is() {
        let err = set(&[
            "
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: a
    rate_limt: {}
  - value: x
  - key: b
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: -1, unlimited: false}
  - key: c
    rate_limit: {unlimited: true, unit: second}
  - key: e
    rate_limit: {unit: minute, requests_per_unit: 1, name: e, replaces: [{name: e}]}
",
            "domain: d\n",
            "domain: [",
        ])
        .unwrap_err();
        let want = [
            "f0.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'",
            "f0.yaml: descriptors[1]: unknown key 'rate_limt'",
            "f0.yaml: descriptors[1]: duplicate descriptor 'd.a'",
            "f0.yaml: descriptors[2]: descriptor has an empty or missing key",
            "f0.yaml: descriptors[3].quota_mode: quota_mode is not supported by quotagate",
            "f0.yaml: descriptors[3].rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295",
            "f0.yaml: descriptors[4].rate_limit.unit: should not be given with unlimited",
            "f0.yaml: descriptors[5].rate_limit.replaces[0]: replaces should not contain the name of the same descriptor",
            "f1.yaml: domain: domain 'd' is also defined in f0.yaml",
        ];
        for w in want {
            assert!(err.0.iter().any(|p| p == w), "missing {w:?} in {err:#?}");
        }
        assert!(
            err.0
                .iter()
                .any(|p| p.starts_with("f2.yaml: file: not YAML")),
            "{err:#?}"
        );
    }

    #[test]
    fn units_are_envoyproxy_ratelimits() {
        assert_eq!(Unit::parse("SECOND").map(Unit::seconds), Some(1));
        assert_eq!(Unit::parse("week").map(Unit::seconds), Some(604_800));
        assert_eq!(Unit::parse("month").map(Unit::seconds), Some(2_592_000));
        assert_eq!(Unit::parse("year").map(Unit::seconds), Some(31_536_000));
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::from_proto(0), None);
        assert_eq!(Unit::from_proto(7), Some(Unit::Week));
    }

    #[test]
    fn aliases_cannot_blow_up_memory() {
        // 10^12 strings if expanded; the parser's budget (250000 nodes by default) stops it.
        let mut bomb = String::from("domain: d\na: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            bomb.push_str(&format!(
                "{}: &{} [*{}, *{}, *{}, *{}, *{}, *{}, *{}, *{}, *{}, *{}]\n",
                (b'a' + i) as char,
                (b'a' + i) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char
            ));
        }
        let err = set(&[&bomb]).unwrap_err();
        assert!(
            err.0[0].contains("not YAML") && err.0[0].contains("budget breached"),
            "{err}"
        );
    }
}
