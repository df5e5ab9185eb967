//! NVLink-aware choice of GPU sets inside one node.
//!
//! GPUs sharing an NVLink island talk over NVLink; across islands traffic goes over PCIe. A
//! multi-GPU pod should get its GPUs from as few islands as possible, and from the island whose
//! free capacity fits it most tightly, so larger connected sets stay whole for later pods. A
//! single-GPU pod likewise takes a GPU from the smallest free group, so it does not split a
//! free NVLink pair when a lone GPU is available.

use super::gpu_fit::GpuFree;

/// Group key of a GPU: its island, or a singleton group of its own when it has no NVLink.
fn group_key(gpus: &[GpuFree], idx: u32) -> u64 {
    match gpus[idx as usize].island {
        Some(i) => u64::from(i),
        None => (1u64 << 40) + u64::from(idx),
    }
}

/// Picks `count` GPUs out of `cands` (indices into `gpus`, in the caller's order of preference
/// inside a group). Returns the chosen indices and the number of islands they span.
pub(super) fn pick_set(gpus: &[GpuFree], cands: &[u32], count: usize) -> Option<(Vec<u32>, u32)> {
    if count == 0 || cands.len() < count {
        return None;
    }
    // Groups in first-seen order of their key (small vectors; nodes have at most a few dozen GPUs).
    let mut groups: Vec<(u64, Vec<u32>)> = Vec::new();
    for &c in cands {
        let k = group_key(gpus, c);
        match groups.iter_mut().find(|(gk, _)| *gk == k) {
            Some((_, v)) => v.push(c),
            None => groups.push((k, vec![c])),
        }
    }
    // Tightest single group that fits.
    let best = groups
        .iter()
        .filter(|(_, v)| v.len() >= count)
        .min_by_key(|(k, v)| (v.len(), *k));
    if let Some((_, v)) = best {
        return Some((v[..count].to_vec(), 1));
    }
    // Otherwise span as few groups as possible: biggest first, equal sizes in the caller's
    // order of preference (the sort is stable).
    groups.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
    let mut out = Vec::with_capacity(count);
    let mut spanned = 0;
    for (_, v) in &groups {
        if out.len() >= count {
            break;
        }
        spanned += 1;
        let take = (count - out.len()).min(v.len());
        out.extend_from_slice(&v[..take]);
    }
    out.sort_unstable();
    Some((out, spanned))
}

/// Whether taking GPU `idx` alone would split a completely free NVLink island of two or more
/// GPUs (the kind of set a multi-GPU pod needs later).
pub(super) fn breaks_free_island(gpus: &[GpuFree], idx: u32) -> bool {
    let Some(island) = gpus[idx as usize].island else {
        return false;
    };
    let mut members = 0;
    for g in gpus.iter().filter(|g| g.island == Some(island)) {
        if !g.is_idle() || !g.healthy {
            return false;
        }
        members += 1;
    }
    members >= 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(islands: &[Option<u32>], idle: &[bool]) -> Vec<GpuFree> {
        islands
            .iter()
            .zip(idle)
            .map(|(&island, &i)| GpuFree {
                compute_free: if i { 1000 } else { 0 },
                mem_free: if i { 1000 } else { 0 },
                mem_total: 1000,
                holders: u32::from(!i),
                ..GpuFree::idle(1000, island)
            })
            .collect()
    }

    #[test]
    fn pair_stays_whole_when_a_lone_gpu_exists() {
        // Islands: {0,1} both free, {2,3} with 3 used -> 2 is a lone free GPU.
        let g = gpus(
            &[Some(0), Some(0), Some(1), Some(1)],
            &[true, true, true, false],
        );
        let (set, spanned) = pick_set(&g, &[0, 1, 2], 1).unwrap();
        assert_eq!(set, vec![2]);
        assert_eq!(spanned, 1);
        assert!(breaks_free_island(&g, 0));
        assert!(!breaks_free_island(&g, 2));
    }

    #[test]
    fn multi_gpu_takes_one_island() {
        let g = gpus(
            &[Some(0), Some(0), Some(1), Some(1)],
            &[true, false, true, true],
        );
        let (set, spanned) = pick_set(&g, &[0, 2, 3], 2).unwrap();
        assert_eq!(set, vec![2, 3]);
        assert_eq!(spanned, 1);
    }

    #[test]
    fn spans_few_islands_when_needed() {
        let g = gpus(&[Some(0), Some(0), Some(1), Some(1), Some(2)], &[true; 5]);
        let (set, spanned) = pick_set(&g, &[0, 1, 2, 3, 4], 3).unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(spanned, 2);
    }
}
