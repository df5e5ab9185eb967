//! Executes a parsed template against a YAML value, Go `text/template` style.

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use super::TemplateError;
use super::funcs;
use super::parse::{Arg, Node, Pipeline};

/// Deepest `include` nesting before we call it a loop.
const MAX_DEPTH: usize = 50;

/// Execution state for one top-level render.
pub(crate) struct Exec<'a> {
    pub(crate) defines: &'a BTreeMap<String, Vec<Node>>,
    /// Name of the template being run, for errors.
    pub(crate) name: String,
    vars: Vec<(String, Value)>,
    depth: usize,
}

/// Go's notion of truth: false, 0, nil and empty strings, lists and maps are false.
pub(crate) fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Sequence(s) => !s.is_empty(),
        Value::Mapping(m) => !m.is_empty(),
        Value::Tagged(t) => truthy(&t.value),
    }
}

/// How a value prints in `{{ }}`.
pub(crate) fn printed(v: &Value) -> Result<String, String> {
    match v {
        Value::Null => Ok(String::new()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) => Ok(s.clone()),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => {
            Err("a list or map cannot be printed directly; use `toYaml` (with `nindent`)".into())
        }
    }
}

impl<'a> Exec<'a> {
    pub(crate) fn new(defines: &'a BTreeMap<String, Vec<Node>>, name: &str, root: &Value) -> Self {
        Self {
            defines,
            name: name.to_string(),
            vars: vec![(String::new(), root.clone())],
            depth: 0,
        }
    }

    fn err(&self, line: usize, message: impl Into<String>) -> TemplateError {
        TemplateError {
            template: self.name.clone(),
            line,
            message: message.into(),
        }
    }

    /// Runs `nodes` with `dot`, appending to `out`.
    pub(crate) fn run(
        &mut self,
        nodes: &[Node],
        dot: &Value,
        out: &mut String,
    ) -> Result<(), TemplateError> {
        for node in nodes {
            match node {
                Node::Text(t) => out.push_str(t),
                Node::Output(pipe, line) => {
                    let v = self.pipeline(pipe, dot, *line)?;
                    if pipe.vars.is_empty() {
                        out.push_str(&printed(&v).map_err(|m| self.err(*line, m))?);
                    }
                }
                Node::If {
                    branches,
                    otherwise,
                    line,
                } => {
                    let mark = self.vars.len();
                    let mut taken = false;
                    for (cond, body) in branches {
                        if truthy(&self.pipeline(cond, dot, *line)?) {
                            self.run(body, dot, out)?;
                            taken = true;
                            break;
                        }
                    }
                    if !taken {
                        self.run(otherwise, dot, out)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::With {
                    pipe,
                    body,
                    otherwise,
                    line,
                } => {
                    let mark = self.vars.len();
                    let v = self.pipeline(pipe, dot, *line)?;
                    if truthy(&v) {
                        self.run(body, &v, out)?;
                    } else {
                        self.run(otherwise, dot, out)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::Range {
                    pipe,
                    body,
                    otherwise,
                    line,
                } => {
                    let mark = self.vars.len();
                    let bare = Pipeline {
                        vars: Vec::new(),
                        assign: false,
                        commands: pipe.commands.clone(),
                    };
                    let v = self.pipeline(&bare, dot, *line)?;
                    let items: Vec<(Value, Value)> = match &v {
                        Value::Sequence(s) => s
                            .iter()
                            .enumerate()
                            .map(|(i, x)| (Value::Number((i as u64).into()), x.clone()))
                            .collect(),
                        // Go ranges over maps in key order.
                        Value::Mapping(m) => {
                            let mut pairs: Vec<_> =
                                m.iter().map(|(k, x)| (k.clone(), x.clone())).collect();
                            pairs.sort_by_key(|(k, _)| printed(k).unwrap_or_default());
                            pairs
                        }
                        Value::Null => Vec::new(),
                        _ => return Err(self.err(*line, "range needs a list or a map")),
                    };
                    if items.is_empty() {
                        self.run(otherwise, dot, out)?;
                    }
                    for (k, x) in items {
                        let inner = self.vars.len();
                        match pipe.vars.as_slice() {
                            [v] => self.vars.push((v.clone(), x.clone())),
                            [kn, vn] => {
                                self.vars.push((kn.clone(), k));
                                self.vars.push((vn.clone(), x.clone()));
                            }
                            _ => {}
                        }
                        self.run(body, &x, out)?;
                        self.vars.truncate(inner);
                    }
                    self.vars.truncate(mark);
                }
            }
        }
        Ok(())
    }

    fn pipeline(
        &mut self,
        pipe: &Pipeline,
        dot: &Value,
        line: usize,
    ) -> Result<Value, TemplateError> {
        let mut piped: Option<Value> = None;
        for command in &pipe.commands {
            piped = Some(self.command(command, dot, piped, line)?);
        }
        let value = piped.unwrap_or(Value::Null);
        if let [name] = pipe.vars.as_slice() {
            if pipe.assign {
                let Some(slot) = self.vars.iter_mut().rev().find(|(n, _)| n == name) else {
                    return Err(
                        self.err(line, format!("assignment to undeclared variable ${name}"))
                    );
                };
                slot.1 = value.clone();
            } else {
                self.vars.push((name.clone(), value.clone()));
            }
        }
        Ok(value)
    }

    fn command(
        &mut self,
        args: &[Arg],
        dot: &Value,
        piped: Option<Value>,
        line: usize,
    ) -> Result<Value, TemplateError> {
        let (first, rest) = args
            .split_first()
            .ok_or_else(|| self.err(line, "empty command"))?;
        if let Arg::Func(name) = first {
            let mut values = Vec::with_capacity(rest.len() + 1);
            for a in rest {
                values.push(self.operand(a, dot, line)?);
            }
            values.extend(piped);
            return self.call(name, values, line);
        }
        if !rest.is_empty() {
            return Err(self.err(line, "only a function can take arguments"));
        }
        if piped.is_some() {
            return Err(self.err(line, "only a function can follow `|`"));
        }
        self.operand(first, dot, line)
    }

    fn operand(&mut self, arg: &Arg, dot: &Value, line: usize) -> Result<Value, TemplateError> {
        match arg {
            Arg::Literal(v) => Ok(v.clone()),
            Arg::Field(path) => walk(dot, path, ".").map_err(|m| self.err(line, m)),
            Arg::Var(name, path) => {
                let base = self
                    .vars
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| self.err(line, format!("undefined variable ${name}")))?;
                walk(&base, path, &format!("${name}.")).map_err(|m| self.err(line, m))
            }
            Arg::Func(name) => self.call(name, Vec::new(), line),
            Arg::Sub(p) => self.pipeline(p, dot, line),
        }
    }

    fn call(&mut self, name: &str, args: Vec<Value>, line: usize) -> Result<Value, TemplateError> {
        if name == "include" {
            let [Value::String(target), ctx] = args.as_slice() else {
                return Err(self.err(line, "expected `include \"name\" context`"));
            };
            return self.include(target, ctx, line).map(Value::String);
        }
        funcs::call(name, args).map_err(|m| self.err(line, m))
    }

    fn include(&mut self, target: &str, ctx: &Value, line: usize) -> Result<String, TemplateError> {
        let body = self
            .defines
            .get(target)
            .ok_or_else(|| self.err(line, format!("no template named {target:?} is defined")))?;
        if self.depth >= MAX_DEPTH {
            return Err(self.err(
                line,
                format!("include {target:?} nests too deeply (a loop?)"),
            ));
        }
        let saved_vars = std::mem::replace(&mut self.vars, vec![(String::new(), ctx.clone())]);
        let saved_name = std::mem::replace(&mut self.name, target.to_string());
        self.depth += 1;
        let mut out = String::new();
        let result = self.run(body, ctx, &mut out);
        self.depth -= 1;
        self.vars = saved_vars;
        self.name = saved_name;
        result.map(|()| out)
    }
}

/// Follows `.a.b` from `base`. A missing key gives nil; going through nil or a scalar is an
/// error, as in Go templates over maps.
fn walk(base: &Value, path: &[String], prefix: &str) -> Result<Value, String> {
    let mut current = base;
    for (i, key) in path.iter().enumerate() {
        let so_far = format!("{prefix}{}", path[..=i].join("."));
        match current {
            Value::Mapping(m) => match m.get(key.as_str()) {
                Some(v) => current = v,
                None => return Ok(Value::Null).and_then(|v| rest_is_empty(v, path, i, &so_far)),
            },
            Value::Null => return Err(format!("nil pointer evaluating {so_far}")),
            _ => {
                return Err(format!(
                    "cannot read field {key:?} of a non-map at {so_far}"
                ));
            }
        }
    }
    Ok(current.clone())
}

fn rest_is_empty(v: Value, path: &[String], i: usize, so_far: &str) -> Result<Value, String> {
    if i + 1 < path.len() {
        Err(format!(
            "nil pointer evaluating {so_far}.{}: {so_far} is not set",
            path[i + 1]
        ))
    } else {
        Ok(v)
    }
}
