//! json: the JSON form of Divvy rule files (`overrides` then `default`).

use super::raw::{Problem, RawRule};

pub(super) fn parse_json(text: &str) -> Result<Vec<RawRule>, Problem> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let as_text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    };
    let rule = |v: &serde_json::Value, name: String| -> Result<RawRule, Problem> {
        let obj = v
            .as_object()
            .ok_or_else(|| format!("{name} is not an object"))?;
        let mut operation = Vec::new();
        if let Some(op) = obj.get("operation") {
            let op = op
                .as_object()
                .ok_or_else(|| format!("{name}: operation is not an object"))?;
            for (k, v) in op {
                operation.push((k.clone(), as_text(v).unwrap_or_default()));
            }
        }
        let field = |f: &str| obj.get(f).and_then(as_text).filter(|s| !s.is_empty());
        Ok(RawRule {
            operation,
            credit_limit: field("creditLimit"),
            reset_seconds: field("resetSeconds"),
            actor_field: field("actorField"),
            match_policy: field("matchPolicy"),
            label: field("label"),
            comment: field("comment"),
            name,
        })
    };
    let mut rules = Vec::new();
    if let Some(overrides) = doc.get("overrides") {
        let list = overrides.as_array().ok_or("overrides is not a list")?;
        for (i, v) in list.iter().enumerate() {
            rules.push(rule(v, format!("overrides[{i}]"))?);
        }
    }
    if let Some(d) = doc.get("default") {
        rules.push(rule(d, "default".into())?);
    }
    Ok(rules)
}
