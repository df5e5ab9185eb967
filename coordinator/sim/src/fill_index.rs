//! Ordered indexes that let the fill engine find a pod's best node without scoring every node.
//!
//! The engine's node order is "highest score, then smallest tie rank". A [`ShapeTree`] keeps
//! that order for one task shape as a tournament tree over the nodes laid out by tie rank:
//! each leaf holds one node's score for the shape (and whether its free CPU, GPUs and pod
//! count admit the shape), each inner entry the winning leaf of its subtree, so the root is
//! the answer. A placement changes one node, so a tree is brought up to date by re-scoring
//! only the nodes changed since it was last read (the engine's change log) and replaying
//! `O(log n)` matches per node. Memory is the one feasibility input a shape does not fix (pods
//! of one shape ask for different amounts), so it is checked at query time, with the per-
//! subtree maximum of free memory ([`MaxTree`]) to skip subtrees where no node has enough.
//!
//! Invariant: after [`ShapeTree::set`] for every changed node, `win[1]` is exactly the node a
//! full scan in tie-rank order would keep (first strictly better wins), so decisions are the
//! same as scoring every node.

/// Node score: compared lexicographically, higher is better.
pub(super) type Score = [i64; 2];

/// One node's standing for one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Leaf {
    /// Free CPU, GPUs, model and pod count admit the shape (memory is checked per pod).
    pub feasible: bool,
    /// The policy's score (meaningful only when feasible).
    pub score: Score,
}

impl Leaf {
    /// A node that cannot take the shape.
    pub(crate) const NONE: Leaf = Leaf {
        feasible: false,
        score: [0, 0],
    };

    /// Whether `self` beats `o` when `o` comes first in tie order.
    fn beats(&self, o: &Leaf) -> bool {
        self.feasible && (!o.feasible || self.score > o.score)
    }
}

/// Tournament tree over tie-rank positions for one shape.
pub(super) struct ShapeTree {
    /// Leaves by position (positions past the last node stay infeasible).
    leaves: Vec<Leaf>,
    /// `win[i]`: winning position in the subtree of entry `i` (entries `cap..2 cap` are the
    /// leaves themselves; entry 0 is unused).
    win: Vec<u32>,
    cap: usize,
    /// Length of the engine's change log that the leaves reflect; `None` before the first build.
    pub cursor: Option<usize>,
}

impl ShapeTree {
    /// An empty tree for `n` positions; every leaf infeasible until set.
    pub(crate) fn new(n: usize) -> ShapeTree {
        let cap = n.next_power_of_two().max(1);
        let mut win = vec![0u32; 2 * cap];
        for p in 0..cap {
            win[cap + p] = p as u32;
        }
        ShapeTree {
            leaves: vec![Leaf::NONE; cap],
            win,
            cap,
            cursor: None,
        }
    }

    fn pick(&self, a: u32, b: u32) -> u32 {
        if self.leaves[b as usize].beats(&self.leaves[a as usize]) {
            b
        } else {
            a
        }
    }

    /// Replaces every leaf and rebuilds the matches bottom-up.
    pub(crate) fn rebuild(&mut self, mut leaf: impl FnMut(usize) -> Leaf, n: usize) {
        for p in 0..self.cap {
            self.leaves[p] = if p < n { leaf(p) } else { Leaf::NONE };
        }
        for i in (1..self.cap).rev() {
            self.win[i] = self.pick(self.win[2 * i], self.win[2 * i + 1]);
        }
    }

    /// Sets the leaf at `pos` and replays the matches on its path to the root.
    pub(crate) fn set(&mut self, pos: usize, leaf: Leaf) {
        if self.leaves[pos] == leaf {
            return;
        }
        self.leaves[pos] = leaf;
        let p = pos as u32;
        let mut i = (self.cap + pos) / 2;
        while i >= 1 {
            let old = self.win[i];
            let new = self.pick(self.win[2 * i], self.win[2 * i + 1]);
            self.win[i] = new;
            // Above an unchanged winner other than `pos`, every match sees the same values.
            if new == old && new != p {
                break;
            }
            i /= 2;
        }
    }

    /// The best position whose node has at least `need` free memory, if any is feasible.
    pub(crate) fn best(&self, mem: &MaxTree, need: u64) -> Option<usize> {
        let w = self.win[1];
        if !self.leaves[w as usize].feasible {
            return None;
        }
        if mem.at(w as usize) >= need {
            return Some(w as usize);
        }
        let mut found = None;
        self.search(1, mem, need, &mut found);
        found.map(|p| p as usize)
    }

    /// Depth-first, lower positions first: anything found earlier precedes every position
    /// visited later, so a later subtree can only take over with a strictly better score.
    fn search(&self, i: usize, mem: &MaxTree, need: u64, found: &mut Option<u32>) {
        let w = self.win[i];
        let lw = &self.leaves[w as usize];
        // The subtree's winner is its best leaf: if it is infeasible, all are.
        if !lw.feasible || mem.max[i] < need {
            return;
        }
        if let Some(f) = *found
            && !lw.beats(&self.leaves[f as usize])
        {
            return;
        }
        if mem.at(w as usize) >= need {
            *found = Some(w);
            return;
        }
        if i >= self.cap {
            return;
        }
        self.search(2 * i, mem, need, found);
        self.search(2 * i + 1, mem, need, found);
    }
}

/// Maximum of a per-position value over every subtree (the nodes' free memory), laid out like
/// [`ShapeTree`].
pub(super) struct MaxTree {
    max: Vec<u64>,
    cap: usize,
}

impl MaxTree {
    /// `values[p]` at position `p`; positions past the end hold 0.
    pub(crate) fn new(values: &[u64]) -> MaxTree {
        let cap = values.len().next_power_of_two().max(1);
        let mut max = vec![0u64; 2 * cap];
        max[cap..cap + values.len()].copy_from_slice(values);
        for i in (1..cap).rev() {
            max[i] = max[2 * i].max(max[2 * i + 1]);
        }
        MaxTree { max, cap }
    }

    /// The value at position `p`.
    pub(crate) fn at(&self, p: usize) -> u64 {
        self.max[self.cap + p]
    }

    /// Sets the value at position `p`.
    pub(crate) fn set(&mut self, p: usize, v: u64) {
        let mut i = self.cap + p;
        self.max[i] = v;
        i /= 2;
        while i >= 1 {
            self.max[i] = self.max[2 * i].max(self.max[2 * i + 1]);
            i /= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(s: i64) -> Leaf {
        Leaf {
            feasible: true,
            score: [s, 0],
        }
    }

    /// The reference: a scan in position order keeping the first strictly better feasible
    /// leaf with enough memory.
    fn scan(leaves: &[Leaf], mem: &[u64], need: u64) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (p, l) in leaves.iter().enumerate() {
            if !l.feasible || mem[p] < need {
                continue;
            }
            if best.is_none_or(|b| l.score > leaves[b].score) {
                best = Some(p);
            }
        }
        best
    }

    #[test]
    fn matches_a_full_scan_under_updates() {
        // A small deterministic generator: no rand dependency in the assertion path.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for n in [1usize, 2, 3, 7, 64, 100] {
            let mut leaves: Vec<Leaf> = (0..n)
                .map(|_| {
                    if next(5) == 0 {
                        Leaf::NONE
                    } else {
                        leaf(next(6) as i64)
                    }
                })
                .collect();
            let mut mem: Vec<u64> = (0..n).map(|_| next(10)).collect();
            let mut t = ShapeTree::new(n);
            t.rebuild(|p| leaves[p], n);
            let mut m = MaxTree::new(&mem);
            for _ in 0..300 {
                let p = next(n as u64) as usize;
                leaves[p] = if next(4) == 0 {
                    Leaf::NONE
                } else {
                    leaf(next(6) as i64)
                };
                mem[p] = next(10);
                t.set(p, leaves[p]);
                m.set(p, mem[p]);
                let need = next(11);
                assert_eq!(
                    t.best(&m, need),
                    scan(&leaves, &mem, need),
                    "n={n} need={need}"
                );
            }
        }
    }
}
