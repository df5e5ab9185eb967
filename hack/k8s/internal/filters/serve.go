package filters

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/tessera-gpu/tessera/hack/k8s/internal/jsonl"
)

type answer struct {
	ID    *int64               `json:"id"`
	Nodes map[string][]Failure `json:"nodes"`
}

type refusal struct {
	ID    *int64 `json:"id"`
	Error string `json:"error"`
}

// Serve reads one JSON case per line from in and writes one JSON answer per line to out, in
// the same order. A line that cannot be answered gets {"id": ID or null, "error": "..."} and
// the next line is read; only an I/O error ends Serve early. Blank lines are skipped.
func Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	o, err := NewOracle()
	if err != nil {
		return err
	}
	defer o.Close()
	return jsonl.Serve(in, out, func(line []byte) []byte { return answerLine(ctx, o, line) })
}

func answerLine(ctx context.Context, o *Oracle, line []byte) (out []byte) {
	var c Case
	defer func() {
		// A plugin that panics on a strange object must not end the run: the caller is a
		// test harness that wants the remaining answers.
		if p := recover(); p != nil {
			out = jsonl.Encode(refusal{ID: c.ID, Error: fmt.Sprintf("panic: %v", p)})
		}
	}()
	if err := json.Unmarshal(line, &c); err != nil {
		return jsonl.Encode(refusal{ID: idOf(line), Error: err.Error()})
	}
	nodes, err := o.Evaluate(ctx, &c)
	if err != nil {
		return jsonl.Encode(refusal{ID: c.ID, Error: err.Error()})
	}
	return jsonl.Encode(answer{ID: c.ID, Nodes: nodes})
}

// idOf salvages the id of a line whose body does not decode, so the caller can still tell
// which case was refused.
func idOf(line []byte) *int64 {
	var probe struct {
		ID *int64 `json:"id"`
	}
	if json.Unmarshal(line, &probe) != nil {
		return nil
	}
	return probe.ID
}
