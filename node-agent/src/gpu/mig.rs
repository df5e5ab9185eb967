//! MIG GPU-instance profile tables of the GPUs Tessera knows, as NVIDIA's MIG user guide
//! documents them: name, driver profile id, compute and memory slices, instance memory
//! and the memory slices each placement may start at. Real hardware is asked through
//! NVML instead; these tables serve the simulated backend and the tests, and document
//! the geometry the planner reasons about.
//!
//! Media-extension profiles (`+me`) are left out: the agent never creates them (their
//! single decoder set is a node-level decision), though instances of them still count
//! as occupied slices when they exist.
//!
//! Also where an instance may sit ([`fits_at`], [`free_placements`]): hardware facts the
//! simulated backend checks creations against, and the planner ([`crate::enforce::mig::planner`])
//! chooses among. Pure data and geometry, no dependencies beyond the GPU layer's types.

use crate::gpu::{MigInstance, MigProfile};

/// Memory slices of every MIG-capable GPU in these tables.
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices of every MIG-capable GPU in these tables.
pub const COMPUTE_SLICES: u32 = 7;

fn profile(id: u32, name: &str, compute: u32, memory: u32, mib: u64, at: &[u32]) -> MigProfile {
    MigProfile {
        id,
        name: name.to_owned(),
        compute_slices: compute,
        memory_slices: memory,
        memory_mib: mib,
        placements: at.to_vec(),
    }
}

/// The layout shared by A100, H100 and H200 (7 compute, 8 memory slices); the
/// driver's profile ids are the same on all three. `mib` holds the instance memory of
/// the 1-, 2-, 4- and 8-memory-slice sizes.
fn ga100_family(names: [&str; 6], mib: [u64; 4]) -> Vec<MigProfile> {
    let [one_small, one_large, two, three, four, seven] = names;
    vec![
        profile(19, one_small, 1, 1, mib[0], &[0, 1, 2, 3, 4, 5, 6]),
        profile(15, one_large, 1, 2, mib[1], &[0, 2, 4, 6]),
        profile(14, two, 2, 2, mib[1], &[0, 2, 4]),
        profile(9, three, 3, 4, mib[2], &[0, 4]),
        profile(5, four, 4, 4, mib[2], &[0]),
        profile(0, seven, 7, 8, mib[3], &[0]),
    ]
}

/// A100 SXM4/PCIe 40GB.
pub fn a100_40gb() -> Vec<MigProfile> {
    ga100_family(
        [
            "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
        ],
        [4864, 9984, 20096, 40192],
    )
}

/// A100 SXM4/PCIe 80GB.
pub fn a100_80gb() -> Vec<MigProfile> {
    ga100_family(
        [
            "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
        ],
        [9728, 19968, 40192, 80896],
    )
}

/// H100 SXM5/PCIe 80GB.
pub fn h100_80gb() -> Vec<MigProfile> {
    ga100_family(
        [
            "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
        ],
        [9984, 20096, 40448, 81152],
    )
}

/// H200 SXM5/NVL 141GB. Instance sizes are approximate (from the profile names); on
/// real hardware NVML's own figures are used.
pub fn h200_141gb() -> Vec<MigProfile> {
    ga100_family(
        [
            "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
        ],
        [17920, 35584, 71680, 143360],
    )
}

/// The table for a GPU named `model` (NVML's product name or a shape file's short
/// model, e.g. `NVIDIA A100-SXM4-40GB`, `A100-40GB`, `H100-80GB`) with `memory_mib` of
/// memory; `None` for GPUs without MIG or with a layout not tabled here (A30, H100
/// 94/96GB, Blackwell).
pub fn table_for(model: &str, memory_mib: u64) -> Option<Vec<MigProfile>> {
    let model = model.to_ascii_uppercase();
    let gib = memory_mib / 1024;
    if model.contains("A100") {
        return Some(if gib < 60 { a100_40gb() } else { a100_80gb() });
    }
    if model.contains("H100") && (70..=85).contains(&gib) {
        return Some(h100_80gb());
    }
    if model.contains("H200") {
        return Some(h200_141gb());
    }
    None
}

/// Compute slices of a GPU-instance profile named as NVIDIA names them: the `N` of
/// `Ng.<memory>` (`1g.10gb+me` → 1); 0 for a name of another form. The simulated driver
/// reports an instance's slices from its profile as the real one does.
pub fn compute_slices_of(profile: &str) -> u32 {
    profile
        .split_once('g')
        .and_then(|(n, _)| n.parse().ok())
        .filter(|n| (1..=COMPUTE_SLICES).contains(n))
        .unwrap_or(0)
}

/// Memory and compute slices held by one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
    /// Compute slices.
    pub compute: u32,
}

impl From<&MigInstance> for Span {
    fn from(i: &MigInstance) -> Self {
        Span {
            start: i.start,
            size: i.size,
            compute: i.compute_slices,
        }
    }
}

fn overlaps(a: Span, start: u32, size: u32) -> bool {
    a.start < start + size && start < a.start + a.size
}

/// Whether `profile` can be created at memory slice `start` next to `occupied`.
pub fn fits_at(occupied: &[Span], profile: &MigProfile, start: u32) -> bool {
    let compute_used: u32 = occupied.iter().map(|s| s.compute).sum();
    profile.placements.contains(&start)
        && start + profile.memory_slices <= MEMORY_SLICES
        && compute_used + profile.compute_slices <= COMPUTE_SLICES
        && !occupied
            .iter()
            .any(|s| overlaps(*s, start, profile.memory_slices))
}

/// Every start at which `profile` could be created now.
pub fn free_placements(occupied: &[Span], profile: &MigProfile) -> Vec<u32> {
    profile
        .placements
        .iter()
        .copied()
        .filter(|&start| fits_at(occupied, profile, start))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placement_lies_inside_the_gpu() {
        for table in [a100_40gb(), a100_80gb(), h100_80gb(), h200_141gb()] {
            for p in &table {
                assert!(!p.placements.is_empty(), "{}", p.name);
                for start in &p.placements {
                    assert!(
                        start + p.memory_slices <= MEMORY_SLICES,
                        "{} at {start}",
                        p.name
                    );
                    assert_eq!(start % p.memory_slices.min(4), 0, "{} at {start}", p.name);
                }
                assert!(p.compute_slices <= COMPUTE_SLICES);
                assert!(p.name.starts_with(&format!("{}g.", p.compute_slices)));
            }
        }
    }

    #[test]
    fn tables_are_found_by_model_name() {
        let name = |t: Option<Vec<MigProfile>>| t.map(|t| t[0].name.clone());
        assert_eq!(
            name(table_for("A100-40GB", 40960)).as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            name(table_for("NVIDIA A100-SXM4-80GB", 81920)).as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            name(table_for("NVIDIA H100 80GB HBM3", 81559)).as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            name(table_for("NVIDIA H200", 143771)).as_deref(),
            Some("1g.18gb")
        );
        assert_eq!(table_for("NVIDIA H100 NVL", 95830), None);
        assert_eq!(table_for("L40S", 46068), None);
    }
}
