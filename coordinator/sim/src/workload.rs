//! Tessera's own workload format: a cluster (nodes by GPU shape or inline), a queue tree, and
//! jobs (gangs, elastic pods, GPU fractions, priorities, arrival times and durations). See
//! `hack/workloads/README.md`.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

use tessera_core::model::{ModelQuota, Node, Pod, PodGroup, Queue, QueueResource};

use tessera_gpushape::{YamlError, load_named, parse_yaml, read};

/// A whole workload file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Name shown in reports.
    #[serde(default)]
    pub name: Option<String>,
    /// The simulated nodes: copies of a bundled or local GPU shape, or nodes written inline.
    pub nodes: Vec<NodeEntry>,
    /// The queue tree (a `default` leaf queue is added when absent).
    #[serde(default)]
    pub queues: Vec<QueueEntry>,
    /// The jobs to replay, in any order (the loader sorts them by arrival).
    pub jobs: Vec<JobEntry>,
}

/// Nodes of one kind: `count` copies of a shape, or one inline node.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Shape file name under the shapes directory (without `.yaml`).
    #[serde(default)]
    pub shape: Option<String>,
    /// Number of such nodes.
    #[serde(default = "one")]
    pub count: u32,
    /// Node name (inline) or name prefix (shape; default the shape name).
    #[serde(default)]
    pub name: Option<String>,
    /// Inline: CPU in milli-cores.
    #[serde(default)]
    pub cpu_milli: Option<u64>,
    /// Inline: memory in MiB.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Inline: number of GPUs.
    #[serde(default)]
    pub gpus: u32,
    /// Inline: GPU model.
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Inline: GPU memory in MiB.
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
}

/// Quota settings of one resource.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceEntry {
    /// Deserved quota (GPUs for `gpu`, milli-cores for `cpu`, MiB for `memory`).
    #[serde(default)]
    pub quota: f64,
    /// Over-quota weight.
    #[serde(default = "one_f")]
    pub weight: f64,
    /// Hard limit; -1 = none.
    #[serde(default = "minus_one")]
    pub limit: f64,
}

/// One queue.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueEntry {
    /// Name.
    pub name: String,
    /// Parent queue.
    #[serde(default)]
    pub parent: Option<String>,
    /// Priority among siblings.
    #[serde(default)]
    pub priority: i32,
    /// GPU settings.
    #[serde(default)]
    pub gpu: Option<ResourceEntry>,
    /// CPU settings.
    #[serde(default)]
    pub cpu: Option<ResourceEntry>,
    /// Memory settings.
    #[serde(default)]
    pub memory: Option<ResourceEntry>,
    /// GPU settings per GPU model (as a Queue's `spec.gpu.models`).
    #[serde(default)]
    pub gpu_models: Vec<ModelEntry>,
}

/// GPU quota settings of one GPU model.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The model key: the shape's model name with characters a label value cannot hold
    /// replaced by `-` (`H100-80GB`).
    pub model: String,
    /// Deserved GPUs of the model.
    #[serde(default)]
    pub quota: f64,
    /// Over-quota weight for the model; absent: the queue's GPU weight.
    #[serde(default)]
    pub weight: Option<f64>,
    /// Hard limit in GPUs of the model; -1 = none.
    #[serde(default = "minus_one")]
    pub limit: f64,
}

/// One job (or `repeat` identical jobs): a gang of pods with a run time.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobEntry {
    /// Name (repeats get `-<k>`).
    pub name: String,
    /// Leaf queue.
    #[serde(default = "default_queue")]
    pub queue: String,
    /// Arrival time in seconds.
    #[serde(default)]
    pub arrival: f64,
    /// Run time in seconds once the gang runs.
    pub duration: f64,
    /// Pods of the job (= the elastic maximum).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Pods that must run together (gang size); default all replicas.
    #[serde(default)]
    pub min_member: Option<u32>,
    /// GPUs per pod.
    #[serde(default)]
    pub gpus: u32,
    /// Share of each GPU, in (0, 1].
    #[serde(default)]
    pub fraction: Option<f64>,
    /// GPU memory per GPU in MiB (instead of `fraction`).
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
    /// CPU per pod in milli-cores.
    #[serde(default = "default_cpu")]
    pub cpu_milli: u64,
    /// Memory per pod in MiB.
    #[serde(default = "default_mem")]
    pub memory_mib: u64,
    /// Priority (below 100 = preemptible).
    #[serde(default)]
    pub priority: i32,
    /// Acceptable GPU models (empty = any).
    #[serde(default)]
    pub models: Vec<String>,
    /// Topology level all pods must share.
    #[serde(default)]
    pub topology_required: Option<String>,
    /// Number of copies of this job.
    #[serde(default = "one")]
    pub repeat: u32,
    /// Seconds between the arrivals of copies.
    #[serde(default)]
    pub every: f64,
}

fn one() -> u32 {
    1
}
fn one_f() -> f64 {
    1.0
}
fn minus_one() -> f64 {
    -1.0
}
fn default_queue() -> String {
    "default".into()
}
fn default_cpu() -> u64 {
    1000
}
fn default_mem() -> u64 {
    1024
}

/// A job instance as the replay driver runs it.
#[derive(Clone, Debug)]
pub struct Job {
    /// Unique name (also the pod-group name).
    pub name: String,
    /// Leaf queue.
    pub queue: String,
    /// Arrival time in seconds.
    pub arrival: u64,
    /// Run time in seconds.
    pub duration: u64,
    /// Gang size.
    pub min_member: u32,
    /// Pods to create, all sharing one pod template.
    pub pods: Vec<Pod>,
    /// Pod group when the job has more than one pod.
    pub group: Option<PodGroup>,
}

/// The loaded workload in scheduler-model terms.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// Report name.
    pub name: String,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Queues.
    pub queues: Vec<Queue>,
    /// Jobs sorted by arrival.
    pub jobs: Vec<Job>,
}

impl Workload {
    /// Parses a workload, resolving shapes under `shapes_dir`.
    pub fn load(path: &Path, shapes_dir: &Path) -> Result<Loaded, YamlError> {
        let file = path.display().to_string();
        let w: Workload = parse_yaml(&file, &read(path)?)?;
        w.resolve(&file, shapes_dir)
    }

    /// Validates and converts to scheduler-model objects.
    pub fn resolve(&self, file: &str, shapes_dir: &Path) -> Result<Loaded, YamlError> {
        let invalid = |field: String, message: String| YamlError::Invalid {
            file: file.to_string(),
            field,
            message,
        };
        let mut nodes = Vec::new();
        for (i, e) in self.nodes.iter().enumerate() {
            match &e.shape {
                Some(shape) => {
                    let Some(s) = load_named(shapes_dir, shape) else {
                        return Err(invalid(
                            format!("nodes[{i}].shape"),
                            format!(
                                "no shape `{shape}` ({} does not exist)",
                                shapes_dir.join(format!("{shape}.yaml")).display()
                            ),
                        ));
                    };
                    let s = s?;
                    let shape_file = format!("{shape}.yaml");
                    let prefix = e.name.clone().unwrap_or_else(|| shape.clone());
                    for k in 0..e.count {
                        nodes.push(super::gpushape::node(
                            &s,
                            &shape_file,
                            &format!("{prefix}-{k}"),
                        )?);
                    }
                }
                None => {
                    let (Some(cpu), Some(mem)) = (e.cpu_milli, e.memory_mib) else {
                        return Err(invalid(
                            format!("nodes[{i}]"),
                            "an inline node needs cpu_milli and memory_mib (or give `shape`)"
                                .into(),
                        ));
                    };
                    let prefix = e.name.clone().unwrap_or_else(|| format!("node{i}"));
                    for k in 0..e.count {
                        let name = if e.count == 1 {
                            prefix.clone()
                        } else {
                            format!("{prefix}-{k}")
                        };
                        let node = if e.gpus == 0 {
                            Node::cpu_node(&name, cpu, mem)
                        } else {
                            let model = e.gpu_model.clone().unwrap_or_else(|| "GPU".into());
                            Node::gpu_node(
                                &name,
                                e.gpus,
                                &model,
                                e.gpu_memory_mib.unwrap_or(81_920),
                            )
                            .with_cpu(cpu, mem)
                        };
                        nodes.push(node);
                    }
                }
            }
        }
        let mut names = HashSet::new();
        for n in &nodes {
            if !names.insert(n.name.clone()) {
                return Err(invalid(
                    "nodes".into(),
                    format!("duplicate node name `{}`", n.name),
                ));
            }
        }
        for (i, q) in self.queues.iter().enumerate() {
            for (k, m) in q.gpu_models.iter().enumerate() {
                if !tessera_contract::gpu_model::is_valid_key(&m.model) {
                    return Err(invalid(
                        format!("queues[{i}] ({}).gpu_models[{k}].model", q.name),
                        format!(
                            "`{}` is not {}",
                            m.model,
                            tessera_contract::gpu_model::KEY_FORM
                        ),
                    ));
                }
            }
        }
        let mut queues: Vec<Queue> = self
            .queues
            .iter()
            .map(|q| {
                let r = |e: Option<ResourceEntry>| {
                    e.map_or(QueueResource::default(), |e| QueueResource {
                        quota: e.quota,
                        over_quota_weight: e.weight,
                        limit: e.limit,
                    })
                };
                Queue {
                    name: q.name.clone(),
                    parent: q.parent.clone(),
                    priority: q.priority,
                    gpu: r(q.gpu),
                    cpu: r(q.cpu),
                    memory: r(q.memory),
                    gpu_models: q
                        .gpu_models
                        .iter()
                        .map(|m| ModelQuota {
                            model: m.model.clone(),
                            quota: m.quota,
                            over_quota_weight: m.weight,
                            limit: m.limit,
                        })
                        .collect(),
                }
            })
            .collect();
        if !queues.iter().any(|q| q.name == "default")
            && self.jobs.iter().any(|j| j.queue == "default")
        {
            queues.push(Queue::new("default"));
        }
        let mut jobs = Vec::new();
        for (i, j) in self.jobs.iter().enumerate() {
            let field = |f: &str| format!("jobs[{i}] ({}).{f}", j.name);
            if !(j.duration.is_finite() && j.duration > 0.0) {
                return Err(invalid(field("duration"), "expected seconds > 0".into()));
            }
            if !(j.arrival.is_finite() && j.arrival >= 0.0) {
                return Err(invalid(field("arrival"), "expected seconds >= 0".into()));
            }
            if j.replicas == 0 {
                return Err(invalid(field("replicas"), "expected at least 1 pod".into()));
            }
            let min = j.min_member.unwrap_or(j.replicas);
            if min == 0 || min > j.replicas {
                return Err(invalid(
                    field("min_member"),
                    format!("{min} (accepted: 1..={} = replicas)", j.replicas),
                ));
            }
            if let Some(f) = j.fraction
                && !(f > 0.0 && f <= 1.0)
            {
                return Err(invalid(
                    field("fraction"),
                    format!("{f} (accepted: a decimal in (0, 1])"),
                ));
            }
            if j.fraction.is_some() && j.gpu_memory_mib.is_some() {
                return Err(invalid(
                    field("fraction"),
                    "both fraction and gpu_memory_mib given (accepted: one of them)".into(),
                ));
            }
            if (j.fraction.is_some() || j.gpu_memory_mib.is_some()) && j.gpus == 0 {
                return Err(invalid(field("gpus"), "a GPU share needs gpus >= 1".into()));
            }
            for k in 0..j.repeat {
                let name = if j.repeat == 1 {
                    j.name.clone()
                } else {
                    format!("{}-{k}", j.name)
                };
                let arrival = (j.arrival + j.every * f64::from(k)).round() as u64;
                let group = (j.replicas > 1).then(|| {
                    let mut g = PodGroup::new(&name, &j.queue, min);
                    g.max_member = Some(j.replicas);
                    g.priority = j.priority;
                    g.topology_required = j.topology_required.clone();
                    g
                });
                let pods = (0..j.replicas)
                    .map(|p| {
                        // The replay recreates what is evicted, as the job's controller would.
                        let mut pod = Pod::new(&format!("{name}-{p}"), &j.queue)
                            .controlled_by(&format!("Job {name}"))
                            .cpu(j.cpu_milli, j.memory_mib)
                            .priority(j.priority)
                            .created(arrival);
                        if j.gpus > 0 {
                            pod = match (j.fraction, j.gpu_memory_mib) {
                                (Some(f), _) => {
                                    let milli = ((f * 1000.0).round() as u32).clamp(1, 1000);
                                    if j.gpus == 1 {
                                        pod.fraction(milli)
                                    } else {
                                        let mut p = pod.gpus(j.gpus);
                                        p.gpu.per_gpu =
                                            tessera_core::model::GpuShare::Fraction(milli);
                                        p
                                    }
                                }
                                (None, Some(mib)) => pod.gpu_memory(j.gpus, mib),
                                (None, None) => pod.gpus(j.gpus),
                            };
                        }
                        if !j.models.is_empty() {
                            pod.gpu_models = j.models.clone();
                        }
                        if group.is_some() {
                            pod = pod.group(&name);
                        }
                        pod
                    })
                    .collect();
                jobs.push(Job {
                    name,
                    queue: j.queue.clone(),
                    arrival,
                    duration: j.duration.round().max(1.0) as u64,
                    min_member: min,
                    pods,
                    group,
                });
            }
        }
        jobs.sort_by_key(|j| j.arrival);
        Ok(Loaded {
            name: self.name.clone().unwrap_or_else(|| file.to_string()),
            nodes,
            queues,
            jobs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpushape::bundled_dir;

    fn load(text: &str) -> Result<Loaded, YamlError> {
        let w: Workload = parse_yaml("w.yaml", text)?;
        w.resolve("w.yaml", &bundled_dir())
    }

    #[test]
    fn parses_shapes_inline_nodes_queues_and_jobs() {
        let l = load(
            "nodes:\n  - {shape: l40s-4x-pcie, count: 2}\n  - {name: cpu, cpu_milli: 8000, memory_mib: 100}\n\
             queues:\n  - {name: a, gpu: {quota: 4}}\n\
             jobs:\n  - {name: j, queue: a, duration: 60, replicas: 3, min_member: 2, gpus: 1, fraction: 0.5, repeat: 2, every: 30}\n",
        )
        .unwrap();
        assert_eq!(l.nodes.len(), 3);
        assert_eq!(l.nodes[1].name, "l40s-4x-pcie-1");
        assert_eq!(l.jobs.len(), 2);
        assert_eq!(l.jobs[1].arrival, 30);
        assert_eq!(l.jobs[0].pods.len(), 3);
        assert_eq!(l.jobs[0].group.as_ref().unwrap().min_member, 2);
        assert_eq!(l.queues[0].gpu.quota, 4.0);
    }

    #[test]
    fn bad_workloads_name_the_field() {
        let e = load("nodes: []\njobs:\n  - {name: j, duration: 60, gpus: 1, fraction: 1.5}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("jobs[0] (j).fraction") && e.contains("(0, 1]"),
            "{e}"
        );
        let e = load("nodes: []\njobs:\n  - {name: j, duration: soon}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("duration"), "{e}");
        let e = load("nodes:\n  - {shape: nope}\njobs: []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodes[0].shape") && e.contains("nope"), "{e}");
        let e = load("nodes: []\njobs:\n  - {name: j, duration: 1, replicas: 2, min_member: 3}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("min_member"), "{e}");
        let e = load("nodes: []\njobz: []\n").unwrap_err().to_string();
        assert!(e.contains("jobz"), "{e}");
    }
}
