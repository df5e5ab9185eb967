package kubelet

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// noCPUs and noMemory stand in for the CPU and memory managers, which a test node does not run
// (their policies are "none" on most GPU nodes too): they report nothing exclusive.
type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

type noDRA struct{}

func (noDRA) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// devices adapts the device manager to the pod-resources API as the kubelet's container
// manager does: one entry per device and NUMA node it reports.
type devices struct{ dm *devicemanager.ManagerImpl }

func (d devices) UpdateAllocatedDevices(logger klog.Logger) { d.dm.UpdateAllocatedDevices(logger) }
func (d devices) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetDevices(podUID, container))
}
func (d devices) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetAllocatableDevices(logger))
}

func toContainerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, byID := range devs {
		for id, dev := range byID {
			nodes := dev.GetTopology().GetNodes()
			if len(nodes) == 0 {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
				continue
			}
			for _, n := range nodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resource, DeviceIds: []string{id},
					Topology: &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: n.GetID()}}},
				})
			}
		}
	}
	return out
}
