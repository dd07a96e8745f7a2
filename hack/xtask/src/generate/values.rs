//! The `chart-values` artifact: `docs/reference/chart-values.md`, the table of every value of
//! the chart, generated from `charts/warmcache/values.schema.json` (types, allowed values,
//! limits, descriptions) and `values.yaml` (defaults), so the documentation cannot drift from
//! what `helm install` accepts.

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{GeneratedFile, header};

/// What the table is generated from, as named in its header and in `--check` hints.
pub const SOURCE: &str = "charts/warmcache/values.schema.json and values.yaml";

const SCHEMA: &str = include_str!("../../../../charts/warmcache/values.schema.json");
const VALUES: &str = include_str!("../../../../charts/warmcache/values.yaml");

fn type_of(schema: &Value) -> String {
    match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => String::new(),
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn constraints(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let item = schema.get("items").unwrap_or(&Value::Null);
    for s in [schema, item] {
        if let Some(values) = s["enum"].as_array() {
            let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
            out.push(format!("one of {}", values.join(", ")));
        }
        if let Some(min) = s.get("minimum") {
            out.push(format!("at least {min}"));
        }
        if let Some(max) = s.get("maximum") {
            out.push(format!("at most {max}"));
        }
        if let Some(pattern) = s["pattern"].as_str() {
            out.push(format!("matches `{pattern}`"));
        }
        if s.get("minLength").and_then(Value::as_u64) == Some(1) {
            out.push("not empty".to_owned());
        }
    }
    if let Some(pattern) = schema
        .pointer("/propertyNames/pattern")
        .and_then(Value::as_str)
    {
        out.push(format!("keys match `{pattern}`"));
    }
    out
}

fn walk(path: &str, schema: &Value, defaults: &Value, rows: &mut Vec<String>) -> Result<()> {
    if let Some(properties) = schema["properties"].as_object()
        && !properties.is_empty()
    {
        if let Some(description) = schema["description"].as_str()
            && !path.is_empty()
        {
            rows.push(format!("| **`{path}`** | | | {} |", cell(description)));
        }
        for (name, property) in properties {
            let key = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            walk(
                &key,
                property,
                defaults.get(name).unwrap_or(&Value::Null),
                rows,
            )?;
        }
        return Ok(());
    }
    let Some(description) = schema["description"].as_str() else {
        bail!("values.schema.json: {path} has no description");
    };
    let default = match defaults {
        Value::Null => String::new(),
        Value::String(s) if s.is_empty() => "`\"\"`".to_owned(),
        other => format!(
            "`{}`",
            serde_json::to_string(other).context("a default value")?
        ),
    };
    let mut text = cell(description);
    let extra = constraints(schema);
    if !extra.is_empty() {
        text.push_str(&format!(" ({})", cell(&extra.join("; "))));
    }
    rows.push(format!(
        "| `{path}` | {} | {} | {text} |",
        type_of(schema),
        cell(&default)
    ));
    Ok(())
}

/// The artifact's source-of-truth function.
pub fn render_all() -> Result<Vec<GeneratedFile>> {
    let schema: Value = serde_json::from_str(SCHEMA).context("parsing values.schema.json")?;
    let defaults: Value = serde_saphyr::from_str(VALUES).context("parsing values.yaml")?;
    let mut rows = Vec::new();
    walk("", &schema, &defaults, &mut rows)?;
    let mut content = header(SOURCE);
    content.push_str(
        "\n# Chart values\n\n\
         Every value of `charts/warmcache`, with its default. `helm install` refuses any other key \
         and any value outside these rules (the chart's JSON Schema, with `additionalProperties: \
         false` at every level). Installing and upgrading: [install.md](../install.md).\n\n\
         | value | type | default | description |\n|---|---|---|---|\n",
    );
    for row in rows {
        content.push_str(&row);
        content.push('\n');
    }
    Ok(vec![GeneratedFile {
        name: "chart-values.md".to_owned(),
        content,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_has_a_row_with_its_default() {
        let files = render_all().unwrap();
        let table = &files[0].content;
        assert!(super::super::is_generated(table.as_bytes()));
        assert!(
            table.contains("| `webhook.replicas` | integer | `2` |"),
            "{table}"
        );
        assert!(
            table.contains("| `image.tag` | string | `\"\"` |"),
            "{table}"
        );
        assert!(
            table.contains("one of `\"pvc\"`, `\"hostPath\"`"),
            "{table}"
        );
    }

    #[test]
    fn a_value_without_a_description_is_refused() {
        let schema = serde_json::json!({"properties": {"a": {"type": "string"}}});
        let err = walk("", &schema, &Value::Null, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("a has no description"), "{err}");
    }
}
