//! GPU placement: per-GPU fit and fragmentation-aware scoring, NVLink sets, topology domains and
//! the capacity index that lets a pod visit only nodes that can fit it.
//!
//! [`place_on_node`] is the per-pod, per-node placement function the scheduling cycle and the
//! offline simulator share: given a node's free capacity and a pod's demand it returns the chosen
//! GPUs with their memory/compute slices and a score (higher is better), or why the pod does not fit.

mod choice_cache;
pub mod frag;
mod gpu_fit;
mod index;
mod mix;
mod nvlink;
mod topology;

pub use choice_cache::ChoiceCache;
pub use gpu_fit::{
    GPU_MILLI, GPU_MILLI_U64, GpuChoice, GpuFree, Misfit, NodeCapacity, NodeScore, PodDemand,
    ScoreWeights, check_fit, demand_on_gpu, place_on_node,
};
pub use index::CapacityIndex;
pub use mix::{ModelIds, shape_mix_of, task_shape};
pub use topology::Domains;
