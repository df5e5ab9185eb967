// Package jsonl serves the JSON Lines oracles of kube-peer (filters, dra-allocate): one case
// per line in, one answer per line out, in order.
package jsonl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// Serve reads one line at a time from in and writes answer(line) to out, in the same order;
// answer must return one line ending in a newline. Blank lines are skipped; only an I/O error
// ends Serve early.
func Serve(in io.Reader, out io.Writer, answer func(line []byte) []byte) error {
	r := bufio.NewReaderSize(in, 1<<20)
	w := bufio.NewWriterSize(out, 1<<16)
	for {
		line, readErr := r.ReadBytes('\n')
		if line = bytes.TrimSpace(line); len(line) > 0 {
			if _, err := w.Write(answer(line)); err != nil {
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

// Encode writes v as one JSON line.
func Encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only the oracles' own plain structs are encoded; this cannot fail, but the line must exist.
		b = []byte(`{"id":null,"error":"encoding the answer failed"}`)
	}
	return append(b, '\n')
}
