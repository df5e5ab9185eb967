//! The user contract's label and annotation names (SPEC.md), with the migration aliases that
//! are accepted on input and never written.

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
/// Annotation: how limits are enforced (`watchdog`, `mps`, `mig`, `none`).
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
/// Label: `true` / `false`; default from priority (below 100 = preemptible).
pub const PREEMPTIBLE: &str = "tessera.dev/preemptible";
/// Annotation written by the binder: the exact GPU assignment (JSON).
pub const ASSIGNMENT: &str = "tessera.dev/assignment";
/// Extended resource of GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Pods at or above this priority are not preemptible unless labelled so.
pub const PREEMPTIBLE_BELOW_PRIORITY: i32 = 100;
/// Label the JobSet controller puts on every pod of a JobSet (its top owner).
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// The scheduler name of pods that name none.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
