//! text: wording shared by messages to people.

/// `1 rule`, `2 rules`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular() {
        assert_eq!(super::plural(1, "API key", "API keys"), "1 API key");
        assert_eq!(super::plural(0, "API key", "API keys"), "0 API keys");
    }
}
