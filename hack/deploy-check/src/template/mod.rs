//! A renderer for the subset of Go's `text/template` (with Helm's functions) that the Tessera
//! chart is written in, so the chart can be rendered and checked where Helm is not installed.
//!
//! The subset (also in `deploy/helm/tessera/README.md`):
//! - fields `.a.b`, `.`, variables `$`, `$x`, `$x.a`; `{{ $x := ... }}`, `{{ $x = ... }}`;
//! - `if` / `else if` / `else` / `end`, `with` (+ `else`), `range` (+ `$i, $v :=`, `else`);
//! - `define "name"` at the top level of any file, used through `include "name" ctx`;
//! - pipelines `a | f b`, parentheses, string (`"..."`, raw) / number / `true` / `false` / `nil`
//!   literals; comments `{{/* ... */}}`; trim markers `{{- ` and ` -}}`;
//! - functions: see [`funcs::FUNCTIONS`].
//!
//! Behaviour follows Go and Helm where they define it: a missing map key is nil, reading a
//! field through nil is an error, nil prints as nothing, `range` over a map goes in key order,
//! `toYaml` drops the final newline. Printing a list or map directly is an error here (Go
//! would print `map[...]`), which catches a forgotten `toYaml`.

mod eval;
pub mod funcs;
mod lex;
mod parse;

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

/// A template that could not be parsed or executed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{template}:{line}: {message}")]
pub struct TemplateError {
    /// File or `define` name.
    pub template: String,
    /// 1-based line (0 when unknown).
    pub line: usize,
    /// What went wrong.
    pub message: String,
}

/// Parsed files and the helpers they define.
#[derive(Debug, Default)]
pub struct TemplateSet {
    files: BTreeMap<String, Vec<parse::Node>>,
    defines: BTreeMap<String, Vec<parse::Node>>,
}

impl TemplateSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses one file; its `define`s become available to every file of the set.
    pub fn add(&mut self, name: &str, source: &str) -> Result<(), TemplateError> {
        let pieces = lex::split(name, source)?;
        let mut parser = parse::Parser::new(name, pieces);
        let nodes = parser.parse()?;
        for (define, body) in std::mem::take(&mut parser.defines) {
            if self.defines.insert(define.clone(), body).is_some() {
                return Err(TemplateError {
                    template: name.to_string(),
                    line: 0,
                    message: format!("template {define:?} is defined in more than one file"),
                });
            }
        }
        self.files.insert(name.to_string(), nodes);
        Ok(())
    }

    /// Renders file `name` with `root` as both `.` and `$`.
    pub fn render(&self, name: &str, root: &Value) -> Result<String, TemplateError> {
        let nodes = self.files.get(name).ok_or_else(|| TemplateError {
            template: name.to_string(),
            line: 0,
            message: "no such template file".into(),
        })?;
        let mut exec = eval::Exec::new(&self.defines, name, root);
        let mut out = String::new();
        exec.run(nodes, root, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, values: &str) -> Result<String, TemplateError> {
        let mut set = TemplateSet::new();
        set.add("t", src)?;
        let root: Value = serde_yaml_ng::from_str(values).unwrap();
        set.render("t", &root)
    }

    fn ok(src: &str, values: &str) -> String {
        render(src, values).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn fields_and_missing_keys() {
        assert_eq!(ok("a={{ .A.b }} m={{ .A.zz }}.", "A: {b: 3}"), "a=3 m=.");
        let e = render("{{ .A.zz.y }}", "A: {b: 3}").unwrap_err();
        assert!(e.message.contains("nil pointer evaluating .A.zz.y"), "{e}");
    }

    #[test]
    fn if_else_if_else_with_trim() {
        let src = "{{- if .a }}A{{- else if .b }}B{{ else }}C{{ end }}";
        assert_eq!(ok(src, "a: true"), "A");
        assert_eq!(ok(src, "b: 1"), "B");
        assert_eq!(ok(src, "b: 0"), "C");
        assert_eq!(ok(src, "a: []\nb: ''"), "C");
    }

    #[test]
    fn with_rebinds_dot_and_dollar_stays_root() {
        let src = "{{ with .x }}{{ .y }}/{{ $.n }}{{ else }}none{{ end }}";
        assert_eq!(ok(src, "x: {y: 1}\nn: r"), "1/r");
        assert_eq!(ok(src, "n: r"), "none");
    }

    #[test]
    fn range_over_lists_and_sorted_maps() {
        assert_eq!(
            ok("{{ range .l }}[{{ . }}]{{ end }}", "l: [a, b]"),
            "[a][b]"
        );
        assert_eq!(
            ok(
                "{{ range $k, $v := .m }}{{ $k }}={{ $v }};{{ end }}",
                "m: {z: 1, a: 2}"
            ),
            "a=2;z=1;"
        );
        assert_eq!(
            ok("{{ range .l }}x{{ else }}empty{{ end }}", "l: []"),
            "empty"
        );
    }

    #[test]
    fn helpers_functions_and_pipelines() {
        let src = r#"{{- define "name" -}}{{ .Release.Name }}-x{{- end -}}
n: {{ include "name" . | quote }}
r: {{- toYaml .res | nindent 2 }}
d: {{ .missing | default "dflt" }}
e: {{ default 5 .zero }}
q: {{ quote .n 2 }}
c: {{ if and .t (not .f) (eq .s "v") }}yes{{ end }}
i: {{ toYaml .l | indent 4 }}
"#;
        let out = ok(
            src,
            "Release: {Name: rel}\nres: {limits: {cpu: 1}}\nzero: 0\nn: a\"b\nt: true\nf: false\ns: v\nl: [1]",
        );
        assert_eq!(
            out,
            "n: \"rel-x\"\nr:\n  limits:\n    cpu: 1\nd: dflt\ne: 5\nq: \"a\\\"b\" \"2\"\nc: yes\ni:     - 1\n"
        );
    }

    #[test]
    fn variables_and_scoping() {
        let src = "{{ $a := .x }}{{ if true }}{{ $b := 2 }}{{ $a = 3 }}{{ end }}{{ $a }}";
        assert_eq!(ok(src, "x: 1"), "3");
        let e = render("{{ if true }}{{ $b := 2 }}{{ end }}{{ $b }}", "{}").unwrap_err();
        assert!(e.message.contains("undefined variable $b"), "{e}");
    }

    #[test]
    fn required_fails_with_its_message() {
        let e = render(r#"{{ required "image.tag is required" .tag }}"#, "{}").unwrap_err();
        assert_eq!(e.message, "image.tag is required");
        assert_eq!(ok(r#"{{ required "m" .tag }}"#, "tag: v1"), "v1");
    }

    #[test]
    fn errors_name_the_line_and_what_is_wrong() {
        let e = render("a\n{{ toYml . }}", "{}").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unknown function \"toYml\""), "{e}");
        let e = render("{{ if .a }}x", "{}").unwrap_err();
        assert!(e.message.contains("without `end`"), "{e}");
        let e = render("{{ .m }}", "m: {a: 1}").unwrap_err();
        assert!(e.message.contains("toYaml"), "{e}");
        let e = render("{{ template \"x\" . }}", "{}").unwrap_err();
        assert!(e.message.contains("outside the supported subset"), "{e}");
        let e = render("{{ include \"nope\" . }}", "{}").unwrap_err();
        assert!(e.message.contains("no template named"), "{e}");
    }

    #[test]
    fn include_loops_are_caught() {
        let e = render(
            r#"{{ define "a" }}{{ include "a" . }}{{ end }}{{ include "a" . }}"#,
            "{}",
        )
        .unwrap_err();
        assert!(e.message.contains("nests too deeply"), "{e}");
    }
}
