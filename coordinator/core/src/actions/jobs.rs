//! Jobs: the unit the actions schedule. A group's missing gang members form one atomic part;
//! its further (elastic) members follow one by one. A pod without a group is a job of one.

use crate::cycle::Reason;

use super::context::Ctx;
use super::statement::State;

/// A schedulable unit: a lone pod, or a group's pending pods, of which the members the gang
/// still misses are placed together or not at all and the rest are elastic.
#[derive(Clone, Debug)]
pub struct Job {
    /// Leaf queue.
    pub queue: usize,
    /// Group, if any.
    pub group: Option<u32>,
    /// Pending pods, in order: the first ones complete the gang, the rest are elastic.
    pub pods: Vec<u32>,
    /// Priority (highest of the group and its pods).
    pub priority: i32,
    /// Creation time of the oldest pod.
    pub created: u64,
}

/// Builds jobs from the pending pods; pods that cannot form a job get a note.
pub(super) fn build_jobs(ctx: &Ctx, st: &State, notes: &mut [Option<Reason>]) -> Vec<Job> {
    let snap = ctx.snap;
    let mut jobs = Vec::new();
    let pending = |p: u32| !st.orig_bound[p as usize] && snap.pods[p as usize].placement.is_none();
    for (i, info) in ctx.pods.iter().enumerate() {
        let p = i as u32;
        if info.group.is_some() || !pending(p) || info.invalid.is_some() {
            continue;
        }
        let Some(queue) = info.queue else { continue };
        let pod = &snap.pods[i];
        jobs.push(Job {
            queue,
            group: None,
            pods: vec![p],
            priority: pod.priority,
            created: pod.created,
        });
    }
    for (gi, g) in ctx.groups.iter().enumerate() {
        let mut members: Vec<u32> = g
            .members
            .iter()
            .copied()
            .filter(|&m| pending(m) && ctx.pods[m as usize].invalid.is_none())
            .collect();
        if members.is_empty() {
            continue;
        }
        if let Some(r) = &g.invalid {
            for &m in &members {
                notes[m as usize] = Some(r.clone());
            }
            continue;
        }
        members.sort_by(|&a, &b| {
            let (pa, pb) = (&snap.pods[a as usize], &snap.pods[b as usize]);
            pb.priority
                .cmp(&pa.priority)
                .then(pa.created.cmp(&pb.created))
                .then(pa.name.cmp(&pb.name))
        });
        let running = st.group_placed[gi];
        if running + (members.len() as u32) < g.min_member {
            for &m in &members {
                notes[m as usize] = Some(Reason::WaitingForMembers {
                    group: g.name.clone(),
                    present: running + members.len() as u32,
                    min_member: g.min_member,
                });
            }
            continue;
        }
        if let Some(max) = g.max_member {
            let room = max.max(g.min_member).saturating_sub(running) as usize;
            for &m in members.iter().skip(room) {
                notes[m as usize] = Some(Reason::BeyondMaxMember {
                    group: g.name.clone(),
                    max_member: max,
                });
            }
            members.truncate(room);
            if members.is_empty() {
                continue;
            }
        }
        let first = members[0] as usize;
        let Some(queue) = ctx.pods[first].queue else {
            continue;
        };
        let priority = members
            .iter()
            .map(|&m| snap.pods[m as usize].priority)
            .max()
            .unwrap_or(0)
            .max(g.priority);
        let created = members
            .iter()
            .map(|&m| snap.pods[m as usize].created)
            .min()
            .unwrap_or(0);
        jobs.push(Job {
            queue,
            group: Some(gi as u32),
            pods: members,
            priority,
            created,
        });
    }
    jobs
}
