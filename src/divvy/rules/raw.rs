//! raw: a rule as the INI and JSON readers give it, before validation, and what they say is wrong.

/// What is wrong with a rule file, in one line (the file's name is added by [`super::RuleError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem(pub(super) String);

impl From<String> for Problem {
    fn from(s: String) -> Problem {
        Problem(s)
    }
}

impl From<&str> for Problem {
    fn from(s: &str) -> Problem {
        Problem(s.to_owned())
    }
}

/// A rule as read from a file, before validation.
#[derive(Debug, Default)]
pub(super) struct RawRule {
    pub(super) operation: Vec<(String, String)>,
    pub(super) credit_limit: Option<String>,
    pub(super) reset_seconds: Option<String>,
    pub(super) actor_field: Option<String>,
    pub(super) match_policy: Option<String>,
    pub(super) label: Option<String>,
    pub(super) comment: Option<String>,
    /// How the file named it, for messages.
    pub(super) name: String,
}
