//! The user contract's label and annotation names (SPEC.md), the migration aliases accepted
//! on input and never written, and the names the coordinator and agents write to each other.

/// Label: leaf queue name.
pub const QUEUE: &str = "tessera.dev/queue";
/// Alias of [`QUEUE`].
pub const QUEUE_ALIAS: &str = "kai.scheduler/queue";
/// Queue of pods without a queue label.
pub const DEFAULT_QUEUE: &str = "default";
/// Annotation: share of each GPU, a decimal in (0, 1].
pub const GPU_FRACTION: &str = "tessera.dev/gpu-fraction";
/// Alias of [`GPU_FRACTION`].
pub const GPU_FRACTION_ALIAS: &str = "gpu-fraction";
/// Annotation: memory on each GPU (`10Gi`, `4096Mi`, or plain MiB).
pub const GPU_MEMORY: &str = "tessera.dev/gpu-memory";
/// Alias of [`GPU_MEMORY`].
pub const GPU_MEMORY_ALIAS: &str = "gpu-memory";
/// Alias annotation: number of GPUs a fractional pod shares (when it has no `nvidia.com/gpu`).
pub const GPU_FRACTION_NUM_DEVICES_ALIAS: &str = "gpu-fraction-num-devices";
/// Annotation: how limits are enforced (`watchdog`, `mps`, `mig`, `none`); read by both
/// the coordinator (MIG placement) and the agent (enforcement).
pub const ISOLATION: &str = "tessera.dev/isolation";
/// Annotation: PodGroup name.
pub const POD_GROUP: &str = "tessera.dev/pod-group";
/// Alias of [`POD_GROUP`].
pub const POD_GROUP_ALIAS: &str = "pod-group-name";
/// Annotation: gang size when no PodGroup object exists.
pub const MIN_MEMBER: &str = "tessera.dev/min-member";
/// Annotation: topology level all pods of the group must share.
pub const TOPOLOGY_REQUIRED: &str = "tessera.dev/topology-required";
/// Annotation: topology level all pods of the group should share.
pub const TOPOLOGY_PREFERRED: &str = "tessera.dev/topology-preferred";
/// Label: `true` / `false`; default from priority (below [`PREEMPTIBLE_BELOW_PRIORITY`]).
pub const PREEMPTIBLE: &str = "tessera.dev/preemptible";
/// Pods at or above this priority are not preemptible unless labelled so.
pub const PREEMPTIBLE_BELOW_PRIORITY: i32 = 100;
/// Annotation the coordinator writes with the Binding: the exact GPU assignment
/// ([`crate::Assignment`] as JSON); the agent reads it to answer the kubelet's Allocate.
pub const ASSIGNMENT: &str = "tessera.dev/assignment";
/// Annotation the coordinator writes beside [`ASSIGNMENT`]: when it was decided (RFC 3339),
/// for the same-count hold's timeout.
pub const ASSIGNED_AT: &str = "tessera.dev/assigned-at";
/// Annotation a revision-1 agent writes once the kubelet allocated the pod's GPUs
/// (revision-2 agents say so on their stream, `Occupancy.allocated_pod_uids`).
pub const ALLOCATED: &str = "tessera.dev/allocated";
/// Prefix of every Tessera label and annotation.
pub const PREFIX: &str = "tessera.dev/";
/// The GPU extended resource the agent serves as a device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Prefix of the per-profile MIG resources the agent serves (`nvidia.com/mig-1g.10gb`), named
/// as NVIDIA's device plugin names them.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// Label the JobSet controller puts on every pod of a JobSet (its top owner).
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// The scheduler name of pods that name none.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Node label: the node's physical GPUs (NVIDIA GPU feature discovery's name and integer
/// value; MIG-mode GPUs count once each). A node's `nvidia.com/gpu` capacity is share slots,
/// this many times [`NODE_GPU_SHARES_PER_GPU`].
pub const NODE_GPU_COUNT: &str = "nvidia.com/gpu.count";
/// Node label: the GPU model as GPU feature discovery writes it (the driver's product name,
/// spaces as `-`, e.g. `NVIDIA-A100-SXM4-80GB`).
pub const NODE_GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Node label: memory of one GPU in MiB (GPU feature discovery's name and unit).
pub const NODE_GPU_MEMORY: &str = "nvidia.com/gpu.memory";
/// Node label: the node's physical GPUs, as [`NODE_GPU_COUNT`], under Tessera's own name
/// (written even where feature discovery owns the NVIDIA one).
pub const NODE_TESSERA_GPU_COUNT: &str = "tessera.dev/gpu-count";
/// Node label: `nvidia.com/gpu` slots the agent advertises per healthy GPU.
pub const NODE_GPU_SHARES_PER_GPU: &str = "tessera.dev/gpu-shares-per-gpu";
/// The node labels the coordinator writes from its agents' inventory, and the only thing it
/// may change on a Node: the chart's admission policy refuses it any other change (it reads
/// this list; deploy-check generates the policy's CEL list from it).
pub const NODE_GPU_LABELS: [&str; 5] = [
    NODE_GPU_COUNT,
    NODE_GPU_PRODUCT,
    NODE_GPU_MEMORY,
    NODE_TESSERA_GPU_COUNT,
    NODE_GPU_SHARES_PER_GPU,
];

/// Annotations only Tessera writes ([`ASSIGNMENT`] and [`ASSIGNED_AT`] in the coordinator's
/// Binding, [`ALLOCATED`] by a revision-1 agent). The chart's admission policy refuses any
/// other writer a pod (or Binding) that carries, adds, changes or removes one; it reads this
/// list (deploy-check generates the policy's CEL list from it).
pub const WRITTEN_BY_TESSERA: [&str; 3] = [ASSIGNMENT, ASSIGNED_AT, ALLOCATED];
/// Annotations a user sets that decide a pod's GPU share and enforcement: free until the pod
/// is bound, fixed after (the agent enforces, and the coordinator accounts for, what was
/// decided at binding). The chart's admission policy refuses other writers a change to one
/// on a bound pod.
pub const FIXED_ONCE_BOUND_ANNOTATIONS: [&str; 6] = [
    ISOLATION,
    GPU_FRACTION,
    GPU_FRACTION_ALIAS,
    GPU_MEMORY,
    GPU_MEMORY_ALIAS,
    GPU_FRACTION_NUM_DEVICES_ALIAS,
];
/// Labels that decide which queue a pod is charged to: fixed once the pod is bound, as
/// [`FIXED_ONCE_BOUND_ANNOTATIONS`].
pub const FIXED_ONCE_BOUND_LABELS: [&str; 2] = [QUEUE, QUEUE_ALIAS];
