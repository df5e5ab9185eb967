// Package dra is the oracle of the differential test of Tessera's DRA allocator (crate
// tessera-dra): it runs the structured allocator of k8s.io/dynamic-resource-allocation, with
// every feature of the pinned release on, on the same slices, classes and claims, and checks
// the allocation Tessera found.
package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-gpu/tessera/hack/k8s/internal/jsonl"
)

// Case is one allocation problem for node "n1": every ResourceSlice of the cluster, the
// DeviceClasses, the claims to allocate together, the claims already allocated, and (when
// Tessera found one) Tessera's allocation, one result per claim in order.
type Case struct {
	ID        *int64                         `json:"id"`
	Node      *v1.Node                       `json:"node,omitempty"`
	Slices    []*resourceapi.ResourceSlice   `json:"slices"`
	Classes   []*resourceapi.DeviceClass     `json:"classes"`
	Claims    []*resourceapi.ResourceClaim   `json:"claims"`
	Allocated []*resourceapi.ResourceClaim   `json:"allocated"`
	Tessera   []resourceapi.AllocationResult `json:"tessera,omitempty"`
}

// Answer is upstream's verdict: whether the claims can be allocated (an error counts as
// no, with its text), and, for Tessera's allocation, why it is not valid (empty when it is).
type Answer struct {
	ID       *int64 `json:"id"`
	Feasible bool   `json:"feasible"`
	Error    string `json:"error,omitempty"`
	Invalid  string `json:"invalid,omitempty"`
}

// Features: everything the pinned allocator supports that a v1.37 cluster runs by default,
// plus admin access.
var Features = structured.Features{
	AdminAccess:             true,
	ConsumableCapacity:      true,
	DeviceBindingAndStatus:  true,
	DeviceTaints:            true,
	FractionalCapacityRange: true,
	PartitionableDevices:    true,
	PrioritizedList:         true,
}

type classes []*resourceapi.DeviceClass

func (l classes) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			consumed := map[resourceapi.QualifiedName]resource.Quantity{}
			for name, q := range r.ConsumedCapacity {
				consumed[name] = q
			}
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, consumed))
		}
	}
	return state
}

func allocate(ctx context.Context, c *Case, slices []*resourceapi.ResourceSlice) ([]resourceapi.AllocationResult, error) {
	node := c.Node
	if node == nil {
		node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	}
	alloc, err := structured.NewAllocator(ctx, Features, allocatedState(c.Allocated), classes(c.Classes), slices,
		cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		return nil, err
	}
	return alloc.Allocate(ctx, node, c.Claims)
}

// Evaluate answers one case.
func Evaluate(ctx context.Context, c *Case) Answer {
	answer := Answer{ID: c.ID}
	results, err := allocate(ctx, c, c.Slices)
	if err != nil {
		answer.Error = err.Error()
	}
	answer.Feasible = err == nil && results != nil
	if c.Tessera != nil {
		answer.Invalid = check(ctx, c)
	}
	return answer
}

// check says why Tessera's allocation is not valid, or "". Every result must name a request
// of its claim and a device of the node's slices, and the claims' constraints must hold over
// the devices as allocated; then upstream, given only the devices Tessera chose (and those
// already allocated, which still draw on shared counters) and the claims without their
// constraints, must find an allocation: the chosen devices satisfy every selector, count,
// taint, counter and capacity rule. (Constraints are checked here rather than by that run
// because a request for All devices under a constraint fails hard on the first combination
// that breaks it, which a smaller device set can reach first.)
func check(ctx context.Context, c *Case) string {
	if len(c.Tessera) != len(c.Claims) {
		return fmt.Sprintf("%d results for %d claims", len(c.Tessera), len(c.Claims))
	}
	type key struct{ driver, pool, device string }
	devices := map[key]*resourceapi.Device{}
	for _, s := range c.Slices {
		for i := range s.Spec.Devices {
			devices[key{s.Spec.Driver, s.Spec.Pool.Name, s.Spec.Devices[i].Name}] = &s.Spec.Devices[i]
		}
	}
	keep := sets.New[key]()
	for _, claim := range c.Allocated {
		if claim.Status.Allocation != nil {
			for _, r := range claim.Status.Allocation.Devices.Results {
				keep.Insert(key{r.Driver, r.Pool, r.Device})
			}
		}
	}
	unconstrained := make([]*resourceapi.ResourceClaim, len(c.Claims))
	for i, result := range c.Tessera {
		claim := c.Claims[i]
		requests := sets.New[string]()
		for _, r := range claim.Spec.Devices.Requests {
			requests.Insert(r.Name)
			for _, s := range r.FirstAvailable {
				requests.Insert(r.Name + "/" + s.Name)
			}
		}
		for _, r := range result.Devices.Results {
			k := key{r.Driver, r.Pool, r.Device}
			if devices[k] == nil {
				return fmt.Sprintf("claim %s: device %s/%s/%s does not exist", claim.Name, r.Driver, r.Pool, r.Device)
			}
			if !requests.Has(r.Request) {
				return fmt.Sprintf("claim %s: result for unknown request %q", claim.Name, r.Request)
			}
			keep.Insert(k)
		}
		for n, constraint := range claim.Spec.Devices.Constraints {
			var values []resourceapi.DeviceAttribute
			for _, r := range result.Devices.Results {
				base, _, _ := strings.Cut(r.Request, "/")
				if len(constraint.Requests) > 0 && !slices.Contains(constraint.Requests, base) && !slices.Contains(constraint.Requests, r.Request) {
					continue
				}
				var name resourceapi.FullyQualifiedName
				if constraint.MatchAttribute != nil {
					name = *constraint.MatchAttribute
				} else if constraint.DistinctAttribute != nil {
					name = *constraint.DistinctAttribute
				}
				value, ok := attribute(devices[key{r.Driver, r.Pool, r.Device}], r.Driver, name)
				if !ok {
					return fmt.Sprintf("claim %s, constraint #%d: device %s lacks %s", claim.Name, n, r.Device, name)
				}
				values = append(values, value)
			}
			for a := range values {
				for b := range a {
					same := reflect.DeepEqual(values[a], values[b])
					if constraint.MatchAttribute != nil && !same {
						return fmt.Sprintf("claim %s, constraint #%d: values differ", claim.Name, n)
					}
					if constraint.DistinctAttribute != nil && same {
						return fmt.Sprintf("claim %s, constraint #%d: values repeat", claim.Name, n)
					}
				}
			}
		}
		unconstrained[i] = claim.DeepCopy()
		unconstrained[i].Spec.Devices.Constraints = nil
	}
	restricted := make([]*resourceapi.ResourceSlice, 0, len(c.Slices))
	for _, s := range c.Slices {
		s = s.DeepCopy()
		kept := s.Spec.Devices[:0]
		for _, d := range s.Spec.Devices {
			if keep.Has(key{s.Spec.Driver, s.Spec.Pool.Name, d.Name}) {
				kept = append(kept, d)
			}
		}
		s.Spec.Devices = kept
		restricted = append(restricted, s)
	}
	limited := *c
	limited.Claims = unconstrained
	results, err := allocate(ctx, &limited, restricted)
	switch {
	case err != nil:
		return "upstream, limited to Tessera's devices: " + err.Error()
	case results == nil:
		return "upstream finds no allocation among the devices Tessera chose"
	}
	return ""
}

// attribute looks an attribute up as the allocator does: by its name, or, qualified with the
// driver's own domain, by its bare name.
func attribute(device *resourceapi.Device, driver string, name resourceapi.FullyQualifiedName) (resourceapi.DeviceAttribute, bool) {
	if value, ok := device.Attributes[resourceapi.QualifiedName(name)]; ok {
		return value, true
	}
	domain, id, found := strings.Cut(string(name), "/")
	if !found || domain != driver {
		return resourceapi.DeviceAttribute{}, false
	}
	value, ok := device.Attributes[resourceapi.QualifiedName(id)]
	return value, ok
}

type refusal struct {
	ID    *int64 `json:"id"`
	Error string `json:"error"`
}

// Serve reads one JSON case per line from in and writes one JSON answer per line to out, in
// order. A line that cannot be decoded gets {"id": null, "error": "..."}; only an I/O error
// ends Serve early. Blank lines are skipped.
func Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	return jsonl.Serve(in, out, func(line []byte) []byte { return answerLine(ctx, line) })
}

func answerLine(ctx context.Context, line []byte) (out []byte) {
	var c Case
	defer func() {
		if p := recover(); p != nil {
			out = jsonl.Encode(refusal{ID: c.ID, Error: fmt.Sprintf("panic: %v", p)})
		}
	}()
	if err := json.Unmarshal(line, &c); err != nil {
		return jsonl.Encode(refusal{Error: err.Error()})
	}
	return jsonl.Encode(Evaluate(ctx, &c))
}
