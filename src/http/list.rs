//! Lists as RabbitMQ's API answers them: `name` (with `use_regex`) filters
//! by name, `sort` (a field, dotted for nested ones) and `sort_reverse`
//! order, `columns` keeps only the fields named, and `page` / `page_size`
//! turn the answer into a page ({items, page, page_count, page_size,
//! filtered_count, item_count, total_count}). Sorting by name (or none)
//! sorts before anything is rendered and renders one page only, so a
//! paged list of 100,000 queues costs a page of JSON. Sorting by another
//! field asks the list for that field alone (`respond_keyed`), and renders
//! every item only for a field the list cannot give that way.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::{ApiError, ApiResult};

/// The most items a page may hold (RabbitMQ's limit).
const MAX_PAGE_SIZE: usize = 500;

/// The query parameters of a list.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    pub page: Option<String>,
    pub page_size: Option<String>,
    pub name: Option<String>,
    pub use_regex: Option<String>,
    pub sort: Option<String>,
    pub sort_reverse: Option<String>,
    pub columns: Option<String>,
}

fn truthy(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|s| s == "true" || s == "1")
}

/// A field of `v` by dotted path.
fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn compare(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(Ordering::Equal),
        (Some(Value::String(x)), Some(Value::String(y))) => x.cmp(y),
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        _ => Ordering::Equal,
    }
}

/// Answers a list of `items`: `key` gives each one's (vhost, name) for
/// filtering and the cheap sort, `render` its JSON.
pub fn respond<T>(
    items: Vec<T>,
    q: &ListQuery,
    key: impl Fn(&T) -> (&str, &str),
    render: impl Fn(&T) -> Value,
) -> ApiResult<Value> {
    respond_keyed(items, q, key, render, |_, _| None)
}

/// The longest `name` filter (a regex with `use_regex`), bytes.
const MAX_FILTER: usize = 1024;
/// What a `use_regex` filter may compile to, bytes (the regex crate's
/// default allows 10 MiB per request).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// The most `columns` a list request may name, and the longest one.
const MAX_COLUMNS: usize = 64;
const MAX_COLUMN: usize = 256;

/// As `respond`, where `sort_value` gives an item's value of a (dotted)
/// field without rendering the item, or None if it cannot.
pub fn respond_keyed<T>(
    mut items: Vec<T>,
    q: &ListQuery,
    key: impl Fn(&T) -> (&str, &str),
    render: impl Fn(&T) -> Value,
    sort_value: impl Fn(&T, &str) -> Option<Value>,
) -> ApiResult<Value> {
    let total = items.len();
    if let Some(filter) = q.name.as_deref().filter(|f| !f.is_empty()) {
        if filter.len() > MAX_FILTER {
            return Err(ApiError::bad_request(format!(
                "the name filter is longer than {MAX_FILTER} bytes"
            )));
        }
        if truthy(&q.use_regex) {
            let re = regex::RegexBuilder::new(filter)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| ApiError::bad_request(format!("invalid regex '{filter}': {e}")))?;
            items.retain(|i| re.is_match(key(i).1));
        } else {
            let needle = filter.to_lowercase();
            items.retain(|i| key(i).1.to_lowercase().contains(&needle));
        }
    }
    let reverse = truthy(&q.sort_reverse);
    let page = match &q.page {
        None => None,
        Some(p) => {
            let page: usize = p
                .parse()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| ApiError::bad_request(format!("invalid page '{p}'")))?;
            let size: usize = match &q.page_size {
                None => 100,
                Some(s) => s
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| ApiError::bad_request(format!("invalid page_size '{s}'")))?,
            };
            if size > MAX_PAGE_SIZE {
                return Err(ApiError::bad_request(format!(
                    "page_size = {size} is greater than the maximum of {MAX_PAGE_SIZE}"
                )));
            }
            Some((page, size))
        }
    };
    let filtered = items.len();
    let cheap = matches!(q.sort.as_deref(), None | Some("" | "name" | "vhost"));
    let mut rendered: Vec<Value> = if cheap {
        if q.sort.as_deref() == Some("name") {
            items.sort_by(|a, b| key(a).1.cmp(key(b).1).then(key(a).0.cmp(key(b).0)));
        } else {
            items.sort_by(|a, b| key(a).cmp(&key(b)));
        }
        if reverse {
            items.reverse();
        }
        let range = page_range(page, filtered);
        items[range].iter().map(&render).collect()
    } else if let Some(values) = q.sort.as_deref().and_then(|sort| {
        items
            .iter()
            .map(|i| sort_value(i, sort))
            .collect::<Option<Vec<_>>>()
    }) {
        // Ties in name order either way, so that pages do not overlap.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by(|&a, &b| {
            let by_value = compare(Some(&values[a]), Some(&values[b]));
            if reverse {
                by_value.reverse()
            } else {
                by_value
            }
            .then_with(|| key(&items[a]).1.cmp(key(&items[b]).1))
            .then_with(|| key(&items[a]).0.cmp(key(&items[b]).0))
        });
        let range = page_range(page, filtered);
        order[range].iter().map(|&i| render(&items[i])).collect()
    } else {
        let sort = q.sort.as_deref().unwrap_or("");
        let mut all: Vec<Value> = items.iter().map(&render).collect();
        all.sort_by(|a, b| compare(field(a, sort), field(b, sort)));
        if reverse {
            all.reverse();
        }
        let range = page_range(page, filtered);
        all.drain(range).collect()
    };
    if let Some(cols) = q.columns.as_deref().filter(|c| !c.is_empty()) {
        let cols: Vec<&str> = cols.split(',').map(str::trim).collect();
        if cols.len() > MAX_COLUMNS || cols.iter().any(|c| c.len() > MAX_COLUMN) {
            return Err(ApiError::bad_request(format!(
                "columns: at most {MAX_COLUMNS} names of at most {MAX_COLUMN} bytes each"
            )));
        }
        for v in &mut rendered {
            *v = keep_columns(v, &cols);
        }
    }
    let Some((page, size)) = page else {
        return Ok(Value::Array(rendered));
    };
    Ok(serde_json::json!({
        "filtered_count": filtered,
        "item_count": rendered.len(),
        "items": rendered,
        "page": page,
        "page_count": filtered.div_ceil(size).max(1),
        "page_size": size,
        "total_count": total,
    }))
}

fn page_range(page: Option<(usize, usize)>, len: usize) -> std::ops::Range<usize> {
    match page {
        None => 0..len,
        Some((page, size)) => {
            let start = ((page - 1).saturating_mul(size)).min(len);
            start..(start + size).min(len)
        }
    }
}

/// Only the fields `cols` names (dotted names keep nested fields).
fn keep_columns(v: &Value, cols: &[&str]) -> Value {
    let mut out = Map::new();
    for col in cols {
        let Some(found) = field(v, col) else { continue };
        let mut parts = col.split('.').peekable();
        let mut at = &mut out;
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                at.insert(part.to_string(), found.clone());
                break;
            }
            let next = at
                .entry(part.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(m) = next else { break };
            at = m;
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> ListQuery {
        let v: Map<String, Value> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        serde_json::from_value(Value::Object(v)).unwrap()
    }

    #[test]
    fn filters_sorts_pages_and_trims_as_rabbitmq() {
        let items: Vec<(String, u64)> = (0..250).map(|i| (format!("q{i:03}"), 250 - i)).collect();
        let render =
            |i: &(String, u64)| json!({"name": i.0, "vhost": "/", "n": i.1, "deep": {"x": 1}});
        fn key(i: &(String, u64)) -> (&str, &str) {
            ("/", i.0.as_str())
        }
        let page = respond(
            items.clone(),
            &q(&[("page", "3"), ("page_size", "100")]),
            key,
            render,
        )
        .unwrap();
        assert_eq!(page["item_count"], 50);
        assert_eq!(page["page_count"], 3);
        assert_eq!(page["items"][0]["name"], "q200");
        let sorted = respond(items.clone(), &q(&[("sort", "n")]), key, render).unwrap();
        assert_eq!(sorted[0]["name"], "q249");
        let found = respond(
            items.clone(),
            &q(&[("name", "^q01[0-2]$"), ("use_regex", "true")]),
            key,
            render,
        )
        .unwrap();
        assert_eq!(found.as_array().unwrap().len(), 3);
        let cols = respond(
            items.clone(),
            &q(&[("columns", "name,deep.x")]),
            key,
            render,
        )
        .unwrap();
        assert_eq!(cols[0], json!({"name": "q000", "deep": {"x": 1}}));
        // Inputs that would cost without bound are refused.
        let many = vec!["name"; MAX_COLUMNS + 1].join(",");
        assert!(respond(items.clone(), &q(&[("columns", &many)]), key, render).is_err());
        let huge = "(a{1000}){1000}";
        let regex = q(&[("name", huge), ("use_regex", "true")]);
        assert!(respond(items.clone(), &regex, key, render).is_err());
        let long = "q".repeat(MAX_FILTER + 1);
        assert!(respond(items.clone(), &q(&[("name", &long)]), key, render).is_err());
        // Sorted by a value the list gives without rendering: the same
        // order, ties by name, and only the page is rendered.
        let rendered = std::cell::Cell::new(0);
        let counted = |i: &(String, u64)| {
            rendered.set(rendered.get() + 1);
            render(i)
        };
        let page = respond_keyed(
            items.clone(),
            &q(&[
                ("sort", "n"),
                ("sort_reverse", "true"),
                ("page", "1"),
                ("page_size", "10"),
            ]),
            key,
            counted,
            |i, f| (f == "n").then(|| json!(i.1 / 2)),
        )
        .unwrap();
        assert_eq!(rendered.get(), 10);
        assert_eq!(page["items"][0]["name"], "q000");
        assert_eq!(page["items"][1]["name"], "q001");
        assert_eq!(page["items"][2]["name"], "q002");
        assert!(respond(
            items,
            &q(&[("page", "1"), ("page_size", "501")]),
            key,
            render
        )
        .is_err());
    }
}
