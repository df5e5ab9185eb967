// Package promlint checks a Prometheus text exposition the way promtool's `check metrics`
// does: it must parse, and it must pass the upstream linter (names, units, help text, types).
// OpenMetrics text (what the Rust prometheus-client crate serves) is read as Prometheus
// ingests it: a counter family `x` is the series `x_total`.
package promlint

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Check returns one line per problem; none means the exposition is clean.
func Check(r io.Reader) ([]string, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if isOpenMetrics(data) {
		converted, problems := fromOpenMetrics(data)
		if len(problems) > 0 {
			return problems, nil
		}
		data = converted
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return []string{fmt.Sprintf("does not parse as the Prometheus text format: %v", err)}, nil
	}
	if len(families) == 0 {
		return []string{"no metric families"}, nil
	}
	problems, err := promlint.New(bytes.NewReader(data)).Lint()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range problems {
		out = append(out, fmt.Sprintf("%s: %s", p.Metric, p.Text))
	}
	return out, nil
}

// isOpenMetrics reports whether the exposition ends with OpenMetrics' mandatory `# EOF`.
func isOpenMetrics(data []byte) bool {
	return bytes.HasSuffix(bytes.TrimRight(data, "\n"), []byte("# EOF"))
}

// fromOpenMetrics rewrites an OpenMetrics exposition into the Prometheus text format the
// upstream linter reads: counter families take their `_total` sample name in HELP and TYPE,
// `_created` samples and UNIT lines (not part of the text format) are dropped, and nothing may
// follow `# EOF`.
func fromOpenMetrics(data []byte) ([]byte, []string) {
	counters := map[string]bool{}
	lines := []string{}
	scanner := bufio.NewScanner(bytes.NewReader(data))
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
	}
	for _, line := range lines {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && f[3] == "counter" {
			counters[f[2]] = true
		}
	}
	var out bytes.Buffer
	var problems []string
	for i, line := range lines {
		if line == "# EOF" {
			if i != len(lines)-1 {
				problems = append(problems, fmt.Sprintf("line %d: content after # EOF", i+1))
			}
			break
		}
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "#" {
			switch f[1] {
			case "UNIT":
				continue
			case "HELP", "TYPE":
				if counters[f[2]] {
					line = strings.Replace(line, f[2], f[2]+"_total", 1)
				}
			}
		} else if len(f) >= 1 {
			name, _, _ := strings.Cut(f[0], "{")
			if base, ok := strings.CutSuffix(name, "_created"); ok && counters[base] {
				continue
			}
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	return out.Bytes(), problems
}
