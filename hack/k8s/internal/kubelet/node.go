// Package kubelet is kubelet-lite: a Kubernetes node that runs no containers but admits pods
// exactly as the kubelet does, through the kubelet's own device manager, Topology Manager and
// resource-fit admission. Device plugins (a real tessera-agent) register on its kubelet.sock,
// it serves the real pod-resources v1 API, keeps the device manager's checkpoint across
// restarts, and writes each container's device environment where tests can read it.
package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"google.golang.org/grpc"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/utils/ptr"
)

// Annotations a test sets on a pod to script what its containers do.
const (
	// AnnotationRunFor ends the pod's containers after this Go duration (e.g. "30s").
	AnnotationRunFor = "kubelet-lite.tessera.dev/run-for"
	// AnnotationExitCode is the exit code when run-for ends the containers (default 0).
	AnnotationExitCode = "kubelet-lite.tessera.dev/exit-code"
	// AnnotationSigterm is how the containers answer SIGTERM when the pod is deleted: a Go
	// duration to exit after, or "ignore" to run until the grace period ends (default: exit at once).
	AnnotationSigterm = "kubelet-lite.tessera.dev/sigterm"
)

// Options configure one node.
type Options struct {
	Name       string
	Root       string
	NUMANodes  int
	Policy     string
	Scope      string
	Capacity   v1.ResourceList
	Labels     map[string]string
	Taints     []v1.Taint
	LeaseEvery time.Duration
}

// Container is what the node records for each container it "started": the device manager's
// run options, as the container runtime would have received them.
type Container struct {
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	UID         string            `json:"uid"`
	Container   string            `json:"container"`
	Init        bool              `json:"init"`
	Env         map[string]string `json:"env"`
	Devices     []string          `json:"devices"`
	Mounts      []string          `json:"mounts"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdiDevices"`
	// DeviceIDs are the device IDs the device manager allocated, by resource name.
	DeviceIDs map[string][]string `json:"deviceIds"`
}

type podState struct {
	pod         *v1.Pod
	terminal    bool
	terminating bool
	// running: its Running status is written. Admission and device allocation happen once;
	// the status write is retried on its own (right after a bind the Node authorizer may not
	// yet let this node read the pod).
	running    bool
	containers []string
}

// Node is one running kubelet-lite.
type Node struct {
	o      Options
	client kubernetes.Interface
	logger klog.Logger
	dm     *devicemanager.ManagerImpl
	tm     topologymanager.Manager
	fit    lifecycle.PodAdmitHandler
	queue  workqueue.TypedRateLimitingInterface[types.NamespacedName]
	lister cache.Indexer

	mu   sync.Mutex
	pods map[types.UID]*podState
	node *v1.Node
}

func (o *Options) deviceDir() string    { return filepath.Join(o.Root, "device-plugins") }
func (o *Options) resourcesDir() string { return filepath.Join(o.Root, "pod-resources") }
func (o *Options) containersDir() string {
	return filepath.Join(o.Root, "containers")
}

// Run starts the node and blocks until ctx is done. Stopping and running it again with the same
// Root is a kubelet restart: sockets are removed and served anew, the checkpoint is kept.
func Run(ctx context.Context, client kubernetes.Interface, o Options) error {
	logger := klog.FromContext(ctx).WithValues("node", o.Name)
	for _, d := range []string{o.deviceDir(), o.resourcesDir(), o.containersDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var topology []cadvisorapi.Node
	for i := 0; i < max(o.NUMANodes, 1); i++ {
		topology = append(topology, cadvisorapi.Node{Id: i})
	}
	tm, err := topologymanager.NewManager(logger, topology, o.Policy, o.Scope, nil)
	if err != nil {
		return fmt.Errorf("topology manager (policy %q, scope %q): %w", o.Policy, o.Scope, err)
	}
	dm, err := newDeviceManager(logger, filepath.Join(o.deviceDir(), "kubelet.sock"), topology, tm)
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}
	tm.AddHintProvider(logger, dm)
	n := &Node{
		o: o, client: client, logger: logger, dm: dm, tm: tm,
		pods:  map[types.UID]*podState{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]()),
	}
	n.fit = lifecycle.NewPredicateAdmitHandler(n.getNode, lifecycle.NewAdmissionFailureHandlerStub(), dm.UpdatePluginResources)

	// What survives a kubelet restart: the containers the runtime still runs. Their pods keep
	// their devices (checkpoint) and are not allocated again.
	existing, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + o.Name})
	if err != nil {
		return fmt.Errorf("listing this node's pods: %w", err)
	}
	cmap := containermap.NewContainerMap()
	running := sets.New[string]()
	for i := range existing.Items {
		p := &existing.Items[i]
		if p.Status.Phase != v1.PodRunning {
			continue
		}
		st := &podState{pod: p}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.ContainerID != "" {
				cmap.Add(string(p.UID), cs.Name, cs.ContainerID)
				running.Insert(cs.ContainerID)
				st.containers = append(st.containers, cs.ContainerID)
			}
		}
		n.pods[p.UID] = st
	}
	if err := dm.Start(logger, n.activePods, readySources{}, cmap, running); err != nil {
		return fmt.Errorf("starting the device manager: %w", err)
	}
	defer func() { _ = dm.Stop(logger) }()

	if err := n.register(ctx); err != nil {
		return err
	}
	stopResources, err := n.servePodResources(ctx)
	if err != nil {
		return err
	}
	defer stopResources()

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.Name).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	n.lister = inf.GetIndexer()
	enqueue := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok {
			n.queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		} else if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			if p, ok := t.Obj.(*v1.Pod); ok {
				n.forget(p)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if p, ok := obj.(*v1.Pod); ok {
				n.forget(p)
			} else {
				enqueue(obj)
			}
		},
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	go n.leaseLoop(ctx)
	go n.statusLoop(ctx)
	go func() {
		<-ctx.Done()
		n.queue.ShutDown()
	}()
	fmt.Printf("kube-peer: node %s ready; device plugins in %s, pod-resources at %s\n",
		o.Name, o.deviceDir(), filepath.Join(o.resourcesDir(), "kubelet.sock"))
	// One worker: the kubelet admits pods one at a time, and a device plugin that is slow to
	// answer Allocate holds up every pod behind it, as it does on a real node.
	for n.processNext(ctx) {
	}
	return nil
}

type readySources struct{}

func (readySources) AddSource(string) {}
func (readySources) AllReady() bool   { return true }

func (n *Node) activePods() []*v1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*v1.Pod
	for _, st := range n.pods {
		if !st.terminal {
			out = append(out, st.pod)
		}
	}
	return out
}

func (n *Node) forget(p *v1.Pod) {
	n.mu.Lock()
	st := n.pods[p.UID]
	delete(n.pods, p.UID)
	n.mu.Unlock()
	if st != nil {
		for _, id := range st.containers {
			_ = n.tm.RemoveContainer(n.logger, id)
		}
	}
}

func (n *Node) processNext(ctx context.Context) bool {
	key, quit := n.queue.Get()
	if quit {
		return false
	}
	defer n.queue.Done(key)
	if err := n.sync(ctx, key); err != nil {
		n.logger.Info("pod sync failed; retrying", "pod", key, "err", err)
		n.queue.AddRateLimited(key)
		return true
	}
	n.queue.Forget(key)
	return true
}

func (n *Node) sync(ctx context.Context, key types.NamespacedName) error {
	obj, exists, err := n.lister.GetByKey(key.Namespace + "/" + key.Name)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*v1.Pod).DeepCopy()
	n.mu.Lock()
	st := n.pods[pod.UID]
	if st != nil {
		st.pod = pod
	}
	n.mu.Unlock()

	terminal := pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
	switch {
	case terminal:
		if st != nil {
			n.mu.Lock()
			st.terminal = true
			n.mu.Unlock()
		}
		if pod.DeletionTimestamp != nil {
			return n.deleteFinal(ctx, pod)
		}
		return nil
	case pod.DeletionTimestamp != nil:
		if st == nil {
			// Never started here: nothing to stop.
			return n.finish(ctx, pod, 0, "Completed")
		}
		n.mu.Lock()
		already := st.terminating
		st.terminating = true
		n.mu.Unlock()
		if !already {
			n.scheduleTermination(ctx, pod)
		}
		return nil
	case st != nil:
		n.mu.Lock()
		pending := !st.running && !st.terminal
		n.mu.Unlock()
		if pending {
			return n.start(ctx, pod, st)
		}
		return nil
	}
	return n.admit(ctx, pod)
}

// admit runs the kubelet's admission chain in the kubelet's order: resource allocation through
// the Topology Manager (which calls the device manager for init containers first, then app
// containers), then the resource-fit predicate.
func (n *Node) admit(ctx context.Context, pod *v1.Pod) error {
	attrs := &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: n.activePods(), Operation: lifecycle.AddOperation}
	st := &podState{pod: pod}
	n.mu.Lock()
	n.pods[pod.UID] = st
	n.mu.Unlock()
	for _, h := range []lifecycle.PodAdmitHandler{n.tm, n.fit} {
		if r := h.Admit(ctx, attrs); !r.Admit {
			n.mu.Lock()
			st.terminal = true
			n.mu.Unlock()
			return n.reject(ctx, pod, r.Reason, r.Message)
		}
	}
	var records []Container
	all := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		c := &all[i]
		opts, err := n.dm.GetDeviceRunContainerOptions(ctx, pod, c)
		if err != nil {
			n.mu.Lock()
			st.terminal = true
			n.mu.Unlock()
			return n.reject(ctx, pod, "UnexpectedAdmissionError", fmt.Sprintf("container %s: %v", c.Name, err))
		}
		id := containerID(pod, c.Name)
		n.tm.AddContainer(n.logger, pod, c, id)
		st.containers = append(st.containers, id)
		r := record(pod, c.Name, i < len(pod.Spec.InitContainers), opts)
		for resource, byID := range n.dm.GetDevices(string(pod.UID), c.Name) {
			for id := range byID {
				r.DeviceIDs[resource] = append(r.DeviceIDs[resource], id)
			}
			sort.Strings(r.DeviceIDs[resource])
		}
		records = append(records, r)
	}
	for _, r := range records {
		data, _ := json.MarshalIndent(r, "", "  ")
		path := filepath.Join(n.o.containersDir(), fmt.Sprintf("%s_%s_%s.json", r.Namespace, r.Pod, r.Container))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	return n.start(ctx, pod, st)
}

// start writes the admitted pod's Running status (once it succeeds, retried by the queue
// until then) and arms its run-for timer.
func (n *Node) start(ctx context.Context, pod *v1.Pod, st *podState) error {
	if err := n.markRunning(ctx, pod); err != nil {
		return err
	}
	n.mu.Lock()
	st.running = true
	n.mu.Unlock()
	if d, ok := pod.Annotations[AnnotationRunFor]; ok {
		dur, err := time.ParseDuration(d)
		if err != nil {
			n.logger.Info("ignoring a bad annotation", "annotation", AnnotationRunFor, "value", d, "accepted", "a Go duration such as 30s")
		} else {
			code, _ := strconv.Atoi(pod.Annotations[AnnotationExitCode])
			go func() {
				select {
				case <-ctx.Done():
				case <-time.After(dur):
					if err := n.finish(ctx, pod, int32(code), "Completed"); err != nil {
						n.logger.Info("ending pod failed", "pod", klog.KObj(pod), "err", err)
					}
				}
			}()
		}
	}
	return nil
}

func containerID(pod *v1.Pod, name string) string {
	return fmt.Sprintf("kubelet-lite://%s/%s", pod.UID, name)
}

func record(pod *v1.Pod, name string, init bool, o *devicemanager.DeviceRunContainerOptions) Container {
	c := Container{Namespace: pod.Namespace, Pod: pod.Name, UID: string(pod.UID), Container: name, Init: init,
		Env: map[string]string{}, Annotations: map[string]string{}, DeviceIDs: map[string][]string{}}
	if o == nil {
		return c
	}
	for _, e := range o.Envs {
		c.Env[e.Name] = e.Value
	}
	for _, d := range o.Devices {
		c.Devices = append(c.Devices, d.PathOnHost+":"+d.PathInContainer+":"+d.Permissions)
	}
	for _, m := range o.Mounts {
		c.Mounts = append(c.Mounts, m.HostPath+":"+m.ContainerPath)
	}
	for _, a := range o.Annotations {
		c.Annotations[a.Name] = a.Value
	}
	for _, d := range o.CDIDevices {
		c.CDIDevices = append(c.CDIDevices, d.Name)
	}
	sort.Strings(c.Devices)
	return c
}

func (n *Node) updateStatus(ctx context.Context, pod *v1.Pod, mutate func(*v1.Pod)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := n.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return nil
		}
		mutate(cur)
		_, err = n.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

func setCondition(p *v1.Pod, t v1.PodConditionType, s v1.ConditionStatus, reason string) {
	now := metav1.Now()
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			if p.Status.Conditions[i].Status != s {
				p.Status.Conditions[i].LastTransitionTime = now
			}
			p.Status.Conditions[i].Status = s
			p.Status.Conditions[i].Reason = reason
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: now})
}

func (n *Node) reject(ctx context.Context, pod *v1.Pod, reason, message string) error {
	n.logger.Info("pod admission refused", "pod", klog.KObj(pod), "reason", reason, "message", message)
	return n.updateStatus(ctx, pod, func(p *v1.Pod) {
		p.Status.Phase = v1.PodFailed
		p.Status.Reason = reason
		p.Status.Message = message
	})
}

func (n *Node) markRunning(ctx context.Context, pod *v1.Pod) error {
	return n.updateStatus(ctx, pod, func(p *v1.Pod) {
		now := metav1.Now()
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		p.Status.Phase = v1.PodRunning
		p.Status.HostIP = "127.0.0.1"
		p.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
		p.Status.PodIP = "127.0.0.1"
		p.Status.PodIPs = []v1.PodIP{{IP: "127.0.0.1"}}
		for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
			setCondition(p, t, v1.ConditionTrue, "")
		}
		p.Status.InitContainerStatuses = nil
		for _, c := range p.Spec.InitContainers {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, v1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(p, c.Name), Ready: true,
				State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
			})
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: containerID(p, c.Name), Ready: true, Started: ptr.To(true),
				State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
			})
		}
	})
}

// finish ends the pod's containers with exit code code; a deleted pod is then removed.
func (n *Node) finish(ctx context.Context, pod *v1.Pod, code int32, reason string) error {
	n.mu.Lock()
	if st := n.pods[pod.UID]; st != nil {
		st.terminal = true
	}
	n.mu.Unlock()
	err := n.updateStatus(ctx, pod, func(p *v1.Pod) {
		now := metav1.Now()
		if code == 0 {
			p.Status.Phase = v1.PodSucceeded
		} else {
			p.Status.Phase = v1.PodFailed
		}
		for _, t := range []v1.PodConditionType{v1.ContainersReady, v1.PodReady} {
			setCondition(p, t, v1.ConditionFalse, "PodCompleted")
		}
		for i := range p.Status.ContainerStatuses {
			cs := &p.Status.ContainerStatuses[i]
			started := now
			if cs.State.Running != nil {
				started = cs.State.Running.StartedAt
			}
			cs.Ready = false
			cs.Started = ptr.To(false)
			cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code, Reason: reason, StartedAt: started, FinishedAt: now, ContainerID: cs.ContainerID}}
		}
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if pod.DeletionTimestamp != nil {
		return n.deleteFinal(ctx, pod)
	}
	return nil
}

// scheduleTermination models SIGTERM: the containers exit after their scripted delay, or are
// killed (exit 137) when the grace period ends first.
func (n *Node) scheduleTermination(ctx context.Context, pod *v1.Pod) {
	grace := time.Duration(ptr.Deref(pod.DeletionGracePeriodSeconds, 30)) * time.Second
	delay, code, reason := time.Duration(0), int32(0), "Completed"
	switch v := pod.Annotations[AnnotationSigterm]; v {
	case "":
	case "ignore":
		delay, code, reason = grace, 137, "Error"
	default:
		if d, err := time.ParseDuration(v); err == nil {
			delay = d
		}
		if delay >= grace {
			delay, code, reason = grace, 137, "Error"
		}
	}
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		if err := n.finish(ctx, pod, code, reason); err != nil {
			n.logger.Info("terminating pod failed", "pod", klog.KObj(pod), "err", err)
		}
	}()
}

// deleteFinal removes a terminated pod from the API the way the kubelet's status manager does:
// grace period 0, guarded by the pod's UID.
func (n *Node) deleteFinal(ctx context.Context, pod *v1.Pod) error {
	err := n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func (n *Node) getNode(ctx context.Context, _ bool) (*v1.Node, error) {
	n.mu.Lock()
	cached := n.node
	n.mu.Unlock()
	if cached != nil {
		return cached.DeepCopy(), nil
	}
	return n.client.CoreV1().Nodes().Get(ctx, n.o.Name, metav1.GetOptions{})
}

func (n *Node) register(ctx context.Context) error {
	labels := map[string]string{
		"kubernetes.io/hostname": n.o.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	for k, v := range n.o.Labels {
		labels[k] = v
	}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.o.Name, Labels: labels},
		Spec:       v1.NodeSpec{Taints: n.o.Taints},
	}
	_, err := n.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering node %s: %w", n.o.Name, err)
	}
	return n.syncStatus(ctx, true)
}

func (n *Node) capacity() (v1.ResourceList, v1.ResourceList, []string) {
	capacity, allocatable := n.o.Capacity.DeepCopy(), n.o.Capacity.DeepCopy()
	dc, da, removed := n.dm.GetCapacity(n.logger)
	for k, v := range dc {
		capacity[k] = v
	}
	for k, v := range da {
		allocatable[k] = v
	}
	return capacity, allocatable, removed
}

func (n *Node) syncStatus(ctx context.Context, force bool) error {
	capacity, allocatable, removed := n.capacity()
	n.mu.Lock()
	prev := n.node
	n.mu.Unlock()
	if !force && prev != nil && equalResources(prev.Status.Capacity, capacity) && equalResources(prev.Status.Allocatable, allocatable) && len(removed) == 0 {
		return nil
	}
	var out *v1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := n.client.CoreV1().Nodes().Get(ctx, n.o.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		cur.Status.Capacity = capacity
		cur.Status.Allocatable = allocatable
		for _, r := range removed {
			delete(cur.Status.Capacity, v1.ResourceName(r))
			delete(cur.Status.Allocatable, v1.ResourceName(r))
		}
		cur.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: n.o.Name}}
		cur.Status.NodeInfo = v1.NodeSystemInfo{
			KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64",
			ContainerRuntimeVersion: "kubelet-lite://1", KernelVersion: "kubelet-lite", OSImage: "kubelet-lite",
		}
		cur.Status.DaemonEndpoints = v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: 10250}}
		conds := []v1.NodeCondition{
			{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet-lite is posting ready status"},
			{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
			{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure"},
			{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID"},
		}
		for i := range conds {
			conds[i].LastHeartbeatTime = now
			conds[i].LastTransitionTime = now
			for _, old := range cur.Status.Conditions {
				if old.Type == conds[i].Type && old.Status == conds[i].Status {
					conds[i].LastTransitionTime = old.LastTransitionTime
				}
			}
		}
		cur.Status.Conditions = conds
		out, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating node %s status: %w", n.o.Name, err)
	}
	n.mu.Lock()
	n.node = out
	n.mu.Unlock()
	return nil
}

func equalResources(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

func (n *Node) statusLoop(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		force := time.Since(last) > time.Minute
		if err := n.syncStatus(ctx, force); err != nil {
			n.logger.Info("node status update failed", "err", err)
		} else if force {
			last = time.Now()
		}
	}
}

func (n *Node) leaseLoop(ctx context.Context) {
	every := n.o.LeaseEvery
	if every <= 0 {
		every = 10 * time.Second
	}
	for {
		if err := n.renewLease(ctx); err != nil && ctx.Err() == nil {
			n.logger.Info("node lease renewal failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (n *Node) renewLease(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, n.o.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		n.mu.Lock()
		node := n.node
		n.mu.Unlock()
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.o.Name, Namespace: v1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(n.o.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now,
			},
		}
		if node != nil {
			lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// podsProvider answers the pod-resources API's questions about this node's pods.
type podsProvider struct{ n *Node }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.n.activePods() }
func (p podsProvider) GetPods() []*v1.Pod {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	var out []*v1.Pod
	for _, st := range p.n.pods {
		out = append(out, st.pod)
	}
	return out
}
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.GetPods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

func (n *Node) servePodResources(ctx context.Context) (func(), error) {
	path := filepath.Join(n.o.resourcesDir(), "kubelet.sock")
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %s: %w", path, err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(ctx, podresources.PodResourcesProviders{
		Pods: podsProvider{n}, Devices: devices{n.dm}, Cpus: noCPUs{}, Memory: noMemory{}, DynamicResources: noDRA{},
	}))
	go func() { _ = srv.Serve(l) }()
	return func() {
		srv.Stop()
		_ = os.Remove(path)
	}, nil
}

// ParseCapacity reads "cpu=64,memory=512Gi,pods=110" into a resource list.
func ParseCapacity(s map[string]string) (v1.ResourceList, error) {
	out := v1.ResourceList{}
	for k, v := range s {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("--capacity %s=%s: %v (accepted: a Kubernetes quantity such as 64, 512Gi, 500m)", k, v, err)
		}
		out[v1.ResourceName(k)] = q
	}
	return out, nil
}
