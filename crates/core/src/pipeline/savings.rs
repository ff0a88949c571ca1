//! What each VM and container saves: per-process KSM figures grouped by
//! cgroup, with the number of lines (and of Prometheus label sets) bounded.
//!
//! ## The algorithm
//! 1. Every process's cgroup path is cut to the configured depth
//!    ([`cgroup_at_depth`]): at depth 2,
//!    `/machine.slice/machine-qemu-1.scope/vcpu0` becomes
//!    `/machine.slice/machine-qemu-1.scope`, so a VM's or a container's
//!    sub-cgroups fold into the unit an operator knows, and the number of
//!    distinct groups cannot grow with what runs inside them.
//! 2. Processes with the same cut path are summed into one
//!    [`CgroupSavings`] line.
//! 3. Lines are ranked, most bytes saved first ([`rank`]); the first N are
//!    kept and the rest are summed into one [`Rest`] entry (`other`). The
//!    same ranking keeps the top N processes.
//!
//! ## Invariants
//! - Conservation: the kept lines plus the rest add up to the total of
//!   every process, for each figure, and count every process once.
//! - At most N lines are kept, and every kept line ranks at or above
//!   every line summed into the rest.
//! - The order is total (ties go by key), so the same figures always give
//!   the same lines.
//! - A cut path is `/` or starts with `/`, has at most `depth` components
//!   and is a prefix of the original path at a component boundary; cutting
//!   is idempotent, and cutting at depth d after depth e > d is cutting at d.
//!
//! What the figures mean is the caller's business (the daemon's: merged
//! pages and the profit the kernel reports per process, COW breaks it
//! counted per region); this module only adds them up.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::AddAssign;

/// Figures that add up across processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Savings {
    /// Pages mapped to KSM pages or to the zero page by merging.
    pub merged_pages: u64,
    /// Bytes saved. Signed: the kernel's profit of a process subtracts the
    /// metadata KSM keeps for every page it looked at, and can be negative.
    pub saved_bytes: i64,
    /// Copy-on-write breaks of merged pages.
    pub cow_breaks: u64,
}

impl AddAssign for Savings {
    fn add_assign(&mut self, o: Savings) {
        self.merged_pages = self.merged_pages.saturating_add(o.merged_pages);
        self.saved_bytes = self.saved_bytes.saturating_add(o.saved_bytes);
        self.cow_breaks = self.cow_breaks.saturating_add(o.cow_breaks);
    }
}

impl Savings {
    /// Ranking: most saved first, then most merged, then most COW breaks.
    fn rank_cmp(&self, o: &Savings) -> Ordering {
        o.saved_bytes
            .cmp(&self.saved_bytes)
            .then(o.merged_pages.cmp(&self.merged_pages))
            .then(o.cow_breaks.cmp(&self.cow_breaks))
    }
}

/// One process's figures, with what it is grouped by.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSavings {
    /// Its pid.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Its cgroup path (in a [`Breakdown`], cut to its depth).
    pub cgroup: String,
    /// Its figures.
    #[serde(flatten)]
    pub savings: Savings,
}

/// One cgroup's processes, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupSavings {
    /// The cgroup path, cut to the breakdown's depth.
    pub cgroup: String,
    /// Processes summed into it.
    pub processes: u64,
    /// Their figures, summed.
    #[serde(flatten)]
    pub savings: Savings,
}

/// A line of a breakdown: what ranks it, what it sums, and what breaks
/// ties between lines that save the same.
pub trait Line {
    /// Processes the line stands for.
    fn processes(&self) -> u64;
    /// Its figures.
    fn savings(&self) -> Savings;
    /// The order between two lines with the same figures.
    fn tie(&self, other: &Self) -> Ordering;
}

impl Line for CgroupSavings {
    fn processes(&self) -> u64 {
        self.processes
    }
    fn savings(&self) -> Savings {
        self.savings
    }
    fn tie(&self, o: &Self) -> Ordering {
        self.cgroup.cmp(&o.cgroup)
    }
}

impl Line for ProcessSavings {
    fn processes(&self) -> u64 {
        1
    }
    fn savings(&self) -> Savings {
        self.savings
    }
    fn tie(&self, o: &Self) -> Ordering {
        (self.pid, &self.comm, &self.cgroup).cmp(&(o.pid, &o.comm, &o.cgroup))
    }
}

/// The lines beyond the top N, summed into one (`other`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rest {
    /// Lines summed.
    pub entries: u64,
    /// Processes in them.
    pub processes: u64,
    /// Their figures, summed.
    #[serde(flatten)]
    pub savings: Savings,
}

/// The top N lines and the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ranked<L> {
    /// At most N lines, most saved first.
    pub top: Vec<L>,
    /// The other lines summed, if there were more than N.
    pub rest: Option<Rest>,
}

impl<L> Default for Ranked<L> {
    fn default() -> Self {
        Ranked {
            top: Vec::new(),
            rest: None,
        }
    }
}

/// How many lines to keep, and how deep cgroups go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Components of a cgroup path kept (0: everything is `/`).
    pub cgroup_depth: usize,
    /// cgroups listed; the rest are summed.
    pub top_cgroups: usize,
    /// Processes listed; the rest are summed.
    pub top_processes: usize,
}

/// Savings per cgroup and per process, bounded by [`Limits`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breakdown {
    /// The depth cgroup paths were cut to.
    pub cgroup_depth: usize,
    /// Per cgroup (cut to the depth).
    pub cgroups: Ranked<CgroupSavings>,
    /// Per process, with their cut cgroup.
    pub processes: Ranked<ProcessSavings>,
    /// Every process, summed.
    pub total: Savings,
}

/// `path` cut to its first `depth` components: `/a/b/c` at depth 2 is
/// `/a/b`; `/` and paths with fewer components stay as they are. Empty
/// components (`//`, a trailing `/`) are dropped.
pub fn cgroup_at_depth(path: &str, depth: usize) -> String {
    let mut out = String::with_capacity(path.len());
    for part in path.split('/').filter(|p| !p.is_empty()).take(depth) {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Ranks `lines` (most saved first, ties by [`Line::tie`]) and keeps the
/// first `n`, summing the others into the rest.
pub fn rank<L: Line>(mut lines: Vec<L>, n: usize) -> Ranked<L> {
    lines.sort_by(|a, b| a.savings().rank_cmp(&b.savings()).then(a.tie(b)));
    let rest = (lines.len() > n).then(|| {
        let mut rest = Rest::default();
        for l in lines.drain(n..) {
            rest.entries += 1;
            rest.processes += l.processes();
            rest.savings += l.savings();
        }
        rest
    });
    Ranked { top: lines, rest }
}

/// Groups `processes` by cgroup (cut to `limits.cgroup_depth`) and keeps
/// the top cgroups and processes (see the module header).
pub fn breakdown(processes: &[ProcessSavings], limits: Limits) -> Breakdown {
    let mut total = Savings::default();
    let mut groups: BTreeMap<String, CgroupSavings> = BTreeMap::new();
    let mut lines = Vec::with_capacity(processes.len());
    for p in processes {
        total += p.savings;
        let cgroup = cgroup_at_depth(&p.cgroup, limits.cgroup_depth);
        let g = groups
            .entry(cgroup.clone())
            .or_insert_with(|| CgroupSavings {
                cgroup: cgroup.clone(),
                ..CgroupSavings::default()
            });
        g.processes += 1;
        g.savings += p.savings;
        lines.push(ProcessSavings {
            cgroup,
            ..p.clone()
        });
    }
    Breakdown {
        cgroup_depth: limits.cgroup_depth,
        cgroups: rank(groups.into_values().collect(), limits.top_cgroups),
        processes: rank(lines, limits.top_processes),
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(pid: u32, cgroup: &str, merged: u64, saved: i64, cow: u64) -> ProcessSavings {
        ProcessSavings {
            pid,
            comm: format!("p{pid}"),
            cgroup: cgroup.into(),
            savings: Savings {
                merged_pages: merged,
                saved_bytes: saved,
                cow_breaks: cow,
            },
        }
    }

    fn limits(cgroup_depth: usize, top_cgroups: usize, top_processes: usize) -> Limits {
        Limits {
            cgroup_depth,
            top_cgroups,
            top_processes,
        }
    }

    #[test]
    fn paths_are_cut_at_component_boundaries() {
        let vm = "/machine.slice/machine-qemu\\x2d1.scope/libvirt/emulator";
        assert_eq!(cgroup_at_depth(vm, 0), "/");
        assert_eq!(cgroup_at_depth(vm, 1), "/machine.slice");
        assert_eq!(
            cgroup_at_depth(vm, 2),
            "/machine.slice/machine-qemu\\x2d1.scope"
        );
        assert_eq!(cgroup_at_depth(vm, 9), vm);
        assert_eq!(cgroup_at_depth("/", 3), "/");
        assert_eq!(cgroup_at_depth("", 3), "/");
        assert_eq!(cgroup_at_depth("/a//b/", 5), "/a/b");
    }

    #[test]
    fn two_vms_are_two_lines_and_their_sub_cgroups_fold_in() {
        let procs = [
            p(10, "/machine.slice/vm1.scope/emulator", 1000, 4_000_000, 3),
            p(11, "/machine.slice/vm1.scope/vcpu0", 24, 90_000, 0),
            p(20, "/machine.slice/vm2.scope", 500, 2_000_000, 7),
            p(30, "/system.slice/sshd.service", 0, -640, 0),
        ];
        let b = breakdown(&procs, limits(2, 2, 1));
        let names: Vec<&str> = b.cgroups.top.iter().map(|r| r.cgroup.as_str()).collect();
        assert_eq!(
            names,
            ["/machine.slice/vm1.scope", "/machine.slice/vm2.scope"]
        );
        assert_eq!(b.cgroups.top[0].processes, 2);
        assert_eq!(b.cgroups.top[0].savings.merged_pages, 1024);
        assert_eq!(b.cgroups.top[0].savings.cow_breaks, 3);
        let rest = b.cgroups.rest.as_ref().unwrap();
        assert_eq!((rest.entries, rest.processes), (1, 1));
        assert_eq!(rest.savings.saved_bytes, -640);
        // The top process carries its cut cgroup; the three others are
        // summed.
        assert_eq!(b.processes.top.len(), 1);
        assert_eq!(b.processes.top[0].pid, 10);
        assert_eq!(b.processes.top[0].cgroup, "/machine.slice/vm1.scope");
        assert_eq!(b.processes.rest.as_ref().unwrap().entries, 3);
        assert_eq!(b.total.merged_pages, 1524);
    }

    #[test]
    fn nothing_is_summed_when_everything_fits() {
        let b = breakdown(&[p(1, "/a", 1, 1, 0)], limits(1, 5, 5));
        assert!(b.cgroups.rest.is_none() && b.processes.rest.is_none());
        let empty = breakdown(&[], limits(1, 0, 0));
        assert_eq!(
            empty,
            Breakdown {
                cgroup_depth: 1,
                ..Breakdown::default()
            }
        );
    }

    #[test]
    fn ties_go_by_name_so_the_lines_are_stable() {
        let procs = [p(2, "/b", 5, 5, 0), p(1, "/a", 5, 5, 0)];
        let b = breakdown(&procs, limits(1, 1, 1));
        assert_eq!(b.cgroups.top[0].cgroup, "/a");
        assert_eq!(b.processes.top[0].pid, 1);
        let swapped = breakdown(&[procs[1].clone(), procs[0].clone()], limits(1, 1, 1));
        assert_eq!(b, swapped);
    }

    fn arb_process() -> impl Strategy<Value = ProcessSavings> {
        (
            0u32..50,
            prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d"]), 0..5),
            0u64..1 << 20,
            -(1i64 << 30)..1 << 40,
            0u64..1000,
        )
            .prop_map(|(pid, parts, merged, saved, cow)| {
                p(pid, &format!("/{}", parts.join("/")), merged, saved, cow)
            })
    }

    /// Processes and figures of a ranking's kept lines and rest.
    fn sum<L: Line>(r: &Ranked<L>) -> (u64, Savings) {
        let mut n = r.rest.as_ref().map_or(0, |x| x.processes);
        let mut s = r.rest.as_ref().map_or(Savings::default(), |x| x.savings);
        for l in &r.top {
            n += l.processes();
            s += l.savings();
        }
        (n, s)
    }

    /// What a ranking must be, given every line (`all`, ranked with no
    /// limit) and its limit `n`.
    fn check_ranked<L: Line + PartialEq + std::fmt::Debug>(
        r: &Ranked<L>,
        all: &Ranked<L>,
        n: usize,
        processes: u64,
        total: Savings,
    ) -> Result<(), TestCaseError> {
        // Conservation: every process counted once, every figure summed.
        prop_assert_eq!(sum(r), (processes, total));
        // At most n kept, and they are the first n of the whole ranking,
        // so every kept line ranks at or above every summed one.
        prop_assert!(r.top.len() <= n);
        prop_assert_eq!(&all.top[..r.top.len()], &r.top[..]);
        for w in all.top.windows(2) {
            prop_assert!(
                w[0].savings()
                    .rank_cmp(&w[1].savings())
                    .then(w[0].tie(&w[1]))
                    != Ordering::Greater
            );
        }
        // A rest exactly when lines were left over, with their count.
        let left = all.top.len().saturating_sub(n) as u64;
        prop_assert_eq!(
            r.rest.as_ref().map(|x| x.entries),
            (left > 0).then_some(left)
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn breakdowns_conserve_bound_and_rank(
            procs in prop::collection::vec(arb_process(), 0..40),
            depth in 0usize..4,
            top_c in 0usize..6,
            top_p in 0usize..6,
        ) {
            let b = breakdown(&procs, limits(depth, top_c, top_p));
            let all = breakdown(&procs, limits(depth, usize::MAX, usize::MAX));
            let mut total = Savings::default();
            for q in &procs {
                total += q.savings;
            }
            prop_assert_eq!(b.total, total);
            let n = procs.len() as u64;
            check_ranked(&b.cgroups, &all.cgroups, top_c, n, total)?;
            check_ranked(&b.processes, &all.processes, top_p, n, total)?;
            // Cut paths are at most `depth` components deep, and distinct.
            let mut seen = std::collections::BTreeSet::new();
            for r in &all.cgroups.top {
                prop_assert!(r.cgroup.starts_with('/'));
                prop_assert!(r.cgroup.split('/').filter(|s| !s.is_empty()).count() <= depth);
                prop_assert!(seen.insert(r.cgroup.clone()));
            }
        }

        #[test]
        fn cutting_is_a_prefix_idempotent_and_composes(
            parts in prop::collection::vec("[a-z.]{1,4}", 0..6),
            d in 0usize..7,
            e in 0usize..7,
        ) {
            let path = format!("/{}", parts.join("/"));
            let cut = cgroup_at_depth(&path, d);
            let below = path.starts_with(&format!("{}/", cut));
            prop_assert!(path == cut || cut == "/" || below);
            prop_assert_eq!(cgroup_at_depth(&cut, d), cut.clone());
            let (lo, hi) = (d.min(e), d.max(e));
            prop_assert_eq!(cgroup_at_depth(&cgroup_at_depth(&path, hi), lo), cgroup_at_depth(&path, lo));
        }
    }
}
