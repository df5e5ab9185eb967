package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// twoGPUs is a case in the wire format: two devices of one pool, a class, and a claim for
// `count` devices whose numa attributes must match.
func twoGPUs(count int, tessera string) string {
	c := `{"id": 7,
	  "slices": [{"metadata": {"name": "s"}, "spec": {"driver": "d", "nodeName": "n1",
	    "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
	    "devices": [{"name": "a", "attributes": {"numa": {"int": 0}}},
	                {"name": "b", "attributes": {"numa": {"int": 1}}}]}}],
	  "classes": [{"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": "device.driver == 'd'"}}]}}],
	  "claims": [{"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {
	    "requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": COUNT}}],
	    "constraints": [{"matchAttribute": "d/numa"}]}}}]`
	c = strings.Replace(c, "COUNT", string(rune('0'+count)), 1)
	if tessera != "" {
		c += `, "tessera": ` + tessera
	}
	return strings.ReplaceAll(c+"}", "\n", " ") + "\n"
}

func serve(t *testing.T, lines ...string) []Answer {
	t.Helper()
	var out bytes.Buffer
	if err := Serve(context.Background(), strings.NewReader(strings.Join(lines, "")), &out); err != nil {
		t.Fatal(err)
	}
	var answers []Answer
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var a Answer
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		answers = append(answers, a)
	}
	return answers
}

func TestUpstreamVerdicts(t *testing.T) {
	answers := serve(t, twoGPUs(1, ""), twoGPUs(2, ""))
	if len(answers) != 2 || !answers[0].Feasible || answers[1].Feasible {
		t.Fatalf("want feasible, infeasible (numa differs); got %+v", answers)
	}
	if answers[0].ID == nil || *answers[0].ID != 7 {
		t.Fatalf("id not echoed: %+v", answers[0])
	}
}

func TestChecksTesseraAllocation(t *testing.T) {
	good := `[{"devices": {"results": [{"request": "r", "driver": "d", "pool": "p", "device": "b"}]}}]`
	unknown := `[{"devices": {"results": [{"request": "r", "driver": "d", "pool": "p", "device": "zz"}]}}]`
	broken := `[{"devices": {"results": [{"request": "r", "driver": "d", "pool": "p", "device": "a"},
	                                     {"request": "r", "driver": "d", "pool": "p", "device": "b"}]}}]`
	answers := serve(t, twoGPUs(1, good), twoGPUs(1, unknown), twoGPUs(2, broken))
	if answers[0].Invalid != "" {
		t.Errorf("a valid allocation was refused: %s", answers[0].Invalid)
	}
	if !strings.Contains(answers[1].Invalid, "does not exist") {
		t.Errorf("unknown device: %q", answers[1].Invalid)
	}
	if !strings.Contains(answers[2].Invalid, "values differ") {
		t.Errorf("broken constraint: %q", answers[2].Invalid)
	}
}

func TestBadLineIsRefusedAndServingGoesOn(t *testing.T) {
	var out bytes.Buffer
	if err := Serve(context.Background(), strings.NewReader("{not json\n"+twoGPUs(1, "")), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"error"`) || !strings.Contains(lines[1], `"feasible":true`) {
		t.Fatalf("got %q", lines)
	}
}
