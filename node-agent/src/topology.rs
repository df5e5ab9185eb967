//! The GPU link matrix and the choices made from it: which set of whole GPUs a
//! multi-GPU container should get (the best-connected one), and which single GPU to
//! give away when any would do (the one whose loss breaks the least connectivity for
//! later multi-GPU containers, so NVLink pairs stay whole).
//!
//! GPUs are addressed by their position in the device list given to
//! [`Topology::discover`]; callers map positions to UUIDs.

use std::fmt::Write as _;

use serde::Serialize;

use crate::gpu::{GpuBackend, GpuDevice, GpuError, LinkPeer, PcieRelation};

/// How two GPUs are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PairLink {
    /// NVLink links between them: direct bridges, plus, when both hang off the NVSwitch
    /// fabric, the smaller of their switch link counts.
    pub nvlinks: u32,
    /// Whether they reach each other through NVSwitch.
    pub nvswitch: bool,
    /// Their PCIe relation.
    pub pcie: PcieRelation,
}

impl PairLink {
    /// The `nvidia-smi topo -m`-style cell: `NV12`, `NVS18` (through a switch) or the
    /// PCIe level.
    pub fn label(&self) -> String {
        match (self.nvlinks, self.nvswitch) {
            (0, _) => self.pcie.short().to_owned(),
            (n, true) => format!("NVS{n}"),
            (n, false) => format!("NV{n}"),
        }
    }

    /// Higher is better connected: NVLink bandwidth dominates, PCIe distance breaks ties.
    pub fn score(&self) -> u64 {
        let pcie = match self.pcie {
            PcieRelation::SameBoard => 60,
            PcieRelation::SingleSwitch => 50,
            PcieRelation::MultipleSwitches => 40,
            PcieRelation::HostBridge => 30,
            PcieRelation::NumaNode => 20,
            PcieRelation::System => 10,
        };
        u64::from(self.nvlinks) * 100 + pcie
    }
}

/// One GPU's place in the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct TopoGpu {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// NUMA node.
    pub numa_node: Option<u32>,
}

/// The pair matrix of a node's GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    gpus: Vec<TopoGpu>,
    /// Row-major `n × n`; the diagonal is unused.
    pairs: Vec<PairLink>,
}

/// Above this many candidate sets, [`Topology::best_set`] grows a set greedily.
const MAX_ENUMERATED_SETS: u64 = 20_000;

impl Topology {
    /// Builds the matrix for `devices`, asking `backend` for PCIe relations. A pair
    /// whose query fails (a lost GPU) counts as the farthest relation, so that GPU is
    /// the last choice for sets; it never fails the node.
    pub fn discover(backend: &dyn GpuBackend, devices: &[GpuDevice]) -> Result<Self, GpuError> {
        let mut relations = vec![PcieRelation::System; devices.len() * devices.len()];
        for (i, a) in devices.iter().enumerate() {
            for (j, b) in devices.iter().enumerate().skip(i + 1) {
                let rel = match backend.pcie_relation(&a.uuid, &b.uuid) {
                    Ok(rel) => rel,
                    Err(error) => {
                        tracing::warn!(a = %a.uuid, b = %b.uuid, %error, "PCIe relation unknown; counted as SYS");
                        PcieRelation::System
                    }
                };
                relations[i * devices.len() + j] = rel;
                relations[j * devices.len() + i] = rel;
            }
        }
        let n = devices.len();
        Ok(Self::from_parts(devices, |i, j| relations[i * n + j]))
    }

    /// Builds the matrix with PCIe relations from `pcie(i, j)`.
    pub fn from_parts(devices: &[GpuDevice], pcie: impl Fn(usize, usize) -> PcieRelation) -> Self {
        let n = devices.len();
        let switch_links: Vec<u32> = devices
            .iter()
            .map(|d| {
                d.nvlinks
                    .iter()
                    .filter(|l| l.remote == LinkPeer::Switch)
                    .count() as u32
            })
            .collect();
        let mut pairs = Vec::with_capacity(n * n);
        for (i, a) in devices.iter().enumerate() {
            for (j, b) in devices.iter().enumerate() {
                let direct = a
                    .nvlinks
                    .iter()
                    .filter(|l| l.remote == LinkPeer::Gpu && l.remote_pci_bus_id == b.pci_bus_id)
                    .count() as u32;
                let nvswitch = i != j && switch_links[i] > 0 && switch_links[j] > 0;
                let via_switch = if nvswitch {
                    switch_links[i].min(switch_links[j])
                } else {
                    0
                };
                pairs.push(PairLink {
                    nvlinks: if i == j { 0 } else { direct + via_switch },
                    nvswitch,
                    pcie: if i == j {
                        PcieRelation::SameBoard
                    } else {
                        pcie(i, j)
                    },
                });
            }
        }
        let gpus = devices
            .iter()
            .map(|d| TopoGpu {
                index: d.index,
                uuid: d.uuid.clone(),
                numa_node: d.numa_node,
            })
            .collect();
        Self { gpus, pairs }
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether there are no GPUs.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The GPUs, by position.
    pub fn gpus(&self) -> &[TopoGpu] {
        &self.gpus
    }

    /// Position of the GPU with `uuid`.
    pub fn position(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }

    /// The link between GPUs `i` and `j`.
    pub fn pair(&self, i: usize, j: usize) -> PairLink {
        self.pairs[i * self.gpus.len() + j]
    }

    /// Positions of the GPUs `i` has NVLink to.
    pub fn nvlink_peers(&self, i: usize) -> Vec<usize> {
        (0..self.len())
            .filter(|&j| j != i && self.pair(i, j).nvlinks > 0)
            .collect()
    }

    /// Sum of the pair scores inside `set`.
    pub fn set_score(&self, set: &[usize]) -> u64 {
        let mut total = 0;
        for (k, &i) in set.iter().enumerate() {
            for &j in &set[k + 1..] {
                total += self.pair(i, j).score();
            }
        }
        total
    }

    /// The best-connected `size` GPUs out of `free` that contain all of `must`
    /// (positions); `None` when impossible. Ties go to the set that leaves the rest of
    /// `free` best connected, then to the lowest positions.
    pub fn best_set(&self, free: &[usize], must: &[usize], size: usize) -> Option<Vec<usize>> {
        let mut free: Vec<usize> = free.to_vec();
        free.sort_unstable();
        free.dedup();
        if must.iter().any(|m| !free.contains(m)) || size < must.len() || size > free.len() {
            return None;
        }
        if size == 0 {
            return Some(Vec::new());
        }
        if size == 1 && must.is_empty() {
            return self.best_single(&free).map(|g| vec![g]);
        }
        let optional: Vec<usize> = free.iter().copied().filter(|g| !must.contains(g)).collect();
        let need = size - must.len();
        if binomial(optional.len() as u64, need as u64) > MAX_ENUMERATED_SETS {
            return Some(self.greedy_set(&free, must, size));
        }
        let mut best: Option<(u64, u64, Vec<usize>)> = None;
        for_each_combination(&optional, need, &mut |extra| {
            let mut set: Vec<usize> = must.iter().copied().chain(extra.iter().copied()).collect();
            set.sort_unstable();
            let score = self.set_score(&set);
            let rest: Vec<usize> = free.iter().copied().filter(|g| !set.contains(g)).collect();
            let left = self.set_score(&rest);
            let better = match &best {
                None => true,
                Some((s, l, b)) => {
                    (score, left) > (*s, *l) || ((score, left) == (*s, *l) && set < *b)
                }
            };
            if better {
                best = Some((score, left, set));
            }
        });
        best.map(|(_, _, set)| set)
    }

    /// Grows a set from `must` (or the best pair) by adding the GPU with the most
    /// connection to the set so far; for very large candidate counts.
    fn greedy_set(&self, free: &[usize], must: &[usize], size: usize) -> Vec<usize> {
        let mut set = must.to_vec();
        while set.len() < size {
            let next = free
                .iter()
                .copied()
                .filter(|g| !set.contains(g))
                .max_by_key(|&g| {
                    let gain: u64 = set.iter().map(|&s| self.pair(g, s).score()).sum();
                    // Prefer lower positions on equal gain: larger key for smaller g.
                    (gain, usize::MAX - g)
                });
            match next {
                Some(g) => set.push(g),
                None => break,
            }
        }
        set.sort_unstable();
        set
    }

    /// The GPU out of `free` whose loss costs the remaining free GPUs the least
    /// connectivity (e.g. the one whose NVLink partner is already taken).
    pub fn best_single(&self, free: &[usize]) -> Option<usize> {
        free.iter().copied().min_by_key(|&g| {
            let loss: u64 = free
                .iter()
                .filter(|&&h| h != g)
                .map(|&h| self.pair(g, h).score())
                .sum();
            (loss, g)
        })
    }

    /// The link matrix as text, in the style of `nvidia-smi topo -m`.
    pub fn render(&self) -> String {
        let mut out = String::from("      ");
        for g in &self.gpus {
            let _ = write!(out, "{:>7}", format!("GPU{}", g.index));
        }
        out.push_str("   NUMA\n");
        for (i, g) in self.gpus.iter().enumerate() {
            let _ = write!(out, "{:<6}", format!("GPU{}", g.index));
            for j in 0..self.len() {
                let cell = if i == j {
                    "X".to_owned()
                } else {
                    self.pair(i, j).label()
                };
                let _ = write!(out, "{cell:>7}");
            }
            let numa = g
                .numa_node
                .map_or_else(|| "-".to_owned(), |n| n.to_string());
            let _ = writeln!(out, "{numa:>7}");
        }
        out.push_str(
            "\nNV#  = # NVLink bridges   NVS# = # links through NVSwitch\n\
             PIX  = one PCIe switch     PXB  = several PCIe switches   PHB = host bridge\n\
             NODE = same NUMA node      SYS  = across CPU sockets\n",
        );
        out
    }
}

fn binomial(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut r: u64 = 1;
    for i in 0..k {
        r = r.saturating_mul(n - i) / (i + 1);
    }
    r
}

fn for_each_combination(items: &[usize], k: usize, f: &mut impl FnMut(&[usize])) {
    fn go(
        items: &[usize],
        k: usize,
        start: usize,
        cur: &mut Vec<usize>,
        f: &mut impl FnMut(&[usize]),
    ) {
        if cur.len() == k {
            f(cur);
            return;
        }
        for i in start..items.len() {
            if items.len() - i < k - cur.len() {
                break;
            }
            cur.push(items[i]);
            go(items, k, i + 1, cur, f);
            cur.pop();
        }
    }
    go(items, k, 0, &mut Vec::with_capacity(k), f);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::SimBackend;

    fn topo(file: &str) -> Topology {
        let path = format!("{}/../hack/gpus/{file}", env!("CARGO_MANIFEST_DIR"));
        let sim = SimBackend::from_file(path).unwrap();
        let devices = sim.devices().unwrap();
        Topology::discover(&sim, &devices).unwrap()
    }

    #[test]
    fn a100_pairs_give_linked_pairs_and_singles_avoid_splitting() {
        let t = topo("a100-8x-mig.yaml");
        assert_eq!(t.pair(0, 1).label(), "NV12");
        assert_eq!(t.pair(0, 2).label(), "NODE");
        assert_eq!(t.nvlink_peers(6), vec![7]);
        // GPU 7 is in MIG mode, so 0..=6 are the shareable ones.
        let free: Vec<usize> = (0..7).collect();
        let linked = |s: Vec<usize>| s.len() == 2 && t.pair(s[0], s[1]).nvlinks == 12;
        // Any intact pair; here (4, 5), which keeps the NUMA-0 quad 0-3 whole.
        assert_eq!(t.best_set(&free, &[], 2), Some(vec![4, 5]));
        // 6's partner is unavailable: giving 6 away breaks no pair.
        assert_eq!(t.best_single(&free), Some(6));
        // With 6 taken, the next single takes one GPU of a pair, the one after its partner.
        let free: Vec<usize> = (0..6).collect();
        let first = t.best_single(&free).unwrap();
        let rest: Vec<usize> = free.iter().copied().filter(|&g| g != first).collect();
        let second = t.best_single(&rest).unwrap();
        assert_eq!(t.nvlink_peers(first), vec![second]);
        // A 2-GPU request with one GPU of pair (2,3) taken picks an intact pair.
        assert!(linked(t.best_set(&[0, 1, 2, 4, 5], &[], 2).unwrap()));
        assert_eq!(t.best_set(&[1, 2, 3, 4], &[], 2), Some(vec![2, 3]));
        // Four GPUs: two pairs on one NUMA node.
        assert_eq!(t.best_set(&free, &[], 4), Some(vec![0, 1, 2, 3]));
        // must-include is honoured.
        assert_eq!(t.best_set(&free, &[4], 2), Some(vec![4, 5]));
    }

    #[test]
    fn h100_nvswitch_is_all_to_all() {
        let t = topo("h100-8x-nvswitch.yaml");
        assert_eq!(t.pair(0, 7).label(), "NVS18");
        assert_eq!(t.nvlink_peers(0).len(), 7);
        // Everything is NVLinked, so PCIe proximity decides: same switch, then NUMA.
        let free: Vec<usize> = (0..8).collect();
        assert_eq!(t.best_set(&free, &[], 2), Some(vec![0, 1]));
        assert_eq!(t.best_set(&free, &[], 4), Some(vec![0, 1, 2, 3]));
        assert_eq!(t.best_set(&free, &[], 8).map(|s| s.len()), Some(8));
    }

    #[test]
    fn l40s_pcie_prefers_same_switch_and_numa() {
        let t = topo("l40s-4x-pcie.yaml");
        assert_eq!(t.pair(0, 1).label(), "NODE");
        assert_eq!(t.pair(1, 2).label(), "SYS");
        assert_eq!(t.best_set(&[0, 2, 3], &[], 2), Some(vec![2, 3]));
        // A single goes where it breaks no same-switch pair.
        assert_eq!(t.best_single(&[0, 2, 3]), Some(0));
        assert_eq!(t.best_set(&[0, 1], &[], 3), None);
    }

    #[test]
    fn render_shows_matrix() {
        let t = topo("l40s-4x-pcie.yaml");
        let text = t.render();
        let first = text.lines().nth(1).unwrap();
        assert_eq!(first, "GPU0        X   NODE    SYS    SYS      0");
    }

    #[test]
    fn greedy_path_for_large_sets() {
        assert_eq!(binomial(16, 8), 12_870);
        assert!(binomial(64, 8) > MAX_ENUMERATED_SETS);
        let t = topo("h100-8x-nvswitch.yaml");
        assert_eq!(
            t.greedy_set(&[0, 1, 2, 3, 4, 5, 6, 7], &[4], 3),
            vec![4, 5, 6]
        );
    }
}
