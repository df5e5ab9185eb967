//! Stale gangs: a group that fell below `minMember` after it started is completed if its
//! missing members fit now, and otherwise evicted whole once the grace period has passed.

use crate::cycle::EvictionReason;

use super::allocate::Mode;
use super::engine::Engine;

impl Engine<'_> {
    /// The stale-gang action.
    pub(crate) fn stale_gangs(&mut self) {
        let now = self.ctx.snap.now;
        let grace = self.ctx.cfg.gang_grace_seconds;
        for g in 0..self.ctx.groups.len() {
            let info = &self.ctx.groups[g];
            let running = self.st.group_placed[g];
            if running == 0 || running >= info.min_member {
                continue;
            }
            let Some(since) = info.below_min_since else {
                continue;
            };
            if now.saturating_sub(since) < grace {
                continue;
            }
            // Give the gang one chance to complete from free capacity.
            if let Some(j) = self.jobs.iter().position(|j| j.group == Some(g as u32))
                && self.try_job(j, Mode::Allocate)
                && self.st.group_placed[g] >= self.ctx.groups[g].min_member
            {
                continue;
            }
            let members: Vec<u32> = self.ctx.groups[g]
                .members
                .iter()
                .copied()
                .filter(|&m| self.st.placed[m as usize].is_some() && self.st.orig_bound[m as usize])
                .collect();
            for m in members {
                if !self.ctx.snap.pods[m as usize].terminating {
                    self.st
                        .evict(&self.ctx, m, EvictionReason::GangBelowMinMember);
                }
            }
        }
    }
}
