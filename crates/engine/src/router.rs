//! router: which catalog endpoint a (method, normalised path) is.
//!
//! One `matchit` router per upper-cased method, built once per catalog version and never mutated.
//! A template segment that contains `{...}` is a parameter matching exactly one path segment
//! (DynLimits drops any text around the braces the same way). Matching is ASCII case-insensitive and
//! ignores a trailing slash (see `path`); a match also yields the canonical path to forward: the
//! template's own spelling with the request's parameter values, so what the upstream receives is
//! exactly the endpoint that was counted.
//!
//! Pure: no I/O; rebuilt per catalog version.

use std::collections::HashMap;

use crate::path::{EscapedSlashes, NormalPath, normalize_segment};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Static(String),
    Param,
}

/// One catalog endpoint: a method and a path template.
#[derive(Debug, Clone)]
pub struct Template {
    /// Upper-cased method, e.g. `GET`.
    pub method: String,
    /// The template as written in the catalog, e.g. `/users/{id}/prefs`.
    pub path: String,
    segments: Vec<Segment>,
    trailing_slash: bool,
    /// The shape matchit sees: lower-case statics, parameters named by position.
    route_key: String,
    /// Whether its statics are written in lower case: a request path without upper-case letters
    /// that matched it then spells them as it does (see [`Template::is_canonical`]).
    lower: bool,
}

/// Why a catalog template was refused, said in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

impl From<String> for TemplateError {
    fn from(s: String) -> TemplateError {
        TemplateError(s)
    }
}

impl Template {
    /// Parses a catalog template; the error says what is wrong with it.
    pub fn parse(method: &str, path: &str) -> Result<Template, TemplateError> {
        let method = method.to_ascii_uppercase();
        if method.is_empty() || http::Method::from_bytes(method.as_bytes()).is_err() {
            return Err(format!("{method:?} is not a valid HTTP method").into());
        }
        let Some(rest) = path.strip_prefix('/') else {
            return Err(format!("path {path:?} must start with '/'").into());
        };
        if let Some(c) = path
            .chars()
            .find(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#'))
        {
            return Err(format!(
                "path {path:?} contains {c:?}; templates are printable ASCII without '?' or '#'"
            )
            .into());
        }
        let mut segments = Vec::new();
        let mut trailing_slash = false;
        let raw: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        for (i, seg) in raw.iter().enumerate() {
            if seg.is_empty() {
                if i + 1 == raw.len() {
                    trailing_slash = true;
                    continue;
                }
                return Err(format!("path {path:?} has an empty segment").into());
            }
            let open = seg.find('{');
            let close = seg.rfind('}');
            match (open, close) {
                (Some(o), Some(c)) if o < c => segments.push(Segment::Param),
                (None, None) => {
                    let norm = normalize_segment(seg, EscapedSlashes::Keep)
                        .map_err(|e| format!("path {path:?}: {e}"))?;
                    if norm == "." || norm == ".." {
                        return Err(format!("path {path:?} has a dot segment").into());
                    }
                    segments.push(Segment::Static(norm.into_owned()));
                }
                _ => return Err(format!("path {path:?} has unbalanced braces in {seg:?}").into()),
            }
        }
        let mut route_key = String::new();
        for (i, seg) in segments.iter().enumerate() {
            route_key.push('/');
            match seg {
                Segment::Static(s) => route_key.push_str(&s.to_ascii_lowercase()),
                Segment::Param => route_key.push_str(&format!("{{p{i}}}")),
            }
        }
        if route_key.is_empty() {
            route_key.push('/');
        }
        let lower = segments.iter().all(|s| match s {
            Segment::Static(s) => !crate::ascii::has_upper(s.as_bytes()),
            Segment::Param => true,
        });
        Ok(Template {
            method,
            path: path.to_owned(),
            segments,
            trailing_slash,
            route_key,
            lower,
        })
    }

    /// Whether `req` (which matched) is spelled as [`Template::canonical_path`] would spell it:
    /// each static segment as written here, and the trailing slash where the template has one.
    /// `req_lower`: `req` has no upper-case letter. It matched the route key, whose statics are
    /// the template's in lower case; when the template writes them so too, they are already
    /// spelled as here, and comparing them segment by segment (a scan of the path, ~100
    /// instructions a request) would tell nothing new.
    fn is_canonical(&self, req: &NormalPath, req_lower: bool) -> bool {
        let statics = (req_lower && self.lower)
            || self
                .segments
                .iter()
                .zip(req.segments())
                .all(|(seg, value)| match seg {
                    Segment::Static(s) => s == value,
                    Segment::Param => true,
                });
        statics && (self.segments.is_empty() || self.trailing_slash == req.trailing_slash)
    }

    /// The template's spelling with the request's parameter values. `req` must have matched.
    fn canonical_path(&self, req: &NormalPath) -> String {
        let mut out = String::new();
        for (seg, value) in self.segments.iter().zip(req.segments()) {
            out.push('/');
            match seg {
                Segment::Static(s) => out.push_str(s),
                Segment::Param => out.push_str(value),
            }
        }
        if out.is_empty() || self.trailing_slash {
            out.push('/');
        }
        out
    }
}

/// A matched endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    /// Index of the endpoint in the catalog.
    pub endpoint: usize,
    /// The path to forward upstream; `None`: the request's own, as it came.
    pub path: Option<String>,
}

/// The routes of one catalog version.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// One router per method (upper case). A list, not a map: there are a handful, and comparing
    /// a method costs less than hashing it on every request.
    routers: Vec<(String, matchit::Router<usize>)>,
    templates: Vec<Template>,
}

impl RouteTable {
    /// Builds the table; endpoint `i` is `templates[i]`. Returns every conflict as
    /// `(index, reason)`; a table is only built when there are none.
    pub fn build(templates: Vec<Template>) -> Result<RouteTable, Vec<(usize, String)>> {
        let mut errors = Vec::new();
        let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
        let mut routers: Vec<(String, matchit::Router<usize>)> = Vec::new();
        for (i, t) in templates.iter().enumerate() {
            if let Some(&first) = seen.get(&(t.method.as_str(), t.route_key.as_str())) {
                let other = &templates[first];
                errors.push((
                    i,
                    format!(
                        "{} {} is the same route as endpoint {first} ({} {})",
                        t.method, t.path, other.method, other.path
                    ),
                ));
                continue;
            }
            seen.insert((&t.method, &t.route_key), i);
            let at = match routers.iter().position(|(m, _)| *m == t.method) {
                Some(at) => at,
                None => {
                    routers.push((t.method.clone(), matchit::Router::new()));
                    routers.len() - 1
                }
            };
            if let Err(e) = routers[at].1.insert(t.route_key.clone(), i) {
                errors.push((
                    i,
                    format!("{} {} conflicts with another route: {e}", t.method, t.path),
                ));
            }
        }
        if errors.is_empty() {
            Ok(RouteTable { routers, templates })
        } else {
            Err(errors)
        }
    }

    /// Finds the endpoint for `method` (any case) and a normalised path; `Err` gives the path
    /// back when none matches.
    pub fn lookup<'p>(
        &self,
        method: &str,
        path: NormalPath<'p>,
    ) -> Result<RouteMatch, NormalPath<'p>> {
        let Some((_, router)) = self
            .routers
            .iter()
            .find(|(m, _)| m == method || m.eq_ignore_ascii_case(method))
        else {
            return Err(path);
        };
        let key = path.match_key();
        let req_lower = matches!(key, std::borrow::Cow::Borrowed(_));
        let found = router.at(&key).ok().map(|m| *m.value);
        drop(key);
        let Some(endpoint) = found else {
            return Err(path);
        };
        let template = &self.templates[endpoint];
        // Usually the client spelled the endpoint as the template does: its path is then the
        // canonical one, without a string built again (an allocation a request).
        let path = match template.is_canonical(&path, req_lower) {
            true => path.into_path(),
            false => Some(template.canonical_path(&path)),
        };
        Ok(RouteMatch { endpoint, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::normalize;

    fn table(routes: &[(&str, &str)]) -> RouteTable {
        RouteTable::build(
            routes
                .iter()
                .map(|(m, p)| Template::parse(m, p).unwrap())
                .collect(),
        )
        .unwrap()
    }

    fn find(t: &RouteTable, m: &str, p: &str) -> Option<(usize, String)> {
        let n = normalize(p, EscapedSlashes::Reject).ok()?;
        let slow = t
            .templates
            .iter()
            .map(|t| t.canonical_path(&n))
            .collect::<Vec<_>>();
        let r = t.lookup(m, n).ok()?;
        // Whichever way the path was made, it is the template's spelling.
        let path = r.path.unwrap_or_else(|| p.to_owned());
        assert_eq!(path, slow[r.endpoint]);
        Some((r.endpoint, path))
    }

    #[test]
    fn params_match_one_segment_and_statics_win() {
        let t = table(&[
            ("GET", "/users/{id}/prefs"),
            ("GET", "/users/me/prefs"),
            ("POST", "/users"),
        ]);
        assert_eq!(
            find(&t, "GET", "/users/42/prefs"),
            Some((0, "/users/42/prefs".into()))
        );
        assert_eq!(
            find(&t, "GET", "/users/me/prefs"),
            Some((1, "/users/me/prefs".into()))
        );
        assert_eq!(find(&t, "GET", "/users/4/2/prefs"), None);
        assert_eq!(find(&t, "GET", "/users//prefs"), None);
        assert_eq!(find(&t, "POST", "/users/42/prefs"), None);
        assert_eq!(find(&t, "GET", "/users"), None);
    }

    #[test]
    fn spelling_tricks_reach_the_same_endpoint_and_forward_canonically() {
        let t = table(&[("GET", "/users/{id}/prefs")]);
        for p in [
            "/USERS/Ab/PREFS",
            "//users//Ab//prefs/",
            "/users/./x/../Ab/prefs",
            "/%75sers/Ab/pr%65fs",
        ] {
            assert_eq!(
                find(&t, "get", p),
                Some((0, "/users/Ab/prefs".into())),
                "{p}"
            );
        }
    }

    #[test]
    fn a_lower_case_path_is_forwarded_with_the_templates_capitals() {
        // Lower-case statics need no comparison (`Template::lower`); these do.
        let t = table(&[("GET", "/Users/{id}/PREFS"), ("GET", "/items/{id}/")]);
        assert_eq!(
            find(&t, "GET", "/users/ab/prefs"),
            Some((0, "/Users/ab/PREFS".into()))
        );
        assert_eq!(find(&t, "GET", "/items/ab"), Some((1, "/items/ab/".into())));
        assert_eq!(
            find(&t, "GET", "/items/ab/"),
            Some((1, "/items/ab/".into()))
        );
        assert_eq!(
            find(&t, "GET", "/Items/ab/"),
            Some((1, "/items/ab/".into()))
        );
    }

    #[test]
    fn query_is_not_part_of_matching() {
        let t = table(&[("GET", "/a/{x}")]);
        let uri: http::Uri = "/a/1?b=2".parse().unwrap();
        assert_eq!(find(&t, "GET", uri.path()), Some((0, "/a/1".into())));
    }

    #[test]
    fn brace_suffixes_are_whole_segment_params_like_dynlimits() {
        let t = table(&[("GET", "/f/{name}.json")]);
        assert_eq!(
            find(&t, "GET", "/f/report.csv"),
            Some((0, "/f/report.csv".into()))
        );
    }

    #[test]
    fn root_and_trailing_slash_templates() {
        let t = table(&[("GET", "/"), ("GET", "/items/")]);
        assert_eq!(find(&t, "GET", "/"), Some((0, "/".into())));
        assert_eq!(find(&t, "GET", "/items"), Some((1, "/items/".into())));
        assert_eq!(find(&t, "GET", "/items/"), Some((1, "/items/".into())));
        assert_eq!(find(&t, "GET", "//"), Some((0, "/".into())));
    }

    #[test]
    fn same_shape_routes_are_conflicts() {
        let err = RouteTable::build(vec![
            Template::parse("GET", "/a/{x}").unwrap(),
            Template::parse("get", "/A/{y}/").unwrap(),
            Template::parse("POST", "/a/{y}").unwrap(),
        ])
        .unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].0, 1);
        assert!(
            err[0].1.contains("same route as endpoint 0"),
            "{}",
            err[0].1
        );
    }

    #[test]
    fn bad_templates_are_explained() {
        for (m, p, want) in [
            ("GET", "users", "must start with '/'"),
            ("GET", "/a//b", "empty segment"),
            ("GET", "/a/{b", "unbalanced"),
            ("GET", "/a/../b", "dot segment"),
            ("GET", "/a b", "printable ASCII"),
            ("G ET", "/a", "not a valid HTTP method"),
            ("", "/a", "not a valid HTTP method"),
        ] {
            let e = Template::parse(m, p).unwrap_err();
            assert!(e.to_string().contains(want), "{m} {p}: {e}");
        }
    }
}
