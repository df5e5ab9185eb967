//! `tessera-agent probe`: what the agent's GPU backend sees on this machine, read-only and
//! without starting the agent.
//!
//! It answers the first troubleshooting question ("does the agent see my GPUs, their links,
//! their processes, their MIG layout?") and doubles as the check run on a real GPU machine:
//! every backend call the agent makes to discover and watch GPUs is made once, and every
//! failure is reported with the call that failed, without stopping the others. Nothing is
//! ever changed: no MIG instance is created or destroyed, no setting is touched.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::gpu::{GpuBackend, GpuDevice, GpuError, GpuSample, MigInstance, MigProfile, XidEvent};
use crate::topology::Topology;

/// What to probe beyond the always-read inventory.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProbeOptions {
    /// How long to listen for XID events; zero skips listening.
    pub listen_for_events: Duration,
}

/// One GPU's readings.
#[derive(Debug, Clone, Serialize)]
pub struct ProbedGpu {
    /// What discovery found: index, UUID, model, memory, PCI, NUMA node, links and MIG mode.
    pub device: GpuDevice,
    /// A live sample, when it could be read.
    pub sample: Option<GpuSample>,
    /// GPU-instance profiles, for a GPU in MIG mode.
    pub mig_profiles: Option<Vec<MigProfile>>,
    /// MIG devices that exist now, for a GPU in MIG mode.
    pub mig_instances: Option<Vec<MigInstance>>,
}

/// Everything one probe found.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// `nvml` or `sim`.
    pub backend: String,
    /// Per GPU, in index order.
    pub gpus: Vec<ProbedGpu>,
    /// The link matrix as `tessera-agent topology` prints it, when it could be built.
    pub topology: Option<String>,
    /// XID events seen while listening.
    pub events: Vec<XidEvent>,
    /// How long it listened for events.
    pub listened_ms: u64,
    /// Every failed call: `what: error`.
    pub failures: Vec<String>,
}

impl ProbeReport {
    /// True when every call succeeded.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Reads everything the agent reads from `backend`, once; never changes anything.
pub fn probe(backend: &dyn GpuBackend, options: ProbeOptions) -> ProbeReport {
    let mut failures = Vec::new();
    let devices = noted(&mut failures, "listing GPUs", backend.devices()).unwrap_or_default();
    let topology = noted(
        &mut failures,
        "link matrix",
        Topology::discover(backend, &devices),
    )
    .map(|t| t.render());
    let mut gpus = Vec::with_capacity(devices.len());
    for device in devices {
        let uuid = device.uuid.as_str();
        let on = |what: &str| format!("GPU {} ({uuid}): {what}", device.index);
        let sample = noted(&mut failures, &on("sample"), backend.sample(uuid));
        let (mig_profiles, mig_instances) = if device.mig.is_some() {
            (
                noted(
                    &mut failures,
                    &on("MIG profiles"),
                    backend.mig_profiles(uuid),
                ),
                noted(
                    &mut failures,
                    &on("MIG instances"),
                    backend.mig_instances(uuid),
                ),
            )
        } else {
            (None, None)
        };
        gpus.push(ProbedGpu {
            device,
            sample,
            mig_profiles,
            mig_instances,
        });
    }
    let started = Instant::now();
    let mut events = Vec::new();
    while let Some(left) = options.listen_for_events.checked_sub(started.elapsed()) {
        if left.is_zero() {
            break;
        }
        match backend.wait_event(left) {
            Ok(Some(event)) => events.push(event),
            Ok(None) => {}
            Err(e) => {
                failures.push(format!("waiting for XID events: {e}"));
                break;
            }
        }
    }
    ProbeReport {
        backend: backend.kind().to_owned(),
        gpus,
        topology,
        events,
        listened_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        failures,
    }
}

/// The value of a successful call; a failed one is noted as `what: error`.
fn noted<T>(failures: &mut Vec<String>, what: &str, result: Result<T, GpuError>) -> Option<T> {
    result
        .map_err(|e| failures.push(format!("{what}: {e}")))
        .ok()
}

/// A reading, or `unknown`.
fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

/// The report as text for a terminal.
pub fn render(report: &ProbeReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "backend: {}, {} GPU(s)",
        report.backend,
        report.gpus.len()
    );
    for g in &report.gpus {
        let d = &g.device;
        let numa = d.numa_node.map_or("-".to_owned(), |n| n.to_string());
        let _ = writeln!(
            s,
            "\nGPU {} {} {}  {} MiB  bus {}  NUMA {}  NVLinks {}{}",
            d.index,
            d.uuid,
            d.model,
            d.memory_total_mib,
            d.pci_bus_id,
            numa,
            d.nvlinks.len(),
            if d.mig.is_some() { "  MIG mode" } else { "" }
        );
        if let Some(sample) = &g.sample {
            let _ = writeln!(
                s,
                "  in use: {} MiB, {}% utilisation, {} compute process(es)",
                opt(sample.memory_used_mib),
                opt(sample.utilization_percent),
                sample.processes.len()
            );
            for p in &sample.processes {
                let _ = writeln!(
                    s,
                    "    pid {:>8}  {:>7} MiB  SM {:>3}%",
                    p.pid,
                    opt(p.memory_used_mib),
                    p.sm_percent
                );
            }
        }
        if let Some(profiles) = &g.mig_profiles {
            let _ = writeln!(s, "  MIG profiles:");
            for p in profiles {
                let _ = writeln!(
                    s,
                    "    {:<10} id {:>2}  {} compute + {} memory slices  {} MiB  starts {:?}",
                    p.name, p.id, p.compute_slices, p.memory_slices, p.memory_mib, p.placements
                );
            }
        }
        if let Some(instances) = &g.mig_instances {
            let _ = writeln!(s, "  MIG instances: {}", instances.len());
            for i in instances {
                let _ = writeln!(
                    s,
                    "    {:<10} GI {} CI {}  slices {}+{}  {} MiB  {} process(es)  {}",
                    i.profile,
                    i.gpu_instance_id,
                    i.compute_instance_id,
                    i.start,
                    i.size,
                    i.memory_mib,
                    i.processes,
                    i.uuid
                );
            }
        }
    }
    if let Some(matrix) = &report.topology {
        let _ = writeln!(s, "\n{matrix}");
    }
    if report.listened_ms > 0 {
        let _ = writeln!(
            s,
            "XID events in {} ms: {}",
            report.listened_ms,
            report.events.len()
        );
        for e in &report.events {
            let _ = writeln!(s, "  {} XID {}", e.uuid, e.xid);
        }
    }
    if report.ok() {
        let _ = writeln!(s, "all backend calls succeeded");
    } else {
        let _ = writeln!(s, "{} backend call(s) failed:", report.failures.len());
        for f in &report.failures {
            let _ = writeln!(s, "  {f}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::PcieRelation;
    use crate::gpu::sim::SimBackend;

    fn sim(file: &str) -> SimBackend {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../hack/gpus")
            .join(file);
        SimBackend::from_file(path).unwrap()
    }

    #[test]
    fn reads_inventory_samples_links_and_events_without_failures() {
        let backend = sim("h100-8x-nvswitch.yaml");
        let uuid = backend.uuid_of(2).unwrap().to_owned();
        backend.set_process(&uuid, 4242, 2048, 35).unwrap();
        backend.inject_xid(&uuid, 79).unwrap();
        let report = probe(
            &backend,
            ProbeOptions {
                listen_for_events: Duration::from_millis(50),
            },
        );
        assert!(report.ok(), "{:?}", report.failures);
        assert_eq!(report.gpus.len(), 8);
        let g2 = &report.gpus[2];
        let sample = g2.sample.as_ref().unwrap();
        assert_eq!(sample.processes[0].pid, 4242);
        assert!(g2.mig_profiles.is_none());
        assert_eq!(report.events.len(), 1);
        assert_eq!(report.events[0].xid, 79);
        let text = render(&report);
        assert!(text.contains("pid     4242"), "{text}");
        assert!(text.contains("NV"), "the link matrix is shown: {text}");
        assert!(text.contains("XID 79"), "{text}");
        assert!(text.ends_with("all backend calls succeeded\n"), "{text}");
    }

    #[test]
    fn mig_gpus_show_profiles_and_instances_and_nothing_changes() {
        let backend = sim("a100-8x-mig.yaml");
        let before: Vec<_> = (0..8)
            .filter_map(|i| backend.uuid_of(i).map(str::to_owned))
            .map(|u| backend.mig_instances(&u).ok())
            .collect();
        let report = probe(&backend, ProbeOptions::default());
        assert!(report.ok(), "{:?}", report.failures);
        let mig: Vec<&ProbedGpu> = report
            .gpus
            .iter()
            .filter(|g| g.device.mig.is_some())
            .collect();
        assert!(!mig.is_empty());
        for g in &mig {
            assert!(!g.mig_profiles.as_ref().unwrap().is_empty());
            assert!(g.mig_instances.is_some());
        }
        let after: Vec<_> = (0..8)
            .filter_map(|i| backend.uuid_of(i).map(str::to_owned))
            .map(|u| backend.mig_instances(&u).ok())
            .collect();
        assert_eq!(before, after);
        let text = render(&report);
        assert!(text.contains("MIG profiles:"), "{text}");
        assert_eq!(report.listened_ms, 0);
    }

    /// The simulated machine with one GPU whose live queries fail, as a GPU that fell off
    /// the bus answers NVML.
    struct OneLost {
        inner: SimBackend,
        lost: String,
    }

    impl GpuBackend for OneLost {
        fn kind(&self) -> &'static str {
            "sim"
        }
        fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
            self.inner.devices()
        }
        fn pcie_relation(&self, a: &str, b: &str) -> Result<PcieRelation, GpuError> {
            self.inner.pcie_relation(a, b)
        }
        fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
            if uuid == self.lost {
                return Err(GpuError::Nvml {
                    call: "nvmlDeviceGetMemoryInfo",
                    reason: "GPU is lost".into(),
                });
            }
            self.inner.sample(uuid)
        }
        fn wait_event(&self, timeout: Duration) -> Result<Option<XidEvent>, GpuError> {
            self.inner.wait_event(timeout)
        }
    }

    #[test]
    fn failures_name_the_call_and_the_rest_still_runs() {
        let inner = sim("l40s-4x-pcie.yaml");
        let lost = inner.uuid_of(1).unwrap().to_owned();
        let backend = OneLost {
            inner,
            lost: lost.clone(),
        };
        let report = probe(&backend, ProbeOptions::default());
        assert!(!report.ok());
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        let failure = &report.failures[0];
        assert!(
            failure.contains(&lost) && failure.contains("sample"),
            "{failure}"
        );
        assert!(failure.contains("GPU is lost"), "{failure}");
        assert_eq!(report.gpus.iter().filter(|g| g.sample.is_some()).count(), 3);
        assert!(render(&report).contains("1 backend call(s) failed"));
    }
}
