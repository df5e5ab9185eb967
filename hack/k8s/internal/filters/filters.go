// Package filters is an oracle for node feasibility made of kube-scheduler's own filter
// plugins: for a pending pod and a small cluster it reports, per node, every filter plugin
// that rejects the node and why. Tessera's constraint checks are compared against it.
//
// The plugins are the in-tree ones at the pinned release, built by the scheduler framework
// runtime from the default profile's plugin arguments, under the release's feature gates.
// Unlike the framework's own RunFilterPlugins, which stops at the first rejection, every
// plugin is asked about every node, so a caller can compare plugin by plugin.
package filters

import (
	"context"
	"errors"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	corev1defaults "k8s.io/kubernetes/pkg/apis/core/v1"
	storagev1defaults "k8s.io/kubernetes/pkg/apis/storage/v1"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	schedcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// Compared is the set of filter plugins the oracle runs, the ones whose semantics Tessera
// reimplements. The output lists them in the default profile's order.
var Compared = []string{
	names.NodeUnschedulable,
	names.NodeName,
	names.TaintToleration,
	names.NodeAffinity,
	names.NodeResourcesFit,
	names.NodePorts,
	names.InterPodAffinity,
	names.PodTopologySpread,
	names.VolumeBinding,
}

// Case is one question: can Pod go on each of Nodes, given the bound Pods and the objects
// the plugins look up (namespaces for namespaceSelector, PVs, PVCs and storage classes for
// volume binding). Objects are in their API JSON form.
type Case struct {
	ID             *int64                     `json:"id"`
	Nodes          []v1.Node                  `json:"nodes"`
	Pods           []v1.Pod                   `json:"pods"`
	Namespaces     []v1.Namespace             `json:"namespaces"`
	PVs            []v1.PersistentVolume      `json:"pvs"`
	PVCs           []v1.PersistentVolumeClaim `json:"pvcs"`
	StorageClasses []storagev1.StorageClass   `json:"storageClasses"`
	Pod            *v1.Pod                    `json:"pod"`
}

// Failure is one plugin's rejection of one node, with the reasons kube-scheduler would
// report in the pod's FailedScheduling event.
type Failure struct {
	Plugin  string   `json:"plugin"`
	Reasons []string `json:"reasons"`
}

// swappableLister is the snapshot the framework hands to plugins. Plugins keep the lister
// they were built with, so the framework is built once and each case swaps the snapshot
// underneath instead of rebuilding every plugin.
type swappableLister struct {
	fwk.SharedLister
}

// Oracle holds a framework built once; Evaluate answers one case at a time (not safe for
// concurrent use: the snapshot and the informer stores are shared).
type Oracle struct {
	lister  *swappableLister
	plugins []plugin
	stores  stores
	cancel  context.CancelFunc
}

type plugin struct {
	name      string
	preFilter fwk.PreFilterPlugin
	filter    fwk.FilterPlugin
}

// stores are the informer caches the plugins' listers read. The informers are never started:
// the fake clientset behind them only satisfies the factory, and each case replaces the
// stores' contents directly, which is synchronous, where a started informer would need a
// watch round trip and WaitForCacheSync's 100 ms polling per case. In this release the
// volume binder's assume caches read the informer's indexer directly, so they see the
// replaced contents too.
type stores struct {
	namespaces, pvs, pvcs, storageClasses cache.Indexer
}

// NewOracle builds the framework from the in-tree registry and the default profile,
// restricted to the compared plugins (plus the queue-sort and bind plugins a profile must
// have). Close releases it.
func NewOracle() (*Oracle, error) {
	ctx, cancel := context.WithCancel(context.Background())
	o, err := newOracle(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	o.cancel = cancel
	return o, nil
}

func newOracle(ctx context.Context) (*Oracle, error) {
	// The framework wraps plugins in metric observers and dereferences the scheduler's
	// metric vectors, which exist only once registered (idempotent).
	metrics.Register()
	cfg, err := latest.Default()
	if err != nil {
		return nil, fmt.Errorf("default scheduler configuration: %w", err)
	}
	if len(cfg.Profiles) == 0 {
		return nil, errors.New("default scheduler configuration has no profile")
	}
	profile := cfg.Profiles[0].DeepCopy()
	keep := append([]string{names.PrioritySort, names.DefaultBinder}, Compared...)
	var enabled []config.Plugin
	for _, p := range profile.Plugins.MultiPoint.Enabled {
		if slices.Contains(keep, p.Name) {
			enabled = append(enabled, p)
		}
	}
	profile.Plugins.MultiPoint.Enabled = enabled

	// The framework offers no accessor for its plugin instances, and the comparison needs
	// each plugin on its own; the factories are wrapped to catch what they build.
	built := map[string]fwk.Plugin{}
	registry := plugins.NewInTreeRegistry()
	for name, factory := range registry {
		if !slices.Contains(keep, name) {
			delete(registry, name)
			continue
		}
		registry[name] = func(ctx context.Context, args runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
			p, err := factory(ctx, args, h)
			if err == nil {
				built[name] = p
			}
			return p, err
		}
	}

	factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	lister := &swappableLister{SharedLister: schedcache.NewEmptySnapshot()}
	// The framework logs at error level that gang scheduling is off when GenericWorkload is
	// on; that is expected here, and a zero logr.Logger discards it.
	_, err = frameworkruntime.NewFramework(ctx, registry, profile,
		frameworkruntime.WithSnapshotSharedLister(lister),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithClientSet(fake.NewClientset()),
		frameworkruntime.WithLogger(klog.Logger{}),
	)
	if err != nil {
		return nil, fmt.Errorf("building the scheduler framework: %w", err)
	}

	o := &Oracle{lister: lister}
	for _, name := range enabledOrder(profile) {
		p, ok := built[name]
		if !ok {
			return nil, fmt.Errorf("plugin %s was not built", name)
		}
		f, ok := p.(fwk.FilterPlugin)
		if !ok {
			return nil, fmt.Errorf("plugin %s is not a filter plugin", name)
		}
		pf, _ := p.(fwk.PreFilterPlugin)
		o.plugins = append(o.plugins, plugin{name: name, preFilter: pf, filter: f})
	}

	// The factory hands out one informer per type, so these are the stores the plugins'
	// listers read.
	o.stores = stores{
		namespaces:     factory.Core().V1().Namespaces().Informer().GetIndexer(),
		pvs:            factory.Core().V1().PersistentVolumes().Informer().GetIndexer(),
		pvcs:           factory.Core().V1().PersistentVolumeClaims().Informer().GetIndexer(),
		storageClasses: factory.Storage().V1().StorageClasses().Informer().GetIndexer(),
	}
	return o, nil
}

func enabledOrder(profile *config.KubeSchedulerProfile) []string {
	var out []string
	for _, p := range profile.Plugins.MultiPoint.Enabled {
		if slices.Contains(Compared, p.Name) {
			out = append(out, p.Name)
		}
	}
	return out
}

// Close stops the framework's background goroutines.
func (o *Oracle) Close() {
	if o.cancel != nil {
		o.cancel()
	}
}

// Evaluate runs every compared plugin's PreFilter once and its Filter on every node, and
// returns each node's failures (an empty list for a node every plugin accepts).
func (o *Oracle) Evaluate(ctx context.Context, c *Case) (map[string][]Failure, error) {
	if c.Pod == nil {
		return nil, errors.New(`"pod" is missing`)
	}
	pod := c.Pod.DeepCopy()
	defaultPod(pod)

	nodes := make([]*v1.Node, 0, len(c.Nodes))
	seen := map[string]bool{}
	for i := range c.Nodes {
		n := c.Nodes[i].DeepCopy()
		if n.Name == "" {
			return nil, fmt.Errorf("nodes[%d] has no name", i)
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("node %q appears twice", n.Name)
		}
		seen[n.Name] = true
		corev1defaults.SetObjectDefaults_Node(n)
		nodes = append(nodes, n)
	}
	var pods []*v1.Pod
	for i := range c.Pods {
		p := c.Pods[i].DeepCopy()
		// The scheduler's cache holds assigned, non-terminal pods of existing nodes only:
		// its pod informer selects status.phase out of Succeeded and Failed, and a pod of
		// an unknown node belongs to no NodeInfo the plugins iterate.
		if p.Spec.NodeName == "" || !seen[p.Spec.NodeName] ||
			p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		defaultPod(p)
		pods = append(pods, p)
	}
	if err := o.fillStores(c); err != nil {
		return nil, err
	}
	snapshot := schedcache.NewSnapshot(pods, nodes)
	o.lister.SharedLister = snapshot
	infos, err := snapshot.NodeInfos().List()
	if err != nil {
		return nil, err
	}

	out := make(map[string][]Failure, len(nodes))
	for _, n := range nodes {
		out[n.Name] = []Failure{}
	}
	state := framework.NewCycleState()
	for _, pl := range o.plugins {
		if err := o.runPlugin(ctx, pl, state, pod, infos, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// runPlugin adds pl's failures to out, following how the scheduler treats the PreFilter
// outcome (schedule_one.go findNodesThatFitPod, runtime RunPreFilterPlugins): Skip means
// the plugin's Filter is not run, so it accepts every node; a rejection applies to every
// node; a PreFilterResult node set rejects the nodes outside it without running Filter
// there, with the framework's message.
func (o *Oracle) runPlugin(ctx context.Context, pl plugin, state fwk.CycleState, pod *v1.Pod, infos []fwk.NodeInfo, out map[string][]Failure) error {
	var allowed *fwk.PreFilterResult
	if pl.preFilter != nil {
		res, s := pl.preFilter.PreFilter(ctx, state, pod, infos)
		switch {
		case s.IsSkip():
			return nil
		case s.IsRejected():
			for _, ni := range infos {
				add(out, ni.Node().Name, pl.name, s)
			}
			return nil
		case !s.IsSuccess():
			return fmt.Errorf("PreFilter of %s: %w", pl.name, s.AsError())
		}
		allowed = res
	}
	for _, ni := range infos {
		name := ni.Node().Name
		if !allowed.AllNodes() && !allowed.NodeNames.Has(name) {
			add(out, name, pl.name, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("node(s) didn't satisfy plugin %s", pl.name)))
			continue
		}
		s := pl.filter.Filter(ctx, state, pod, ni)
		switch {
		case s.IsSuccess():
		case s.IsRejected():
			add(out, name, pl.name, s)
		default:
			return fmt.Errorf("Filter of %s on node %s: %w", pl.name, name, s.AsError())
		}
	}
	return nil
}

func add(out map[string][]Failure, node, plugin string, s *fwk.Status) {
	reasons := s.Reasons()
	if reasons == nil {
		reasons = []string{}
	}
	out[node] = append(out[node], Failure{Plugin: plugin, Reasons: reasons})
}

// defaultPod applies what the API server would have stored: the v1 defaults (requests
// from limits among them) and the namespace a namespaced object always has.
func defaultPod(p *v1.Pod) {
	if p.Namespace == "" {
		p.Namespace = v1.NamespaceDefault
	}
	corev1defaults.SetObjectDefaults_Pod(p)
}

func (o *Oracle) fillStores(c *Case) error {
	var ns, pvs, pvcs, scs []any
	for i := range c.Namespaces {
		n := c.Namespaces[i].DeepCopy()
		corev1defaults.SetObjectDefaults_Namespace(n)
		ns = append(ns, n)
	}
	for i := range c.PVs {
		pv := c.PVs[i].DeepCopy()
		corev1defaults.SetObjectDefaults_PersistentVolume(pv)
		pvs = append(pvs, pv)
	}
	for i := range c.PVCs {
		pvc := c.PVCs[i].DeepCopy()
		if pvc.Namespace == "" {
			pvc.Namespace = v1.NamespaceDefault
		}
		corev1defaults.SetObjectDefaults_PersistentVolumeClaim(pvc)
		pvcs = append(pvcs, pvc)
	}
	for i := range c.StorageClasses {
		sc := c.StorageClasses[i].DeepCopy()
		storagev1defaults.SetObjectDefaults_StorageClass(sc)
		scs = append(scs, sc)
	}
	for _, r := range []struct {
		store cache.Indexer
		objs  []any
		what  string
	}{
		{o.stores.namespaces, ns, "namespaces"},
		{o.stores.pvs, pvs, "pvs"},
		{o.stores.pvcs, pvcs, "pvcs"},
		{o.stores.storageClasses, scs, "storageClasses"},
	} {
		if err := r.store.Replace(r.objs, ""); err != nil {
			return fmt.Errorf("%s: %w", r.what, err)
		}
	}
	return nil
}
