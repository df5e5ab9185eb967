package kubelet

import (
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newDeviceManager is the kubelet's own constructor with the socket path as a parameter.
// The exported NewManagerImpl hard-codes /var/lib/kubelet/device-plugins/kubelet.sock; a test
// node needs its own directory (several nodes on one machine, no root), and copying the
// manager would defeat the point of testing against the real one, so the unexported
// constructor is linked by name. It is pinned to the Kubernetes release in go.mod: a release
// that changes its signature fails to link, loudly, rather than misbehaving.
//
//go:linkname newDeviceManager k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newDeviceManager(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, store topologymanager.Store) (*devicemanager.ManagerImpl, error)
