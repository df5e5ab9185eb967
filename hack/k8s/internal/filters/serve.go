package filters

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	r := bufio.NewReaderSize(in, 1<<20)
	w := bufio.NewWriterSize(out, 1<<16)
	for {
		line, readErr := r.ReadBytes('\n')
		if line = bytes.TrimSpace(line); len(line) > 0 {
			if _, err := w.Write(answerLine(ctx, o, line)); err != nil {
				return err
			}
		}
		if readErr != nil {
			if errors.Is(readErr, io.EOF) {
				return w.Flush()
			}
			_ = w.Flush()
			return readErr
		}
		// Flushing only when no further input is already buffered keeps a pipelined caller
		// fast (one write per batch) and an interactive one answered line by line.
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

func answerLine(ctx context.Context, o *Oracle, line []byte) (out []byte) {
	var c Case
	defer func() {
		// A plugin that panics on a strange object must not end the run: the caller is a
		// test harness that wants the remaining answers.
		if p := recover(); p != nil {
			out = encode(refusal{ID: c.ID, Error: fmt.Sprintf("panic: %v", p)})
		}
	}()
	if err := json.Unmarshal(line, &c); err != nil {
		return encode(refusal{ID: idOf(line), Error: err.Error()})
	}
	nodes, err := o.Evaluate(ctx, &c)
	if err != nil {
		return encode(refusal{ID: c.ID, Error: err.Error()})
	}
	return encode(answer{ID: c.ID, Nodes: nodes})
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

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own plain structs are encoded; this cannot fail, but the line must exist.
		b = []byte(`{"id":null,"error":"encoding the answer failed"}`)
	}
	return append(b, '\n')
}
