//! Pieces into a tree: text, output actions, `if`/`else if`/`else`, `with`, `range`, `define`.

use std::collections::BTreeMap;

use super::TemplateError;
use super::lex::{Piece, Tok, tokens};

/// One operand of a command.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    /// `.a.b` relative to dot (`.` when empty).
    Field(Vec<String>),
    /// `$name.a.b`.
    Var(String, Vec<String>),
    /// A function name.
    Func(String),
    /// A literal.
    Literal(serde_yaml_ng::Value),
    /// `( pipeline )`.
    Sub(Box<Pipeline>),
}

/// `a | b c | d`, optionally declaring variables first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pipeline {
    /// Variables declared (`:=`) or assigned (`=`) from the result; two for `range $k, $v :=`.
    pub(crate) vars: Vec<String>,
    /// `=` rather than `:=`.
    pub(crate) assign: bool,
    /// Commands, each a list of operands.
    pub(crate) commands: Vec<Vec<Arg>>,
}

/// A node of the parsed template.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// Literal text.
    Text(String),
    /// `{{ pipeline }}`: prints the result unless it declares a variable.
    Output(Pipeline, usize),
    /// `if` with its `else if` branches and final `else`.
    If {
        branches: Vec<(Pipeline, Vec<Node>)>,
        otherwise: Vec<Node>,
        line: usize,
    },
    /// `with`.
    With {
        pipe: Pipeline,
        body: Vec<Node>,
        otherwise: Vec<Node>,
        line: usize,
    },
    /// `range`.
    Range {
        pipe: Pipeline,
        body: Vec<Node>,
        otherwise: Vec<Node>,
        line: usize,
    },
}

/// What ended a list.
enum Terminator {
    Eof,
    End,
    Else(Vec<Tok>),
}

pub(crate) struct Parser<'a> {
    name: &'a str,
    pieces: Vec<Piece>,
    pos: usize,
    pub(crate) defines: BTreeMap<String, Vec<Node>>,
}

impl<'a> Parser<'a> {
    pub(crate) fn new(name: &'a str, pieces: Vec<Piece>) -> Self {
        Self {
            name,
            pieces,
            pos: 0,
            defines: BTreeMap::new(),
        }
    }

    fn err(&self, line: usize, message: impl Into<String>) -> TemplateError {
        TemplateError {
            template: self.name.to_string(),
            line,
            message: message.into(),
        }
    }

    /// Parses the whole file.
    pub(crate) fn parse(&mut self) -> Result<Vec<Node>, TemplateError> {
        let (nodes, end, line) = self.list(0)?;
        match end {
            Terminator::Eof => Ok(nodes),
            Terminator::End => Err(self.err(line, "`end` without a matching if/with/range/define")),
            Terminator::Else(_) => Err(self.err(line, "`else` without a matching if/with/range")),
        }
    }

    /// Parses until `end`, `else` or the end of input; returns what stopped it and its line.
    fn list(&mut self, depth: usize) -> Result<(Vec<Node>, Terminator, usize), TemplateError> {
        let mut nodes = Vec::new();
        while let Some(piece) = self.pieces.get(self.pos).cloned() {
            self.pos += 1;
            let (body, line) = match piece {
                Piece::Text(t) => {
                    nodes.push(Node::Text(t));
                    continue;
                }
                Piece::Action { body, line } => (body, line),
            };
            let toks = tokens(&body).map_err(|m| self.err(line, m))?;
            let keyword = match toks.first() {
                Some(Tok::Ident(k)) => k.as_str(),
                _ => "",
            };
            let rest = toks.get(1..).unwrap_or_default().to_vec();
            match keyword {
                "end" => {
                    if !rest.is_empty() {
                        return Err(self.err(line, "`end` takes no arguments"));
                    }
                    return Ok((nodes, Terminator::End, line));
                }
                "else" => return Ok((nodes, Terminator::Else(rest), line)),
                "if" => nodes.push(self.if_chain(rest, line, depth)?),
                "with" | "range" => {
                    let pipe = self.pipeline(&rest, line, keyword == "range")?;
                    let (body, end, end_line) = self.list(depth + 1)?;
                    let otherwise = match end {
                        Terminator::End => Vec::new(),
                        Terminator::Else(toks) if toks.is_empty() => {
                            self.expect_end(depth, end_line)?
                        }
                        Terminator::Else(_) => {
                            return Err(
                                self.err(end_line, "only `if` takes `else if`; use a nested if")
                            );
                        }
                        Terminator::Eof => {
                            return Err(self.err(line, format!("`{keyword}` without `end`")));
                        }
                    };
                    nodes.push(if keyword == "with" {
                        Node::With {
                            pipe,
                            body,
                            otherwise,
                            line,
                        }
                    } else {
                        Node::Range {
                            pipe,
                            body,
                            otherwise,
                            line,
                        }
                    });
                }
                "define" => {
                    if depth > 0 {
                        return Err(self.err(line, "`define` is only allowed at the top level"));
                    }
                    let [Tok::Str(name)] = rest.as_slice() else {
                        return Err(self.err(line, "expected `define \"name\"`"));
                    };
                    let (body, end, _) = self.list(depth + 1)?;
                    if !matches!(end, Terminator::End) {
                        return Err(self.err(line, format!("`define {name:?}` without `end`")));
                    }
                    if self.defines.insert(name.clone(), body).is_some() {
                        return Err(self.err(line, format!("template {name:?} defined twice")));
                    }
                }
                "template" | "block" | "break" | "continue" => {
                    return Err(self.err(
                        line,
                        format!(
                            "`{keyword}` is outside the supported subset (use `include` for helpers)"
                        ),
                    ));
                }
                _ => nodes.push(Node::Output(self.pipeline(&toks, line, false)?, line)),
            }
        }
        Ok((nodes, Terminator::Eof, 0))
    }

    fn expect_end(&mut self, depth: usize, line: usize) -> Result<Vec<Node>, TemplateError> {
        let (nodes, end, end_line) = self.list(depth + 1)?;
        match end {
            Terminator::End => Ok(nodes),
            Terminator::Else(_) => Err(self.err(end_line, "a second `else`")),
            Terminator::Eof => Err(self.err(line, "`else` without `end`")),
        }
    }

    fn if_chain(
        &mut self,
        cond: Vec<Tok>,
        line: usize,
        depth: usize,
    ) -> Result<Node, TemplateError> {
        let mut branches = Vec::new();
        let mut cond = cond;
        let mut cond_line = line;
        loop {
            let pipe = self.pipeline(&cond, cond_line, false)?;
            let (body, end, end_line) = self.list(depth + 1)?;
            branches.push((pipe, body));
            match end {
                Terminator::End => {
                    return Ok(Node::If {
                        branches,
                        otherwise: Vec::new(),
                        line,
                    });
                }
                Terminator::Eof => return Err(self.err(line, "`if` without `end`")),
                Terminator::Else(toks) if toks.is_empty() => {
                    let otherwise = self.expect_end(depth, end_line)?;
                    return Ok(Node::If {
                        branches,
                        otherwise,
                        line,
                    });
                }
                Terminator::Else(toks) => match toks.split_first() {
                    Some((Tok::Ident(k), rest)) if k == "if" => {
                        cond = rest.to_vec();
                        cond_line = end_line;
                    }
                    _ => return Err(self.err(end_line, "expected `else` or `else if`")),
                },
            }
        }
    }

    fn pipeline(&self, toks: &[Tok], line: usize, range: bool) -> Result<Pipeline, TemplateError> {
        let mut vars = Vec::new();
        let mut assign = false;
        let mut start = 0;
        let decl_at = toks
            .iter()
            .position(|t| matches!(t, Tok::Declare | Tok::Assign));
        if let Some(at) = decl_at {
            let head = &toks[..at];
            let names: Option<Vec<String>> = match head {
                [Tok::Var(a, p)] if p.is_empty() => Some(vec![a.clone()]),
                [Tok::Var(a, p), Tok::Comma, Tok::Var(b, q)]
                    if range && p.is_empty() && q.is_empty() =>
                {
                    Some(vec![a.clone(), b.clone()])
                }
                _ => None,
            };
            let Some(names) = names else {
                return Err(self.err(line, "expected `$name :=` (or `$k, $v :=` in range)"));
            };
            vars = names;
            assign = matches!(toks[at], Tok::Assign);
            start = at + 1;
        }
        let commands = self.commands(&toks[start..], line)?;
        if commands.is_empty() {
            return Err(self.err(line, "empty action"));
        }
        Ok(Pipeline {
            vars,
            assign,
            commands,
        })
    }

    fn commands(&self, toks: &[Tok], line: usize) -> Result<Vec<Vec<Arg>>, TemplateError> {
        let mut commands = Vec::new();
        let mut current = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            let arg = match &toks[i] {
                Tok::Pipe => {
                    if current.is_empty() {
                        return Err(self.err(line, "a `|` with nothing before it"));
                    }
                    commands.push(std::mem::take(&mut current));
                    i += 1;
                    continue;
                }
                Tok::LParen => {
                    let mut depth = 0;
                    let mut close = None;
                    for (j, t) in toks.iter().enumerate().skip(i) {
                        match t {
                            Tok::LParen => depth += 1,
                            Tok::RParen => {
                                depth -= 1;
                                if depth == 0 {
                                    close = Some(j);
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                    let Some(close) = close else {
                        return Err(self.err(line, "unclosed `(`"));
                    };
                    let inner = self.pipeline(&toks[i + 1..close], line, false)?;
                    i = close;
                    Arg::Sub(Box::new(inner))
                }
                Tok::RParen => return Err(self.err(line, "unexpected `)`")),
                Tok::Field(p) => Arg::Field(p.clone()),
                Tok::Var(n, p) => Arg::Var(n.clone(), p.clone()),
                Tok::Str(s) => Arg::Literal(serde_yaml_ng::Value::String(s.clone())),
                Tok::Int(n) => Arg::Literal(serde_yaml_ng::Value::Number((*n).into())),
                Tok::Float(f) => Arg::Literal(serde_yaml_ng::Value::Number((*f).into())),
                Tok::Ident(w) => match w.as_str() {
                    "true" => Arg::Literal(serde_yaml_ng::Value::Bool(true)),
                    "false" => Arg::Literal(serde_yaml_ng::Value::Bool(false)),
                    "nil" => Arg::Literal(serde_yaml_ng::Value::Null),
                    _ => Arg::Func(w.clone()),
                },
                Tok::Declare | Tok::Assign | Tok::Comma => {
                    return Err(self.err(line, "unexpected `:=`, `=` or `,`"));
                }
            };
            current.push(arg);
            i += 1;
        }
        if !current.is_empty() {
            commands.push(current);
        } else if !commands.is_empty() {
            return Err(self.err(line, "a `|` with nothing after it"));
        }
        Ok(commands)
    }
}
