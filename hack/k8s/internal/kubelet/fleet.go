package kubelet

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// FleetOptions describe many device-less nodes served by one process, for scale tests where
// the device path is not what is measured: each node registers with static capacity (GPUs as
// a plain extended resource), renews its Lease, and every pod bound to one of them is marked
// Running at once and removed when deleted, as a kubelet would.
type FleetOptions struct {
	Prefix     string
	Count      int
	Capacity   v1.ResourceList
	Labels     map[string]string
	LeaseEvery time.Duration
	Workers    int
}

// RunFleet registers the nodes and serves their pods until ctx is done.
func RunFleet(ctx context.Context, client kubernetes.Interface, o FleetOptions) error {
	logger := klog.FromContext(ctx)
	names := make([]string, o.Count)
	for i := range names {
		names[i] = fmt.Sprintf("%s%05d", o.Prefix, i)
	}
	ours := map[string]bool{}
	for _, n := range names {
		ours[n] = true
	}
	// Registration in parallel, bounded: the API server's inflight limit is the real bound.
	sem := make(chan struct{}, max(o.Workers, 1))
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	for _, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func(name string) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := registerPlain(ctx, client, name, o); err != nil {
				errs <- err
			}
		}(name)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("kube-peer: %d nodes %s00000..%s%05d ready\n", o.Count, o.Prefix, o.Prefix, o.Count-1)

	go fleetLeases(ctx, client, names, o.LeaseEvery)

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	queue := workqueue.NewTyped[string]()
	enqueue := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok && ours[p.Spec.NodeName] {
			queue.Add(p.Namespace + "/" + p.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	go func() { <-ctx.Done(); queue.ShutDown() }()
	var workers sync.WaitGroup
	for i := 0; i < max(o.Workers, 1); i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				key, quit := queue.Get()
				if quit {
					return
				}
				obj, exists, err := inf.GetIndexer().GetByKey(key)
				if err == nil && exists {
					if err := syncPlain(ctx, client, obj.(*v1.Pod)); err != nil && ctx.Err() == nil {
						logger.V(2).Info("pod sync failed", "pod", key, "err", err)
					}
				}
				queue.Done(key)
			}
		}()
	}
	workers.Wait()
	return nil
}

func registerPlain(ctx context.Context, client kubernetes.Interface, name string, o FleetOptions) error {
	labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
	for k, v := range o.Labels {
		labels[k] = v
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("registering node %s: %w", name, err)
	}
	now := metav1.Now()
	created.Status.Capacity = o.Capacity.DeepCopy()
	created.Status.Allocatable = o.Capacity.DeepCopy()
	created.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: name}}
	created.Status.NodeInfo = v1.NodeSystemInfo{KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64", ContainerRuntimeVersion: "kubelet-lite://1"}
	_, err = client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// fleetLeases renews every node's Lease once per period, spread over the period so the API
// server sees a steady trickle rather than a burst.
func fleetLeases(ctx context.Context, client kubernetes.Interface, names []string, every time.Duration) {
	if every <= 0 {
		every = 10 * time.Second
	}
	leases := client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	gap := every / time.Duration(max(len(names), 1))
	for {
		for _, name := range names {
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			now := metav1.NewMicroTime(time.Now())
			l, err := leases.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				_, _ = leases.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1.NamespaceNodeLease},
					Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
				}, metav1.CreateOptions{})
				continue
			}
			if err == nil {
				l.Spec.RenewTime = &now
				_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
		}
	}
}

func syncPlain(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) error {
	switch {
	case pod.DeletionTimestamp != nil:
		err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	case pod.Status.Phase != v1.PodPending && pod.Status.Phase != "":
		return nil
	}
	cur := pod.DeepCopy()
	now := metav1.Now()
	cur.Status.Phase = v1.PodRunning
	cur.Status.StartTime = &now
	cur.Status.HostIP = "127.0.0.1"
	for _, t := range []v1.PodConditionType{v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(cur, t, v1.ConditionTrue, "")
	}
	_, err := client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
