//! The Divvy rule readers (INI and JSON) and the validation after them: any text is a rule set or
//! an error that names the file, never a panic; a loaded set matches any request.
#![no_main]
use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use quotagate::divvy::rules::RuleSet;

fuzz_target!(|data: &[u8]| {
    let Some((&format, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let name = if format % 2 == 0 { "f.ini" } else { "f.json" };
    if let Ok(set) = RuleSet::parse(name, &text) {
        let request: HashMap<String, String> = text
            .split_whitespace()
            .take(8)
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert!(
            !set.matching(&request).is_empty(),
            "the default rule matches everything"
        );
    }
});
