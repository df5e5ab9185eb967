//! Where a new MIG instance goes. Pure: the caller passes the GPU's profile table and
//! what is occupied; nothing here talks to a GPU.
//!
//! A placement is judged by what it leaves: for every profile, largest first, how many
//! placements of it would still be free. The candidate whose leftovers compare best
//! (lexicographically, so keeping one 4g beats keeping two more 1g) wins; ties go to
//! the higher start, which keeps slice 0 (where the big profiles must start) free longest.

use crate::gpu::MigProfile;
use crate::gpu::mig::{COMPUTE_SLICES, MEMORY_SLICES};
pub use crate::gpu::mig::{Span, fits_at, free_placements};

/// What `occupied` leaves for `table`: free placements per profile, largest profile first.
fn leftovers(table: &[MigProfile], occupied: &[Span]) -> Vec<usize> {
    let mut order: Vec<&MigProfile> = table.iter().collect();
    order.sort_by(|a, b| {
        (b.memory_slices, b.compute_slices, a.id).cmp(&(a.memory_slices, a.compute_slices, b.id))
    });
    order
        .iter()
        .map(|p| free_placements(occupied, p).len())
        .collect()
}

/// The start at which to create `want` so that the largest profiles stay possible
/// afterwards; `None` when it fits nowhere.
pub fn choose_placement(table: &[MigProfile], occupied: &[Span], want: &MigProfile) -> Option<u32> {
    free_placements(occupied, want)
        .into_iter()
        .map(|start| {
            let mut after = occupied.to_vec();
            after.push(Span {
                start,
                size: want.memory_slices,
                compute: want.compute_slices,
            });
            (leftovers(table, &after), start)
        })
        .max()
        .map(|(_, start)| start)
}

/// Profiles of `table` large enough for a share of `memory_mib` and `compute_milli`
/// (1000 = the whole GPU) of a GPU with `gpu_memory_mib`, smallest first. A profile's
/// memory counts as the larger of its real size and its nominal share of the GPU
/// (`memory_slices / 8`), so a half-GPU share fits the 4-slice profiles although the
/// driver reserves a little of each instance.
pub fn fitting_profiles(
    table: &[MigProfile],
    gpu_memory_mib: u64,
    memory_mib: u64,
    compute_milli: u32,
) -> Vec<&MigProfile> {
    let mut fit: Vec<&MigProfile> = table
        .iter()
        .filter(|p| {
            let nominal = gpu_memory_mib * u64::from(p.memory_slices) / u64::from(MEMORY_SLICES);
            p.memory_mib.max(nominal) >= memory_mib
                && p.compute_slices * 1000 >= compute_milli * COMPUTE_SLICES
        })
        .collect();
    fit.sort_by_key(|p| (p.memory_slices, p.compute_slices, p.memory_mib, p.id));
    fit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::mig::{a100_40gb, h100_80gb};

    fn named<'a>(table: &'a [MigProfile], name: &str) -> &'a MigProfile {
        table.iter().find(|p| p.name == name).unwrap()
    }

    /// Places `name` with the planner and records it.
    fn place(table: &[MigProfile], occupied: &mut Vec<Span>, name: &str) -> Option<u32> {
        let p = named(table, name);
        let start = choose_placement(table, occupied, p)?;
        occupied.push(Span {
            start,
            size: p.memory_slices,
            compute: p.compute_slices,
        });
        Some(start)
    }

    fn possible(table: &[MigProfile], occupied: &[Span], name: &str) -> bool {
        !free_placements(occupied, named(table, name)).is_empty()
    }

    #[test]
    fn a_first_small_instance_keeps_the_4g_and_3g_halves() {
        let t = a100_40gb();
        let mut occ = Vec::new();
        // First fit would take slice 0 and make 4g impossible.
        assert_eq!(place(&t, &mut occ, "1g.5gb"), Some(6));
        assert!(possible(&t, &occ, "4g.20gb"));
        assert!(possible(&t, &occ, "3g.20gb"));
        assert!(!possible(&t, &occ, "7g.40gb"));
        // A 3g then takes the low half; a 2g still fits beside the 1g.
        assert_eq!(place(&t, &mut occ, "3g.20gb"), Some(0));
        assert!(possible(&t, &occ, "2g.10gb"));
        assert_eq!(place(&t, &mut occ, "2g.10gb"), Some(4));
        // Only slice 7 is free, and no profile may start there: nothing fits any more.
        for p in &t {
            assert!(!possible(&t, &occ, &p.name), "{} still fits", p.name);
        }
        assert_eq!(place(&t, &mut occ, "1g.5gb"), None);
    }

    #[test]
    fn small_instances_pack_from_the_top() {
        let t = a100_40gb();
        let mut occ = Vec::new();
        let starts: Vec<Option<u32>> = (0..7).map(|_| place(&t, &mut occ, "1g.5gb")).collect();
        // The first four stay in the upper half while the 4g at slice 0 is possible.
        assert_eq!(&starts[..2], &[Some(6), Some(5)]);
        assert!(starts[..3].iter().all(|s| s.is_some_and(|s| s >= 4)));
        assert!(starts.iter().all(Option::is_some));
        // Seven 1g use all seven compute slices: the GPU is full.
        assert_eq!(place(&t, &mut occ, "1g.5gb"), None);
        assert_eq!(place(&t, &mut occ, "1g.10gb"), None);
    }

    #[test]
    fn a_full_gpu_rejects_and_freeing_restores() {
        let t = h100_80gb();
        let mut occ = Vec::new();
        assert_eq!(place(&t, &mut occ, "7g.80gb"), Some(0));
        assert_eq!(place(&t, &mut occ, "1g.10gb"), None);
        occ.clear();
        assert_eq!(place(&t, &mut occ, "4g.40gb"), Some(0));
        assert_eq!(place(&t, &mut occ, "3g.40gb"), Some(4));
        assert_eq!(place(&t, &mut occ, "1g.10gb"), None);
        // Freeing the 3g makes room for it (or smaller ones) again.
        occ.retain(|s| s.start != 4);
        assert!(possible(&t, &occ, "3g.40gb"));
        assert_eq!(place(&t, &mut occ, "2g.20gb"), Some(4));
        assert_eq!(place(&t, &mut occ, "1g.20gb"), Some(6));
    }

    #[test]
    fn h100_mixed_sizes_keep_the_largest_possible() {
        let t = h100_80gb();
        let mut occ = Vec::new();
        assert_eq!(place(&t, &mut occ, "2g.20gb"), Some(4));
        // 2g at 4 leaves the 4g at 0; 2g at 0 would not have.
        assert!(possible(&t, &occ, "4g.40gb"));
        assert_eq!(place(&t, &mut occ, "1g.20gb"), Some(6));
        assert!(possible(&t, &occ, "4g.40gb"));
        assert_eq!(place(&t, &mut occ, "4g.40gb"), Some(0));
        assert_eq!(place(&t, &mut occ, "1g.10gb"), None);
    }

    #[test]
    fn smallest_fitting_profile_for_a_share() {
        let t = a100_40gb();
        let names = |m, c| -> Vec<String> {
            fitting_profiles(&t, 40960, m, c)
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        assert_eq!(names(4096, 100)[0], "1g.5gb");
        // A tenth of the GPU's memory needs two memory slices.
        assert_eq!(names(6000, 100)[0], "1g.10gb");
        assert_eq!(names(8000, 250)[0], "2g.10gb");
        // Half the memory, 3/7 of compute: 3g; more compute: 4g.
        assert_eq!(names(20480, 420)[0], "3g.20gb");
        assert_eq!(names(20480, 500)[0], "4g.20gb");
        assert_eq!(names(40960, 1000), ["7g.40gb"]);
        assert!(names(50000, 100).is_empty());
    }
}
