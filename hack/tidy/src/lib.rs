//! Checks of the source itself, run as this crate's unit tests.
//!
//! ARCHITECTURE.md's code map says, module by module, what must never depend on what. Where
//! the rule is between crates the compiler keeps it (a crate cannot name what it does not
//! depend on); where it is between modules of one crate nothing would, so [`RULES`] lists
//! each such rule and the test reads every path the module's code names (`crate::x`, the
//! names inside `use crate::{...}`, and other crates' names) and fails on a forbidden one,
//! saying which file, which line and which sentence of the code map it breaks.
//!
//! The reading is lexical rather than a parse (`syn` sees no paths inside macro bodies,
//! and `vec![crate::cycle::X]` is a dependency too): comments and string literals are
//! skipped, so a doc link to another module is not a dependency; `super::` paths are not followed (the modules these
//! rules cover do not reach their siblings that way, and the rules are written to catch a
//! new `use`, which is how a layering break starts).

use std::path::{Path, PathBuf};

/// One layering rule: code under `path` (a file or a directory, relative to the workspace
/// root) never names any of `never`.
#[derive(Debug)]
pub struct Rule {
    /// A file or directory, relative to the workspace root.
    pub path: &'static str,
    /// Path prefixes the code must not name: `crate::cycle` (a module of the same crate),
    /// `kube` (another crate), `std::fs`.
    pub never: &'static [&'static str],
    /// The code map's sentence this rule checks.
    pub why: &'static str,
}

/// Every intra-crate rule of the code map, and the crate-wide I/O bans of the pure crates.
pub const RULES: &[Rule] = &[
    Rule {
        path: "coordinator/core/src",
        never: &[
            "kube",
            "k8s_openapi",
            "tokio",
            "tonic",
            "std::fs",
            "std::net",
            "std::process",
            "Instant::now",
            "SystemTime::now",
            "std::time::Instant::now",
            "std::time::SystemTime::now",
        ],
        why: "the scheduling core is pure: no I/O, no clocks (time is a field of the snapshot)",
    },
    Rule {
        path: "dra/src",
        never: &[
            "kube",
            "k8s_openapi",
            "tokio",
            "tonic",
            "tessera_core",
            "tessera_coordinator",
            "std::fs",
            "std::net",
            "std::process",
            "Instant::now",
            "SystemTime::now",
            "std::time::Instant::now",
            "std::time::SystemTime::now",
        ],
        why: "tessera-dra is pure: never depends on kube, tokio, or the coordinator; no I/O, no clocks",
    },
    Rule {
        path: "coordinator/core/src/model",
        never: &[
            "crate::placement",
            "crate::actions",
            "crate::cycle",
            "crate::constraints",
        ],
        why: "model is pure data: must never depend on placement, actions, cycle or sim",
    },
    Rule {
        path: "coordinator/core/src/fairshare.rs",
        never: &[
            "crate::placement",
            "crate::actions",
            "crate::cycle",
            "crate::constraints",
        ],
        why: "fairshare depends only on model",
    },
    Rule {
        path: "coordinator/core/src/usage.rs",
        never: &[
            "crate::placement",
            "crate::actions",
            "crate::cycle",
            "crate::constraints",
        ],
        why: "usage depends only on model and fairshare's Share",
    },
    Rule {
        path: "coordinator/core/src/placement",
        never: &[
            "crate::actions",
            "crate::cycle",
            "crate::constraints",
            "crate::fairshare",
        ],
        why: "placement depends on model only; never on actions, cycle or sim",
    },
    Rule {
        path: "coordinator/core/src/constraints",
        never: &[
            "crate::actions",
            "crate::placement",
            "crate::fairshare",
            "crate::cycle::schedule",
        ],
        why: "constraints depend on model and cycle::NodeReason only",
    },
    Rule {
        path: "coordinator/sim/src/openb.rs",
        never: &["tessera_core"],
        why: "the openb readers never depend on the core",
    },
    Rule {
        path: "node-agent/src/gpu",
        never: &[
            "crate::plugin",
            "crate::ledger",
            "crate::enforce",
            "kube",
            "k8s_openapi",
        ],
        why: "gpu never depends on the plugin, the ledger, enforcement or Kubernetes",
    },
    Rule {
        path: "node-agent/src/topology.rs",
        never: &[
            "crate::plugin",
            "crate::ledger",
            "crate::enforce",
            "crate::node",
            "kube",
        ],
        why: "topology is pure; depends only on gpu types",
    },
    Rule {
        path: "node-agent/src/node.rs",
        never: &["kube", "k8s_openapi", "crate::report", "tonic"],
        why: "node never depends on Kubernetes or the coordinator stream",
    },
    Rule {
        path: "node-agent/src/probe.rs",
        never: &[
            "crate::plugin",
            "crate::ledger",
            "crate::enforce",
            "crate::report",
            "kube",
        ],
        why: "probe depends on gpu and topology only",
    },
    Rule {
        path: "node-agent/src/enforce",
        never: &["crate::admin", "crate::report", "kube", "k8s_openapi"],
        why: "enforcement never depends on the admin socket, the report stream or Kubernetes",
    },
    Rule {
        path: "node-agent/src/enforce/memory.rs",
        never: &[
            "std::fs",
            "std::process",
            "nix",
            "crate::enforce::signals",
            "Instant::now",
        ],
        why: "the memory state machine is pure decision logic with time as an input",
    },
    Rule {
        path: "node-agent/src/enforce/controller.rs",
        never: &[
            "std::fs",
            "std::process",
            "nix",
            "crate::enforce::signals",
            "Instant::now",
        ],
        why: "the PI controller is pure decision logic with time as an input",
    },
    Rule {
        path: "node-agent/src/plugin/matcher.rs",
        never: &[
            "parking_lot",
            "std::sync",
            "tokio",
            "tonic",
            "tessera_device_plugin",
            "tracing",
            "kube",
            "std::fs",
            "std::io",
            "std::net",
            "std::process",
            "Instant::now",
            "SystemTime::now",
            "std::time::Instant::now",
            "std::time::SystemTime::now",
            "crate::node::Node",
            "crate::ledger::Ledger",
            "crate::ledger::LedgerLock",
        ],
        why: "the Allocate matcher is pure: no locks, clocks, I/O, logging or gRPC; the ledger, the node and the time are inputs",
    },
    Rule {
        path: "coordinator/src/agents",
        never: &["crate::cluster"],
        why: "the agent service never depends on cluster",
    },
    Rule {
        path: "coordinator/src/agents/limits.rs",
        never: &[
            "tokio",
            "tonic",
            "kube",
            "parking_lot",
            "std::fs",
            "std::net",
            "Instant::now",
            "SystemTime::now",
            "std::time::Instant::now",
            "std::time::SystemTime::now",
        ],
        why: "the agent message limits are pure: no I/O, no locks, no clocks",
    },
    Rule {
        path: "coordinator/src/ops",
        never: &[
            "crate::cluster",
            "crate::agents",
            "crate::translate",
            "crate::webhook",
            "crate::crd",
        ],
        why: "ops depends on nothing else in the coordinator; the runtime feeds it",
    },
    Rule {
        path: "coordinator/src/webhook",
        never: &["crate::cluster"],
        why: "the webhook depends on nothing in cluster/",
    },
    Rule {
        path: "coordinator/src/migrate/kai.rs",
        never: &[
            "kube",
            "tokio",
            "std::fs",
            "std::io",
            "std::net",
            "crate::cluster",
            "crate::agents",
        ],
        why: "migrate/kai.rs is pure: no I/O, never depends on kube, tokio, files or cluster",
    },
    Rule {
        path: "kubectl-plugin/src",
        never: &[
            "kube::api::PostParams",
            "kube::api::Patch",
            "kube::api::PatchParams",
            "kube::api::DeleteParams",
            "PostParams",
            "PatchParams",
            "DeleteParams",
        ],
        why: "kubectl tessera reads through the API server and writes nothing",
    },
    Rule {
        path: "kubectl-plugin/src/fit.rs",
        never: &[
            "kube::Api",
            "kube::Client",
            "kube::api",
            "tokio",
            "crate::client",
        ],
        why: "fit is pure: no API calls, so every verdict is table-tested",
    },
];

/// A path the code names, with its line.
#[derive(Debug, PartialEq, Eq)]
pub struct Named {
    /// 1-based line.
    pub line: usize,
    /// The path as written, `::`-joined, with `use` groups expanded one level.
    pub path: String,
}

/// The source with comments and string and char literals blanked out (newlines kept, so
/// line numbers stay true).
pub fn code_only(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &str| {
        for c in s.chars() {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map(|e| e + 2).unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if let Some(end) = raw_string_end(rest) {
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => {
                        j += 1;
                        break;
                    }
                    _ => j += 1,
                }
            }
            let end = j.min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if let Some(end) = char_literal_end(rest) {
            blank(&mut out, &rest[..end]);
            i += end;
        } else {
            // Advance by one whole character so multi-byte text stays valid.
            let c = rest.chars().next().map_or(1, char::len_utf8);
            out.push_str(&rest[..c]);
            i += c;
        }
    }
    out
}

/// Length of a raw string literal (`r"…"`, `r#"…"#`) at the start of `s`.
fn raw_string_end(s: &str) -> Option<usize> {
    let after_r = s.strip_prefix('r').or_else(|| s.strip_prefix("br"))?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    Some(s.len() - body.len() + end + close.len())
}

/// Length of a char literal (`'a'`, `'\n'`, `'\''`) at the start of `s`; `None` for a
/// lifetime.
fn char_literal_end(s: &str) -> Option<usize> {
    let body = s.strip_prefix('\'')?;
    let mut chars = body.char_indices();
    let (_, first) = chars.next()?;
    if first == '\\' {
        let close = body[1..].find('\'')?;
        return Some(1 + 1 + close + 1);
    }
    let (at, next) = chars.next()?;
    (next == '\'').then_some(1 + at + 1)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that `code` (already through [`code_only`]) names: each maximal run of
/// `ident::ident::…`, and for `prefix::{a, b::c}` each of `prefix::a`, `prefix::b::c`.
pub fn named_paths(code: &str) -> Vec<Named> {
    let mut found = Vec::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    let line_of = |byte: usize| code[..byte].matches('\n').count() + 1;
    let mut k = 0;
    while k < chars.len() {
        let (start, c) = chars[k];
        let starts_word = is_ident(c) && (k == 0 || !is_ident(chars[k - 1].1));
        if !starts_word || c.is_ascii_digit() {
            k += 1;
            continue;
        }
        let mut j = k;
        while j < chars.len() && is_ident(chars[j].1) {
            j += 1;
        }
        let word_end = chars.get(j).map_or(code.len(), |c| c.0);
        let mut path = code[start..word_end].to_string();
        let mut cursor = j;
        let mut grouped = false;
        loop {
            let rest = &code[chars.get(cursor).map_or(code.len(), |c| c.0)..];
            let Some(after) = rest.strip_prefix("::") else {
                break;
            };
            let trimmed = after.trim_start();
            let skipped = rest.len() - trimmed.len();
            if trimmed.starts_with('{') {
                let group_at = code.len() - trimmed.len();
                let (members, len) = group_members(trimmed);
                for (offset, member) in members {
                    found.push(Named {
                        line: line_of(group_at + offset),
                        path: format!("{path}::{member}"),
                    });
                }
                // The members were read relative to the prefix; do not read them again
                // as paths of their own.
                cursor = chars.partition_point(|c| c.0 < group_at + len);
                grouped = true;
                break;
            }
            let seg_len = trimmed.len() - trimmed.trim_start_matches(is_ident).len();
            if seg_len == 0 {
                break;
            }
            path.push_str("::");
            path.push_str(&trimmed[..seg_len]);
            let next_byte = code.len() - rest.len() + skipped + seg_len;
            cursor = chars.partition_point(|c| c.0 < next_byte);
        }
        if path.contains("::") && !grouped {
            found.push(Named {
                line: line_of(start),
                path,
            });
        }
        k = cursor.max(j);
    }
    found
}

/// The first-level members of a `{a, b::c, d::{e}}` group at the start of `s`, with their
/// byte offsets: `a`, `b::c`, `d` (nested groups name their head; a rule on a module prefix
/// still sees it); and the length of the group.
fn group_members(s: &str) -> (Vec<(usize, String)>, usize) {
    let mut members = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    let mut current_at = 0;
    let mut end = s.len();
    for (i, c) in s.char_indices() {
        match c {
            '{' if depth == 0 => {
                depth = 1;
                current_at = i + 1;
            }
            '}' if depth == 1 => {
                members.push((current_at, std::mem::take(&mut current)));
                end = i + 1;
                break;
            }
            ',' if depth == 1 => {
                members.push((current_at, std::mem::take(&mut current)));
                current_at = i + 1;
            }
            _ => {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth >= 1 {
                    current.push(c);
                }
            }
        }
    }
    let members = members
        .into_iter()
        .filter_map(|(at, m)| {
            let compact: String = m.split_whitespace().collect();
            let head = compact
                .split('{')
                .next()
                .unwrap_or_default()
                .trim_end_matches("::")
                .to_string();
            let lead = m.len() - m.trim_start().len();
            (!head.is_empty()).then_some((at + lead, head))
        })
        .collect();
    (members, end)
}

/// Whether `path` is `prefix` or lies under it (`crate::cycle::X` under `crate::cycle`,
/// never `crate::cycles`).
pub fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with("::"))
}

/// The repository root (found from this crate's manifest directory), which the paths of the
/// layering rules are relative to.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `.rs` files at `path` (one file, or every file below a directory), sorted.
pub fn rust_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let p = entry?.path();
        if p.is_dir() {
            files.extend(rust_files(&p)?);
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// The source up to its unit-test module: tests may use clocks and files that the code
/// under a rule must not (the module sits at the end of a file, by this repository's style).
pub fn without_tests(source: &str) -> &str {
    let mut at = 0;
    for line in source.split_inclusive('\n') {
        if line.trim() == "#[cfg(test)]" && declares_module(&source[at + line.len()..]).is_some() {
            return &source[..at];
        }
        at += line.len();
    }
    source
}

/// The name of the module `text` starts by declaring (`mod x`, `pub(crate) mod x`, inline or
/// `mod x;`), if it does.
fn declares_module(text: &str) -> Option<&str> {
    let mut rest = text.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = after.trim_start();
        if rest.starts_with('(') {
            rest = &rest[rest.find(')')? + 1..];
        }
        rest = rest.trim_start();
    }
    let name = rest.strip_prefix("mod ")?.trim_start();
    let end = name.find(|c: char| !is_ident(c)).unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// Whether `file` is a unit-test module kept in a file of its own: its parent module declares
/// it under `#[cfg(test)]` (`#[cfg(test)] mod tests;` beside `mod.rs`, `lib.rs`, or in
/// `x.rs` for a file of `x/`).
pub fn is_test_module_file(file: &Path) -> bool {
    let (Some(dir), Some(stem)) = (file.parent(), file.file_stem().and_then(|s| s.to_str())) else {
        return false;
    };
    let (name, parents) = if stem == "mod" {
        let Some(own) = dir.file_name().and_then(|s| s.to_str()) else {
            return false;
        };
        let up = dir.parent().unwrap_or(dir);
        (
            own,
            vec![
                up.join("mod.rs"),
                up.join("lib.rs"),
                up.join("main.rs"),
                up.with_extension("rs"),
            ],
        )
    } else {
        (
            stem,
            vec![
                dir.join("mod.rs"),
                dir.join("lib.rs"),
                dir.join("main.rs"),
                dir.with_extension("rs"),
            ],
        )
    };
    parents.iter().any(|parent| {
        let Ok(source) = std::fs::read_to_string(parent) else {
            return false;
        };
        let code = code_only(&source);
        let mut at = 0;
        code.split_inclusive('\n').any(|line| {
            let start = at;
            at += line.len();
            line.trim() == "#[cfg(test)]"
                && declares_module(&code[start + line.len()..]) == Some(name)
        })
    })
}

/// The product's own Rust sources under `root`: every `src/` file of the workspace's crates,
/// without integration tests, benches, examples, build output or unit-test module files.
pub fn product_files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(dir: &Path, in_src: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let p = entry?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if p.is_dir() {
                let skip = name.starts_with('.')
                    || name.starts_with("target")
                    || matches!(name, "tests" | "benches" | "examples" | "node_modules");
                if !skip {
                    walk(&p, in_src || name == "src", out)?;
                }
            } else if in_src && name.ends_with(".rs") && !is_test_module_file(&p) {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, false, &mut out)?;
    out.sort();
    Ok(out)
}

/// Every `use super::*` in `code` (already through [`code_only`]), by line: a module that
/// takes all of its parent's names hides what it depends on, so only unit tests may.
pub fn glob_imports_of_parent(code: &str) -> Vec<usize> {
    code.lines()
        .enumerate()
        .filter(|(_, line)| {
            let compact: String = line.split_whitespace().collect();
            compact.contains("usesuper::*") || compact.contains("usesuper::{*")
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// Every break of `rule` under `root`, as `file:line: path (why)`.
pub fn breaks(root: &Path, rule: &Rule) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let base = root.join(rule.path);
    if !base.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{}: the rule's path is gone; update RULES with the code map",
                rule.path
            ),
        ));
    }
    for file in rust_files(&base)? {
        let source = std::fs::read_to_string(&file)?;
        for named in named_paths(&code_only(without_tests(&source))) {
            if let Some(bad) = rule.never.iter().find(|p| under(&named.path, p)) {
                let shown = file
                    .strip_prefix(root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                out.push(format!(
                    "{shown}:{}: names `{}` (never `{bad}`: {})",
                    named.line, named.path, rule.why
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(source: &str) -> Vec<String> {
        named_paths(&code_only(source))
            .into_iter()
            .map(|n| n.path)
            .collect()
    }

    #[test]
    fn the_code_map_layering_holds() {
        let root = workspace_root();
        let mut all = Vec::new();
        for rule in RULES {
            all.extend(breaks(&root, rule).unwrap());
        }
        assert!(all.is_empty(), "layering broken:\n{}", all.join("\n"));
    }

    /// A module names what it takes from its parent: `use super::*` outside unit tests hides
    /// what the module depends on (and let one type's methods spread over files unseen).
    #[test]
    fn no_module_outside_tests_takes_all_of_its_parent() {
        let root = workspace_root();
        let mut found = Vec::new();
        for file in product_files(&root).unwrap() {
            let source = std::fs::read_to_string(&file).unwrap();
            for line in glob_imports_of_parent(&code_only(without_tests(&source))) {
                let shown = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                found.push(format!(
                    "{shown}:{line}: use super::* (name what the module uses)"
                ));
            }
        }
        assert!(
            found.is_empty(),
            "glob imports of a parent module:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn test_modules_are_told_apart_whether_inline_or_in_files_of_their_own() {
        let src = "fn a() {}\n#[cfg(test)]\npub(crate) mod tests {\n    use super::*;\n}\n";
        assert_eq!(without_tests(src), "fn a() {}\n");
        assert_eq!(glob_imports_of_parent(&code_only(src)), [4]);
        let dir = std::env::temp_dir().join(format!("tessera-tidy-mods-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src/m")).unwrap();
        std::fs::write(dir.join("src/lib.rs"), "mod m;\n").unwrap();
        std::fs::write(
            dir.join("src/m.rs"),
            "mod inner;\n#[cfg(test)]\nmod tests;\n",
        )
        .unwrap();
        std::fs::write(dir.join("src/m/tests.rs"), "use super::*;\n").unwrap();
        std::fs::write(dir.join("src/m/inner.rs"), "use super::*;\n").unwrap();
        let files = product_files(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["src/lib.rs", "src/m/inner.rs", "src/m.rs"]);
    }

    #[test]
    fn paths_are_read_from_code_not_comments_or_strings() {
        let src = "//! see [`crate::cycle`]\nuse crate::model::Pod;\nlet s = \"crate::cycle\";\n\
                   let r = r#\"kube::Api\"#; let c = '\"'; fn f<'a>(x: &'a str) {}\n\
                   /* crate::actions */ let x = std::fs::read(p);";
        assert_eq!(paths(src), ["crate::model::Pod", "std::fs::read"]);
    }

    #[test]
    fn use_groups_expand_one_level_with_their_lines() {
        let src =
            "use crate::{\n    model::{Node, Pod},\n    cycle::Decisions,\n    placement,\n};";
        let found = named_paths(&code_only(src));
        let got: Vec<(usize, &str)> = found.iter().map(|n| (n.line, n.path.as_str())).collect();
        assert_eq!(
            got,
            [
                (2, "crate::model"),
                (3, "crate::cycle::Decisions"),
                (4, "crate::placement")
            ]
        );
    }

    #[test]
    fn a_forbidden_use_is_reported_with_file_line_and_reason() {
        let dir = std::env::temp_dir().join(format!("tessera-tidy-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("m")).unwrap();
        std::fs::write(
            dir.join("m/a.rs"),
            "use crate::model::X;\n\nuse crate::cycle::Y;\n",
        )
        .unwrap();
        let rule = Rule {
            path: "m",
            never: &["crate::cycle"],
            why: "m is pure data",
        };
        let found = breaks(&dir, &rule).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            found,
            ["m/a.rs:3: names `crate::cycle::Y` (never `crate::cycle`: m is pure data)"]
        );
        assert!(!under("crate::cycles", "crate::cycle"));
    }

    #[test]
    fn unit_tests_are_not_the_code_under_a_rule() {
        let src = "use a::B;\n#[cfg(test)]\nmod tests {\n    use std::fs::read;\n}\n";
        assert_eq!(paths(without_tests(src)), ["a::B"]);
    }
}
