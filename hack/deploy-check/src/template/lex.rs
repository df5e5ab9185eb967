//! Splits a template into text and actions (applying the `{{-` / `-}}` trim markers) and
//! tokenizes the inside of one action.

use super::TemplateError;

/// A piece of template source.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    /// Literal text, already trimmed by neighbouring markers.
    Text(String),
    /// The inside of `{{ ... }}` without delimiters or trim markers; comments are dropped.
    Action {
        /// The action's text.
        body: String,
        /// 1-based line of the opening `{{`.
        line: usize,
    },
}

/// A token inside an action.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// A bare word: a keyword, a function name, `true`, `false` or `nil`.
    Ident(String),
    /// `.a.b` (empty for `.` itself).
    Field(Vec<String>),
    /// `$name.a.b` (`$` alone has an empty name).
    Var(String, Vec<String>),
    /// A string literal, unescaped.
    Str(String),
    /// An integer literal.
    Int(i64),
    /// A floating-point literal.
    Float(f64),
    /// `|`
    Pipe,
    /// `(`
    LParen,
    /// `)`
    RParen,
    /// `:=`
    Declare,
    /// `=`
    Assign,
    /// `,`
    Comma,
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Splits `source` into pieces.
pub(crate) fn split(name: &str, source: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = source;
    let mut offset = 0usize;
    let mut trim_next = false;
    let line_at = |pos: usize| source[..pos].matches('\n').count() + 1;
    while let Some(open) = rest.find("{{") {
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start_matches(is_space);
        }
        let after_open = &rest[open + 2..];
        let trim_left = after_open.starts_with('-') && after_open[1..].starts_with(is_space);
        if trim_left {
            text = text.trim_end_matches(is_space);
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text.to_string()));
        }
        let line = line_at(offset + open);
        let inner_start = if trim_left { 2 } else { 0 };
        let inner = &after_open[inner_start..];
        let close = find_close(inner).ok_or_else(|| TemplateError {
            template: name.to_string(),
            line,
            message: "unclosed action: no matching `}}`".into(),
        })?;
        let mut body = &inner[..close];
        let trim_right = body.ends_with('-') && body[..body.len() - 1].ends_with(is_space);
        if trim_right {
            body = &body[..body.len() - 1];
        }
        let body = body.trim_matches(is_space);
        if !(body.starts_with("/*") && body.ends_with("*/")) {
            if body.starts_with("/*") {
                return Err(TemplateError {
                    template: name.to_string(),
                    line,
                    message: "a comment must end with `*/` right before `}}` or ` -}}`".into(),
                });
            }
            pieces.push(Piece::Action {
                body: body.to_string(),
                line,
            });
        }
        trim_next = trim_right;
        let consumed = open + 2 + inner_start + close + 2;
        offset += consumed;
        rest = &rest[consumed..];
    }
    let text = if trim_next {
        rest.trim_start_matches(is_space)
    } else {
        rest
    };
    if !text.is_empty() {
        pieces.push(Piece::Text(text.to_string()));
    }
    Ok(pieces)
}

/// Position of the `}}` that closes an action, skipping string literals and comments.
fn find_close(inner: &str) -> Option<usize> {
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'`' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'`' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let end = inner[i + 2..].find("*/")?;
                i += 2 + end + 1;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Tokenizes the inside of one action.
pub(crate) fn tokens(body: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = body.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |i: &mut usize| {
        let start = *i;
        while *i < chars.len() && (chars[*i].is_alphanumeric() || chars[*i] == '_') {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    let fields = |i: &mut usize| -> Result<Vec<String>, String> {
        let mut path = Vec::new();
        while *i < chars.len() && chars[*i] == '.' {
            *i += 1;
            let name = word(i);
            if name.is_empty() {
                if path.is_empty() && (*i >= chars.len() || !chars[*i].is_alphanumeric()) {
                    // `.` alone.
                    break;
                }
                return Err("a `.` must be followed by a field name".into());
            }
            path.push(name);
        }
        Ok(path)
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if is_space(c) => i += 1,
            '|' => {
                out.push(Tok::Pipe);
                i += 1;
            }
            '(' => {
                out.push(Tok::LParen);
                i += 1;
            }
            ')' => {
                out.push(Tok::RParen);
                i += 1;
            }
            ',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            ':' if chars.get(i + 1) == Some(&'=') => {
                out.push(Tok::Declare);
                i += 2;
            }
            '=' => {
                out.push(Tok::Assign);
                i += 1;
            }
            '.' => out.push(Tok::Field(fields(&mut i)?)),
            '$' => {
                i += 1;
                let name = word(&mut i);
                out.push(Tok::Var(name, fields(&mut i)?));
            }
            '"' => {
                i += 1;
                let mut s = String::new();
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err("unterminated string literal".into());
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let Some(&e) = chars.get(i) else {
                                return Err("unterminated string literal".into());
                            };
                            i += 1;
                            s.push(match e {
                                'n' => '\n',
                                't' => '\t',
                                'r' => '\r',
                                '\\' => '\\',
                                '"' => '"',
                                other => {
                                    return Err(format!(
                                        "unsupported escape `\\{other}` in a string literal (use \\n, \\t, \\r, \\\\ or \\\")"
                                    ));
                                }
                            });
                        }
                        c => s.push(c),
                    }
                }
                out.push(Tok::Str(s));
            }
            '`' => {
                i += 1;
                let start = i;
                while i < chars.len() && chars[i] != '`' {
                    i += 1;
                }
                if i >= chars.len() {
                    return Err("unterminated raw string literal".into());
                }
                out.push(Tok::Str(chars[start..i].iter().collect()));
                i += 1;
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let start = i;
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                if text.contains('.') {
                    out.push(Tok::Float(
                        text.parse()
                            .map_err(|_| format!("bad number literal {text:?}"))?,
                    ));
                } else {
                    out.push(Tok::Int(
                        text.parse()
                            .map_err(|_| format!("bad number literal {text:?}"))?,
                    ));
                }
            }
            c if c.is_alphabetic() || c == '_' => out.push(Tok::Ident(word(&mut i))),
            other => return Err(format!("unexpected character {other:?}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(pieces: &[Piece]) -> Vec<String> {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => format!("T:{t}"),
                Piece::Action { body, .. } => format!("A:{body}"),
            })
            .collect()
    }

    #[test]
    fn trim_markers_eat_whitespace_on_their_side_only() {
        let p = split("t", "a  \n  {{- .x -}}  \n b {{ .y }} c").unwrap();
        assert_eq!(texts(&p), ["T:a", "A:.x", "T:b ", "A:.y", "T: c"]);
    }

    #[test]
    fn a_dash_without_space_is_not_a_trim_marker() {
        let p = split("t", "a {{-3}} b").unwrap();
        assert_eq!(texts(&p), ["T:a ", "A:-3", "T: b"]);
    }

    #[test]
    fn comments_vanish_and_still_trim() {
        let p = split("t", "a\n{{- /* note }} here */ -}}\nb").unwrap();
        assert_eq!(texts(&p), ["T:a", "T:b"]);
    }

    #[test]
    fn braces_inside_strings_do_not_close() {
        let p = split("t", r#"{{ "}}" }}x"#).unwrap();
        assert_eq!(texts(&p), [r#"A:"}}""#, "T:x"]);
    }

    #[test]
    fn unclosed_action_names_the_line() {
        let e = split("t.yaml", "a\nb {{ .x").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("t.yaml:2"), "{e}");
    }

    #[test]
    fn tokenizes_fields_vars_and_literals() {
        let t = tokens(r#"$v := .Values.a | default "x\"y" 3 -1 2.5 (nindent 4 .) $.Chart.Name"#)
            .unwrap();
        assert_eq!(
            t,
            vec![
                Tok::Var("v".into(), vec![]),
                Tok::Declare,
                Tok::Field(vec!["Values".into(), "a".into()]),
                Tok::Pipe,
                Tok::Ident("default".into()),
                Tok::Str("x\"y".into()),
                Tok::Int(3),
                Tok::Int(-1),
                Tok::Float(2.5),
                Tok::LParen,
                Tok::Ident("nindent".into()),
                Tok::Int(4),
                Tok::Field(vec![]),
                Tok::RParen,
                Tok::Var(String::new(), vec!["Chart".into(), "Name".into()]),
            ]
        );
    }
}
