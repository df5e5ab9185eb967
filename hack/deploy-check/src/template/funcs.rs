//! The functions of the subset (Helm's meaning for each): `toYaml`, `nindent`, `indent`,
//! `quote`, `default`, `required`, `empty`, `eq`, `ne`, `not`, `and`, `or`. `include` is
//! handled by the executor because it needs the defined templates.

use serde_yaml_ng::Value;

use super::eval::{printed, truthy};

/// Names of every function the subset knows, `include` included.
pub const FUNCTIONS: &[&str] = &[
    "include", "toYaml", "nindent", "indent", "quote", "default", "required", "empty", "eq", "ne",
    "not", "and", "or",
];

fn arity(name: &str, args: &[Value], n: usize, form: &str) -> Result<(), String> {
    if args.len() == n {
        Ok(())
    } else {
        Err(format!(
            "{name} takes {n} argument(s), got {}: expected `{form}`",
            args.len()
        ))
    }
}

fn int_arg(name: &str, v: &Value) -> Result<usize, String> {
    v.as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| format!("{name}: the width must be a whole number, got {v:?}"))
}

fn string_arg(name: &str, v: &Value) -> Result<String, String> {
    printed(v).map_err(|m| format!("{name}: {m}"))
}

/// Loose equality as Go's `eq` on basic kinds: numbers by value, the rest structurally.
fn equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Calls a function of the subset.
pub(crate) fn call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    match name {
        "toYaml" => {
            arity(name, &args, 1, "toYaml VALUE")?;
            let text = serde_yaml_ng::to_string(&args[0]).map_err(|e| format!("toYaml: {e}"))?;
            Ok(Value::String(text.trim_end_matches('\n').to_string()))
        }
        "indent" | "nindent" => {
            arity(name, &args, 2, &format!("{name} WIDTH TEXT"))?;
            let pad = " ".repeat(int_arg(name, &args[0])?);
            let text = string_arg(name, &args[1])?;
            let indented = format!("{pad}{}", text.replace('\n', &format!("\n{pad}")));
            Ok(Value::String(if name == "nindent" {
                format!("\n{indented}")
            } else {
                indented
            }))
        }
        "quote" => {
            let mut parts = Vec::new();
            for a in &args {
                if a.is_null() {
                    continue;
                }
                let s = string_arg(name, a)?;
                parts.push(serde_json::to_string(&s).map_err(|e| e.to_string())?);
            }
            Ok(Value::String(parts.join(" ")))
        }
        "default" => match args.as_slice() {
            [fallback] => Ok(fallback.clone()),
            [fallback, given] => Ok(if truthy(given) {
                given.clone()
            } else {
                fallback.clone()
            }),
            _ => Err("default takes 1 or 2 arguments: expected `default FALLBACK VALUE`".into()),
        },
        "required" => {
            arity(name, &args, 2, "required \"message\" VALUE")?;
            let missing = args[1].is_null() || args[1].as_str() == Some("");
            if missing {
                Err(string_arg(name, &args[0])?)
            } else {
                Ok(args[1].clone())
            }
        }
        "empty" => {
            arity(name, &args, 1, "empty VALUE")?;
            Ok(Value::Bool(!truthy(&args[0])))
        }
        "eq" | "ne" => {
            if args.len() < 2 {
                return Err(format!("{name} needs two values: expected `{name} A B`"));
            }
            let any_equal = args[1..].iter().any(|b| equal(&args[0], b));
            Ok(Value::Bool(if name == "eq" {
                any_equal
            } else {
                !any_equal
            }))
        }
        "not" => {
            arity(name, &args, 1, "not VALUE")?;
            Ok(Value::Bool(!truthy(&args[0])))
        }
        "and" => {
            if args.is_empty() {
                return Err("and needs at least one value".into());
            }
            let pick = args
                .iter()
                .find(|a| !truthy(a))
                .unwrap_or(&args[args.len() - 1]);
            Ok(pick.clone())
        }
        "or" => {
            if args.is_empty() {
                return Err("or needs at least one value".into());
            }
            let pick = args
                .iter()
                .find(|a| truthy(a))
                .unwrap_or(&args[args.len() - 1]);
            Ok(pick.clone())
        }
        other => Err(format!(
            "unknown function {other:?}; the supported subset is: {}",
            FUNCTIONS.join(", ")
        )),
    }
}
