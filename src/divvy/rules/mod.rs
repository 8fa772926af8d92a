//! rules: Divvy rule files (INI and JSON), their validation, and which rules a request matches.
//!
//! Rules are tried in file order; every matching `canary` rule before the first matching `stop` rule
//! is evaluated too (its quota is consumed, its answer discarded). The last rule must be the default
//! (empty operation). Values: exactly `*` means "the key is present"; a value with `*` is a glob in
//! which every `*` matches any run of characters and the whole value must match; anything else must
//! be equal. A key absent from the request never matches `*` or a glob. These fix Divvy's prefix-only
//! globs and its "undefined" quirks (`docs/divvy.md`). Pure: parsing and matching, no I/O beyond
//! reading the file in [`RuleSet::load`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

mod glob;
mod ini;
mod json;
mod raw;

use glob::Pattern;
use ini::parse_ini;
use json::parse_json;
use raw::{Problem, RawRule};

/// Largest rule file accepted. Default: 16 MiB.
pub const MAX_RULE_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Whether a rule decides (`stop`) or only observes (`canary`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchPolicy {
    Stop,
    Canary,
}

/// One rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Position in the rule file (0-based).
    pub index: usize,
    /// (key, value text), sorted by key.
    operation: Vec<(String, String)>,
    patterns: Vec<(String, Pattern)>,
    pub credit_limit: u64,
    /// 0 with a credit limit above 0: always allow.
    /// At most `u32::MAX` (136 years).
    pub reset_seconds: u32,
    pub actor_field: Option<String>,
    pub match_policy: MatchPolicy,
    pub label: Option<String>,
    pub comment: Option<String>,
}

impl Rule {
    /// The rule's operation as Divvy's counter keys spell it: sorted `k=v` joined by spaces.
    pub fn bucket(&self) -> String {
        self.operation
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn matches(&self, request: &HashMap<String, String>) -> bool {
        self.patterns
            .iter()
            .all(|(k, p)| p.matches(request.get(k).map(String::as_str)))
    }

    /// The actor of a request under this rule: the value of `actorField`, `""` when absent.
    pub fn actor<'a>(&self, request: &'a HashMap<String, String>) -> &'a str {
        self.actor_field
            .as_ref()
            .and_then(|f| request.get(f))
            .map_or("", String::as_str)
    }
}

impl fmt::Display for Rule {
    /// The rule as an INI section name: `[method=GET path=/x]`, `[default]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operation.is_empty() {
            f.write_str("[default]")
        } else {
            write!(f, "[{}]", self.bucket())
        }
    }
}

/// A loaded, validated rule file.
#[derive(Debug, Clone)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

/// Why a rule file was refused: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule file {file}: {reason}")]
pub struct RuleError {
    pub file: String,
    pub reason: String,
}

fn validate(raw: Vec<RawRule>) -> Result<Vec<Rule>, Problem> {
    let label_ok = |l: &str| {
        (1..=255).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    let mut labels = HashSet::new();
    for r in raw {
        let name = &r.name;
        let number = |what: &str, v: &Option<String>| -> Result<Option<u64>, Problem> {
            match v {
                None => Ok(None),
                Some(s) => s.trim().parse::<u64>().map(Some).map_err(|_| {
                    Problem(format!(
                        "rule {name}: {what} {s:?} is not a whole number of 0 or more"
                    ))
                }),
            }
        };
        let credit_limit = number("creditLimit", &r.credit_limit)?
            .ok_or_else(|| format!("rule {name}: creditLimit is missing"))?;
        let reset_seconds = match number("resetSeconds", &r.reset_seconds)? {
            Some(s) => u32::try_from(s).map_err(|_| {
                Problem(format!(
                    "rule {name}: resetSeconds {s} is above {} (136 years)",
                    u32::MAX
                ))
            })?,
            None if credit_limit == 0 => 0,
            None => {
                return Err(
                    format!("rule {name}: resetSeconds is missing (0 means always allow)").into(),
                );
            }
        };
        let match_policy = match r.match_policy.as_deref() {
            None | Some("stop") => MatchPolicy::Stop,
            Some("canary") => MatchPolicy::Canary,
            Some(p) => {
                return Err(
                    format!("rule {name}: matchPolicy {p:?} is neither stop nor canary").into(),
                );
            }
        };
        if let Some(l) = &r.label {
            if !label_ok(l) {
                return Err(format!(
                    "rule {name}: label {l:?} must be 1 to 255 of A-Z a-z 0-9 _ -"
                )
                .into());
            }
            if !labels.insert(l.clone()) {
                return Err(
                    format!("rule {name}: another rule already has the label {l:?}").into(),
                );
            }
        }
        let mut operation = r.operation;
        operation.sort();
        let patterns = operation
            .iter()
            .map(|(k, v)| (k.clone(), Pattern::new(v)))
            .collect();
        let rule = Rule {
            index: rules.len(),
            operation,
            patterns,
            credit_limit,
            reset_seconds,
            actor_field: r.actor_field,
            match_policy,
            label: r.label,
            comment: r.comment,
        };
        // A rule is unreachable when an earlier stop rule matches its own pattern text as a request.
        let as_request: HashMap<String, String> = rule.operation.iter().cloned().collect();
        if let Some(mask) = rules
            .iter()
            .find(|e| e.match_policy == MatchPolicy::Stop && e.matches(&as_request))
        {
            return Err(format!(
                "rule {name} is unreachable: every request it matches is taken by the earlier rule {mask}"
            ).into());
        }
        rules.push(rule);
    }
    match rules.last() {
        None => Err("no rules are defined".into()),
        Some(last) if !last.operation.is_empty() => Err(format!(
            "the last rule must be the default rule [default] (empty operation), but it is {last}"
        )
        .into()),
        Some(_) => Ok(rules),
    }
}

impl RuleSet {
    /// Parses and validates rules; `name` says which file in errors, and its extension the format.
    pub fn parse(name: &str, text: &str) -> Result<RuleSet, RuleError> {
        let fail = |p: Problem| RuleError {
            file: name.to_owned(),
            reason: p.0,
        };
        let raw = if name.ends_with(".json") {
            parse_json(text)
        } else {
            parse_ini(text)
        }
        .map_err(fail)?;
        validate(raw).map(|rules| RuleSet { rules }).map_err(fail)
    }

    /// Reads a `.ini` or `.json` rule file.
    pub fn load(path: &Path) -> Result<RuleSet, RuleError> {
        let name = path.display().to_string();
        let text = crate::config::files::read_capped(path, MAX_RULE_FILE_BYTES).map_err(|e| {
            RuleError {
                file: name.clone(),
                reason: format!("cannot read it: {e}"),
            }
        })?;
        RuleSet::parse(&name, &text)
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rules a request evaluates, in order: matching canaries, then the first matching stop rule
    /// (which decides). Never empty: the default rule matches everything.
    pub fn matching<'a>(&'a self, request: &HashMap<String, String>) -> Vec<&'a Rule> {
        let mut out = Vec::new();
        for rule in &self.rules {
            if rule.matches(request) {
                out.push(rule);
                if rule.match_policy == MatchPolicy::Stop {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ini(text: &str) -> Result<RuleSet, String> {
        RuleSet::parse("t.ini", text).map_err(|e| e.reason)
    }

    fn decider(set: &RuleSet, pairs: &[(&str, &str)]) -> String {
        set.matching(&req(pairs)).last().unwrap().to_string()
    }

    const README: &str = "
; The rules of Divvy's README
[method=GET path=/pantry/cookies ip=*]
creditLimit = 3
resetSeconds = 3600
actorField = 'ip'
comment = '3 cookies per hour per IP'

[method=POST path=/cgi-bin/*]
creditLimit = 60  ; per minute
resetSeconds = 60

[default]
creditLimit = 0
comment = 'Default deny!'
";

    #[test]
    fn the_first_matching_rule_decides() {
        let s = ini(README).unwrap();
        assert_eq!(
            decider(
                &s,
                &[
                    ("method", "GET"),
                    ("path", "/pantry/cookies"),
                    ("ip", "1.2.3.4")
                ]
            ),
            "[ip=* method=GET path=/pantry/cookies]"
        );
        assert_eq!(
            decider(&s, &[("method", "GET"), ("path", "/pantry/cookies")]),
            "[default]",
            "`*` needs the key"
        );
        assert_eq!(
            decider(
                &s,
                &[("method", "GET"), ("path", "/pantry/cookies"), ("ip", "")]
            )
            .as_str(),
            "[ip=* method=GET path=/pantry/cookies]",
            "empty is present"
        );
        assert_eq!(
            decider(&s, &[("method", "POST"), ("path", "/cgi-bin/upload.cgi")]),
            "[method=POST path=/cgi-bin/*]"
        );
        let r = &s.rules()[0];
        assert_eq!(
            (r.credit_limit, r.reset_seconds, r.actor_field.as_deref()),
            (3, 3600, Some("ip"))
        );
        assert_eq!(s.rules()[1].credit_limit, 60, "inline comment stripped");
        assert_eq!(s.rules()[2].comment.as_deref(), Some("Default deny!"));
        assert_eq!(r.actor(&req(&[("ip", "9.9.9.9")])), "9.9.9.9");
        assert_eq!(r.bucket(), "ip=* method=GET path=/pantry/cookies");
    }

    #[test]
    fn globs_match_whole_values_and_every_star() {
        let g = |p: &str, v: &str| Pattern::new(p).matches(Some(v));
        assert!(g("/v1/billing/*", "/v1/billing/"));
        assert!(g("/v1/billing/*", "/v1/billing/a/b"));
        assert!(!g("/v1/billing/*", "/v1/billing"));
        assert!(g("/v1/*/status", "/v1/x/status"));
        assert!(
            !g("/v1/*/status", "/v1/x/status/more"),
            "anchored at the end"
        );
        assert!(!g("/v1/*/status", "/v1/x/statuses"));
        assert!(g("*-prod", "api-prod"));
        assert!(!g("*-prod", "api-prod-eu"));
        assert!(g("/m/*/n/*", "/m/a/n/b"));
        assert!(g("/a/**", "/a/x"), "** is valid");
        assert!(g("a?b.[c]*", "a?b.[c]zz"), "only * is special");
        assert!(!g("a?b", "axb"));
        assert!(
            !Pattern::new("und*").matches(None),
            "an absent key never matches a glob"
        );
        assert!(!g("ab*ba", "aba"), "pieces may not overlap");
    }

    #[test]
    fn canaries_are_collected_until_the_deciding_rule() {
        let s = ini("[a=1]\ncreditLimit=5\nresetSeconds=60\nmatchPolicy=canary\nlabel=c1\n[a=1 b=2]\ncreditLimit=2\nresetSeconds=60\n[a=*]\ncreditLimit=9\nresetSeconds=60\n[default]\ncreditLimit=1\nresetSeconds=1\n").unwrap();
        let names = |pairs: &[(&str, &str)]| {
            s.matching(&req(pairs))
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&[("a", "1"), ("b", "2")]), ["[a=1]", "[a=1 b=2]"]);
        assert_eq!(names(&[("a", "1")]), ["[a=1]", "[a=*]"]);
        assert_eq!(names(&[("c", "1")]), ["[default]"]);
    }

    #[test]
    fn unreachable_rules_are_refused_naming_both() {
        for (text, want) in [
            (
                "[a=1]\ncreditLimit=1\nresetSeconds=1\n[a=1 b=2]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
                "rule [a=1 b=2] (line 4) is unreachable: every request it matches is taken by the earlier rule [a=1]",
            ),
            (
                "[p=/a/*]\ncreditLimit=1\nresetSeconds=1\n[p=/a/b]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
                "earlier rule [p=/a/*]",
            ),
            (
                "[p=/a/*]\ncreditLimit=1\nresetSeconds=1\n[p=/a/b/*]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
                "earlier rule [p=/a/*]",
            ),
            (
                "[c=1 k=*]\ncreditLimit=1\nresetSeconds=1\n[c=1 k=v]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
                "earlier rule [c=1 k=*]",
            ),
            (
                "[default]\ncreditLimit=0\n[a=1]\ncreditLimit=1\nresetSeconds=1\n",
                "earlier rule [default]",
            ),
        ] {
            let e = ini(text).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        for ok in [
            "[a=1 b=2]\ncreditLimit=1\nresetSeconds=1\n[a=1]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
            "[c=1 k=v]\ncreditLimit=1\nresetSeconds=1\n[c=1 k=*]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
            "[p=/a/b/*]\ncreditLimit=1\nresetSeconds=1\n[p=/a/*]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
            "[a=1]\ncreditLimit=1\nresetSeconds=1\nmatchPolicy=canary\n[a=1]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
            // what Divvy wrongly refuses
            "[k=*]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
            "[ip=10.0.0.1]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
            "[p=/a/**]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=5\nresetSeconds=0\n",
            "[default]\ncreditLimit=1\nresetSeconds=1\nmatchPolicy=canary\n",
        ] {
            assert!(ini(ok).is_ok(), "{ok}: {:?}", ini(ok));
        }
    }

    #[test]
    fn load_time_checks_name_the_rule() {
        for (text, want) in [
            (
                "[a=1]\nresetSeconds=1\n[default]\ncreditLimit=0\n",
                "rule [a=1] (line 1): creditLimit is missing",
            ),
            (
                "[a=1]\ncreditLimit=-1\nresetSeconds=1\n[default]\ncreditLimit=0\n",
                "rule [a=1] (line 1): creditLimit \"-1\" is not a whole number",
            ),
            (
                "[a=1]\ncreditLimit=5\n[default]\ncreditLimit=0\n",
                "rule [a=1] (line 1): resetSeconds is missing",
            ),
            (
                "[a=1]\ncreditLimit=5\nresetSeconds=x\n[default]\ncreditLimit=0\n",
                "resetSeconds \"x\"",
            ),
            (
                "[a=1]\ncreditLimit=5\nresetSeconds=1\nmatchPolicy=Stop\n[default]\ncreditLimit=0\n",
                "matchPolicy \"Stop\" is neither",
            ),
            (
                "[a=1]\ncreditLimit=5\nresetSeconds=1\nlabel=no spaces\n[default]\ncreditLimit=0\n",
                "label \"no spaces\"",
            ),
            (
                "[a=1]\ncreditLimit=5\nresetSeconds=1\nlabel=x\n[default]\ncreditLimit=0\nlabel=x\n",
                "rule [default] (line 5): another rule already has the label \"x\"",
            ),
            (
                "[a=1]\ncreditLimit=5\nresetSeconds=1\n",
                "the last rule must be the default rule",
            ),
            ("", "no rules are defined"),
            (
                "creditLimit=1\n[default]\ncreditLimit=0\n",
                "line 1: \"creditLimit=1\" comes before the first [section]",
            ),
            (
                "[a=1 a=2]\ncreditLimit=0\n[default]\ncreditLimit=0\n",
                "names the key \"a\" twice",
            ),
        ] {
            let e = ini(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn ini_details() {
        let s = ini("# comment\r\n[a=1]\r\ncreditLimit = \"4\"\r\nresetSeconds = 2 # two\r\nlabel = null\r\nactorField = \"who\"\r\n[default]\r\ncreditLimit = 0\r\n").unwrap();
        let r = &s.rules()[0];
        assert_eq!(
            (
                r.credit_limit,
                r.reset_seconds,
                r.label.as_deref(),
                r.actor_field.as_deref()
            ),
            (4, 2, None, Some("who"))
        );
        let s = ini("[flag]\ncreditLimit=1\nresetSeconds=1\n[default]\ncreditLimit=0\n").unwrap();
        assert_eq!(
            decider(&s, &[("flag", "")]),
            "[flag=]",
            "a token without = means the empty value"
        );
        assert_eq!(decider(&s, &[("flag", "x")]), "[default]");
    }

    #[test]
    fn json_rule_files() {
        let s = RuleSet::parse(
            "r.json",
            r#"{"overrides": [{"operation": {"method": "GET", "n": 5}, "creditLimit": 3, "resetSeconds": 60, "label": "get"}],
                "default": {"operation": {}, "creditLimit": 0}}"#,
        )
        .unwrap();
        assert_eq!(
            decider(&s, &[("method", "GET"), ("n", "5")]),
            "[method=GET n=5]"
        );
        assert_eq!(s.rules()[0].label.as_deref(), Some("get"));
        // no crash where Divvy crashes: a default without overrides, or without operation
        assert!(RuleSet::parse("r.json", r#"{"default": {"creditLimit": 0}}"#).is_ok());
        let e = RuleSet::parse("r.json", r#"{"overrides": 5}"#).unwrap_err();
        assert_eq!(e.to_string(), "rule file r.json: overrides is not a list");
    }
}
