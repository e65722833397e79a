//! The layering of docs/ARCHITECTURE.md holds: outside test code, a
//! top-level module of src/ uses (`crate::x`) only modules of a lower layer.
//! scripts/module_graph.py prints the same graph for people.

use std::collections::BTreeSet;
use std::path::Path;

/// Lowest first, as in the ARCHITECTURE table.
const LAYERS: &[&[&str]] = &[
    &["wire", "util", "rates", "history"],
    &["config", "message", "alarm", "plugins", "policy"],
    &["store", "exchange", "tls"],
    &["dedup"],
    &["queue", "delayed", "access", "cluster", "shovel"],
    &["vhost", "federation"],
    &["broker"],
    &["definitions"],
    &["amqp", "http", "stream_protocol"],
    &["server", "admin"],
    &["fuzz"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The file's non-test code, without comment lines: a one-line
/// `#[cfg(test)]` item (`mod testing;`) is skipped, and one that opens a
/// block (`mod tests {`, always last) ends the file.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            match lines.peek() {
                Some(next) if next.trim_end().ends_with(';') => {
                    lines.next();
                    continue;
                }
                _ => break,
            }
        }
        if !t.starts_with("//") {
            out.push(line);
        }
    }
    out.join("\n")
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The `crate::x` modules named in `code`.
fn uses(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // Not the tail of another path (`$crate::`, `my_crate::`).
            code[..*at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '$'))
        })
        .map(|(at, _)| {
            code[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|m| !m.is_empty())
        .collect()
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut wrong = Vec::new();
    for path in all {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let me = first.trim_end_matches(".rs").to_string();
        if me == "lib" || me == "main" {
            continue;
        }
        let Some(mine) = rank(&me) else {
            wrong.push(format!("{me} is in no layer"));
            continue;
        };
        for other in uses(&code(&path)) {
            if other == me {
                continue;
            }
            match rank(&other) {
                Some(r) if r < mine => {}
                _ => wrong.push(format!("{} uses crate::{other}", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "against the layers: {wrong:#?}");
}
