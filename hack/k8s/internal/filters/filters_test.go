package filters

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func node(name, zone string, mutate ...func(*v1.Node)) v1.Node {
	n := v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			v1.LabelHostname:     name,
			v1.LabelTopologyZone: zone,
		}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse("4"),
			v1.ResourceMemory: resource.MustParse("8Gi"),
			v1.ResourcePods:   resource.MustParse("110"),
		}},
	}
	for _, m := range mutate {
		m(&n)
	}
	return n
}

func pod(name, nodeName string, labels map[string]string, mutate ...func(*v1.Pod)) v1.Pod {
	p := v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: v1.PodSpec{
			NodeName:   nodeName,
			Containers: []v1.Container{{Name: "c", Image: "i"}},
		},
	}
	p.UID = types.UID("uid-" + p.Name)
	for _, m := range mutate {
		m(&p)
	}
	return p
}

// failing reduces an answer to node -> the failing plugins' names.
func failing(t *testing.T, c Case) map[string][]string {
	t.Helper()
	o, err := NewOracle()
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	got, err := o.Evaluate(context.Background(), &c)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for n, fs := range got {
		out[n] = []string{}
		for _, f := range fs {
			out[n] = append(out[n], f.Plugin)
		}
	}
	return out
}

func expect(t *testing.T, got map[string][]string, want map[string][]string) {
	t.Helper()
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("failing plugins per node:\n got %v\nwant %v", got, want)
	}
}

func TestFilters(t *testing.T) {
	webAntiAffinity := func(p *v1.Pod) {
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				TopologyKey:   v1.LabelHostname,
			}},
		}}
	}
	hostPort := func(p *v1.Pod) {
		p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080, Protocol: v1.ProtocolTCP}}
	}
	cases := []struct {
		name string
		c    Case
		want map[string][]string
	}{
		{
			name: "untolerated taint",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1", func(n *v1.Node) {
					n.Spec.Taints = []v1.Taint{{Key: "a", Value: "b", Effect: v1.TaintEffectNoSchedule}}
				}), node("n2", "z1")},
				Pod: ptr(pod("p", "", nil)),
			},
			want: map[string][]string{"n1": {"TaintToleration"}, "n2": {}},
		},
		{
			name: "node affinity In",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1"), node("n2", "z2")},
				Pod: ptr(pod("p", "", nil, func(p *v1.Pod) {
					p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
							MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{"z1"}}},
						}}},
					}}
				})),
			},
			want: map[string][]string{"n1": {}, "n2": {"NodeAffinity"}},
		},
		{
			// The PreFilterResult restricts the nodes; the one outside it fails NodeAffinity.
			name: "matchFields metadata.name",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1"), node("n2", "z2")},
				Pod: ptr(pod("p", "", nil, func(p *v1.Pod) {
					p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
							MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"n2"}}},
						}}},
					}}
				})),
			},
			want: map[string][]string{"n1": {"NodeAffinity"}, "n2": {}},
		},
		{
			name: "anti-affinity on hostname",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1"), node("n2", "z1")},
				Pods:  []v1.Pod{pod("web", "n1", map[string]string{"app": "web"})},
				Pod:   ptr(pod("p", "", nil, webAntiAffinity)),
			},
			want: map[string][]string{"n1": {"InterPodAffinity"}, "n2": {}},
		},
		{
			name: "topology spread maxSkew 1 across two zones",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1"), node("n2", "z2")},
				Pods:  []v1.Pod{pod("x", "n1", map[string]string{"app": "x"})},
				Pod: ptr(pod("p", "", map[string]string{"app": "x"}, func(p *v1.Pod) {
					p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{
						MaxSkew:           1,
						TopologyKey:       v1.LabelTopologyZone,
						WhenUnsatisfiable: v1.DoNotSchedule,
						LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
					}}
				})),
			},
			want: map[string][]string{"n1": {"PodTopologySpread"}, "n2": {}},
		},
		{
			name: "host port conflict",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1"), node("n2", "z1")},
				Pods:  []v1.Pod{pod("old", "n1", nil, hostPort)},
				Pod:   ptr(pod("p", "", nil, hostPort)),
			},
			want: map[string][]string{"n1": {"NodePorts"}, "n2": {}},
		},
		{
			name: "insufficient cpu, and a failing node reports every plugin",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1", func(n *v1.Node) {
					n.Status.Allocatable[v1.ResourceCPU] = resource.MustParse("1")
					n.Spec.Unschedulable = true
				}), node("n2", "z1")},
				Pod: ptr(pod("p", "", nil, func(p *v1.Pod) {
					p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}
				})),
			},
			want: map[string][]string{"n1": {"NodeUnschedulable", "NodeResourcesFit"}, "n2": {}},
		},
		{
			name: "PV node affinity through a bound PVC",
			c: Case{
				Nodes: []v1.Node{node("n1", "z1"), node("n2", "z2")},
				PVs: []v1.PersistentVolume{{
					ObjectMeta: metav1.ObjectMeta{Name: "pv1"},
					Spec: v1.PersistentVolumeSpec{
						Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
						AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
						PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/d"}},
						ClaimRef:               &v1.ObjectReference{Namespace: "default", Name: "data", UID: "pvc-uid"},
						StorageClassName:       "local",
						NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
							MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{"n2"}}},
						}}}},
					},
					Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
				}},
				PVCs: []v1.PersistentVolumeClaim{{
					// The PV controller's mark; without it the scheduler treats the claim as
					// not yet bound.
					ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default", UID: "pvc-uid",
						Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}},
					Spec: v1.PersistentVolumeClaimSpec{
						AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
						VolumeName:       "pv1",
						StorageClassName: ptr("local"),
						Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
					},
					Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
				}},
				StorageClasses: []storagev1.StorageClass{{
					ObjectMeta:        metav1.ObjectMeta{Name: "local"},
					Provisioner:       "kubernetes.io/no-provisioner",
					VolumeBindingMode: ptr(storagev1.VolumeBindingWaitForFirstConsumer),
				}},
				Pod: ptr(pod("p", "", nil, func(p *v1.Pod) {
					p.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{
						PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
					}}}
				})),
			},
			want: map[string][]string{"n1": {"VolumeBinding"}, "n2": {}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expect(t, failing(t, tc.c), tc.want)
		})
	}
}

// One oracle answers a stream: state from one case must not leak into the next, a bad line
// is refused with its id, and the answers keep the input order.
func TestServe(t *testing.T) {
	tainted := Case{
		Nodes: []v1.Node{node("n1", "z1", func(n *v1.Node) {
			n.Spec.Taints = []v1.Taint{{Key: "a", Effect: v1.TaintEffectNoSchedule}}
		})},
		Pod: ptr(pod("p", "", nil)),
	}
	clean := Case{Nodes: []v1.Node{node("n1", "z1")}, Pod: ptr(pod("p", "", nil))}
	var in bytes.Buffer
	for i, c := range []Case{tainted, clean} {
		c.ID = ptr(int64(i + 1))
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(b, '\n'))
	}
	in.WriteString(`{"id": 3, "nodes": 5}` + "\n")
	in.WriteString(`{"id": 4}` + "\n")
	in.WriteString("not json\n")
	var out bytes.Buffer
	if err := Serve(context.Background(), &in, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`{"id":1,"nodes":{"n1":[{"plugin":"TaintToleration","reasons":["node(s) had untolerated taint(s)"]}]}}`,
		`{"id":2,"nodes":{"n1":[]}}`,
		`{"id":3,"error":`,
		`{"id":4,"error":"\"pod\" is missing"}`,
		`{"id":null,"error":`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("line %d:\n got %s\nwant %s...", i+1, lines[i], want[i])
		}
	}
}

func ptr[T any](v T) *T { return &v }
