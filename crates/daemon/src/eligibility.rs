//! Which processes pagesift may merge: the operator's allow and deny lists.
//!
//! ## The rule
//! A process is eligible when
//! 1. it is not pagesift itself (by pid, and by executable: another
//!    pagesift instance is not merged either, unless `--pid` names it,
//!    which is how `pagesift demo` has its own workload processes, run
//!    from the pagesift binary, merged);
//! 2. it matches the allow side: `--pid` lists when given (then they alone
//!    decide), else `[eligible] all = true`, else every *kind* of
//!    `[eligible]` that has entries (cgroups AND uids AND exes AND comms,
//!    any entry of a kind); with no entry at all nothing is eligible;
//! 3. it matches no entry of `[ineligible]`, of any kind;
//! 4. names are not trust: when the allow side names processes only by
//!    name (`[eligible]` has `exes` and/or `comms` but no `uids` and no
//!    `cgroups`), the process must run as root (effective uid 0). Any
//!    local user can take a command name (`PR_SET_NAME`) or run an
//!    eligible executable, and would otherwise put their memory in the
//!    trust set, with the side channel merging opens (README, Security).
//!    To admit other users' processes, list their uids in
//!    `[eligible] uids` (kinds combine with AND, so `comms` and `uids`
//!    together admit exactly those uids), or select by cgroup, which only
//!    root arranges. `--pid` and `all = true` are explicit and not
//!    narrowed.
//!
//! Deny wins over allow. The allow side's cgroups, uids and comms are also
//! handed to discovery ([`Policy::process_filter`]) so that processes that
//! can never be eligible are not even opened; executables and the deny lists
//! are checked here on what discovery reports.
//!
//! Matching is pure (no I/O), so it is tested without root.

use crate::config::{Config, Selector};
use pagesift_linux::ProcessFilter;
use std::path::{Path, PathBuf};

/// What eligibility looks at for one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    /// pid.
    pub pid: u32,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// Effective uid.
    pub uid: u32,
    /// Its cgroup in every hierarchy.
    pub cgroups: Vec<String>,
    /// `/proc/PID/exe`, if readable.
    pub exe: Option<PathBuf>,
}

/// The eligibility rule of one configuration (see the module header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    all: bool,
    allow: Selector,
    deny: Selector,
    pids: Vec<u32>,
    own_pid: u32,
    own_exe: Option<PathBuf>,
}

impl Policy {
    /// The rule of `config`, narrowed to `pids` when not empty.
    pub fn new(config: &Config, pids: &[u32], own_pid: u32, own_exe: Option<PathBuf>) -> Policy {
        Policy {
            all: config.eligible.all,
            allow: config.eligible.selector(),
            deny: config.ineligible.clone(),
            pids: pids.to_vec(),
            own_pid,
            own_exe,
        }
    }

    /// Whether no process can ever be eligible (nothing was allowed).
    pub fn allows_nothing(&self) -> bool {
        self.pids.is_empty() && !self.all && self.allow.is_empty()
    }

    /// The discovery filter: the allow side's kinds that discovery can check
    /// itself (everything else is checked by [`Policy::judge`]).
    pub fn process_filter(&self) -> ProcessFilter {
        if !self.pids.is_empty() {
            return ProcessFilter::pids(self.pids.iter().copied());
        }
        if self.all {
            return ProcessFilter::all();
        }
        if self.allow.is_empty() {
            // Nothing is eligible, so discover nothing: no process has uid
            // (uid_t)-1, which the kernel reserves to mean "no uid".
            return ProcessFilter {
                uids: vec![u32::MAX],
                ..ProcessFilter::default()
            };
        }
        ProcessFilter {
            pids: Vec::new(),
            comms: self.allow.comms.clone(),
            uids: self.allow.uids.clone(),
            cgroups: self.allow.cgroups.clone(),
        }
    }

    /// `Ok` if `p` is eligible; otherwise why not, naming the config key.
    pub fn judge(&self, p: &ProcessFacts) -> Result<(), String> {
        if p.pid == self.own_pid {
            return Err("pagesift itself".into());
        }
        if let (Some(own), Some(exe)) = (&self.own_exe, &p.exe)
            && own == exe
            && !self.pids.contains(&p.pid)
        {
            return Err("another pagesift process".into());
        }
        if !self.pids.is_empty() {
            if !self.pids.contains(&p.pid) {
                return Err("not named by --pid".into());
            }
        } else if !self.all {
            if self.allow.is_empty() {
                return Err("nothing is eligible: [eligible] is empty".into());
            }
            if let Some(kind) = first_unmatched_kind(&self.allow, p) {
                return Err(format!("not matched by eligible.{kind}"));
            }
        }
        if let Some(kind) = first_matched_kind(&self.deny, p) {
            return Err(format!("excluded by ineligible.{kind}"));
        }
        if self.pids.is_empty() && !self.all && self.names_only() && p.uid != 0 {
            return Err(format!(
                "{UNTRUSTED} {}: eligible.comms and eligible.exes alone admit only root's \
                 processes (anyone can take a name); list the uid in eligible.uids to admit it",
                p.uid
            ));
        }
        Ok(())
    }

    /// Whether the allow side selects by name only (`exes`, `comms`), with
    /// nothing that says who may be merged (`uids`, `cgroups`).
    fn names_only(&self) -> bool {
        self.allow.uids.is_empty()
            && self.allow.cgroups.is_empty()
            && !(self.allow.exes.is_empty() && self.allow.comms.is_empty())
    }
}

/// How [`Policy::judge`]'s reason starts when a process matched the allow
/// side by name only and does not run as root (rule 4 of the module
/// header).
pub const UNTRUSTED: &str = "untrusted uid";

/// Whether a refusal is worth listing in status: the process was a
/// candidate (it matched the allow side) but something keeps it out.
/// Processes that were never candidates are not news.
pub fn refusal_is_news(reason: &str) -> bool {
    reason.starts_with("excluded") || reason.starts_with(UNTRUSTED) || reason.contains("pagesift")
}

/// The first kind with entries that `p` does not match (allow lists: AND).
fn first_unmatched_kind(s: &Selector, p: &ProcessFacts) -> Option<&'static str> {
    if !s.cgroups.is_empty() && !s.cgroups.iter().any(|c| in_cgroup(c, &p.cgroups)) {
        return Some("cgroups");
    }
    if !s.uids.is_empty() && !s.uids.contains(&p.uid) {
        return Some("uids");
    }
    if !s.exes.is_empty() && !s.exes.iter().any(|e| exe_matches(e, p.exe.as_deref())) {
        return Some("exes");
    }
    if !s.comms.is_empty() && !s.comms.contains(&p.comm) {
        return Some("comms");
    }
    None
}

/// The first kind one of whose entries `p` matches (deny lists: OR).
fn first_matched_kind(s: &Selector, p: &ProcessFacts) -> Option<&'static str> {
    if s.cgroups.iter().any(|c| in_cgroup(c, &p.cgroups)) {
        return Some("cgroups");
    }
    if s.uids.contains(&p.uid) {
        return Some("uids");
    }
    if s.exes.iter().any(|e| exe_matches(e, p.exe.as_deref())) {
        return Some("exes");
    }
    if s.comms.contains(&p.comm) {
        return Some("comms");
    }
    None
}

/// Whether one of `have` (cgroup paths) is `want` or below it. `want` may
/// carry the `/sys/fs/cgroup` prefix; `/` contains everything.
pub fn in_cgroup(want: &str, have: &[String]) -> bool {
    let want = want.strip_prefix("/sys/fs/cgroup").unwrap_or(want);
    let want = want.trim_end_matches('/');
    have.iter().any(|h| {
        want.is_empty() || h == want || h.strip_prefix(want).is_some_and(|r| r.starts_with('/'))
    })
}

/// Whether executable `exe` is `want`, or below `want` when it ends in `/`.
/// An unknown executable matches nothing.
pub fn exe_matches(want: &Path, exe: Option<&Path>) -> bool {
    let Some(exe) = exe else { return false };
    let w = want.as_os_str().as_encoded_bytes();
    if w.ends_with(b"/") {
        exe.starts_with(want)
    } else {
        exe == want
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn facts(pid: u32, comm: &str, uid: u32, cgroup: &str, exe: &str) -> ProcessFacts {
        ProcessFacts {
            pid,
            comm: comm.into(),
            uid,
            cgroups: vec![cgroup.into()],
            exe: Some(exe.into()),
        }
    }

    fn policy(text: &str, pids: &[u32]) -> Policy {
        let c = Config::from_toml(text, "t").unwrap();
        Policy::new(&c, pids, 1, Some("/usr/sbin/pagesift".into()))
    }

    #[test]
    fn the_default_config_makes_nothing_eligible() {
        let p = policy("", &[]);
        assert!(p.allows_nothing());
        // Nor is anything even discovered.
        assert_eq!(p.process_filter().uids, vec![u32::MAX]);
        let listed = pagesift_linux::discover::list_processes(&p.process_filter()).unwrap();
        assert!(listed.is_empty(), "{listed:?}");
        let e = p
            .judge(&facts(10, "qemu", 0, "/", "/usr/bin/qemu"))
            .unwrap_err();
        assert!(e.contains("[eligible] is empty"), "{e}");
    }

    #[test]
    fn pagesift_never_merges_itself() {
        let p = policy("[eligible]\nall = true\n", &[]);
        assert!(p.judge(&facts(1, "x", 0, "/", "/bin/x")).is_err());
        let e = p
            .judge(&facts(7, "pagesift", 0, "/", "/usr/sbin/pagesift"))
            .unwrap_err();
        assert!(e.contains("pagesift"), "{e}");
        assert!(p.judge(&facts(7, "x", 0, "/", "/bin/x")).is_ok());
        // Named by --pid, another pagesift process may be merged (the
        // demo's workloads run from the pagesift binary); itself never.
        let named = policy("", &[1, 7]);
        assert!(
            named
                .judge(&facts(7, "pagesift", 0, "/", "/usr/sbin/pagesift"))
                .is_ok()
        );
        assert!(
            named
                .judge(&facts(8, "pagesift", 0, "/", "/usr/sbin/pagesift"))
                .is_err()
        );
        assert!(named.judge(&facts(1, "x", 0, "/", "/bin/x")).is_err());
    }

    #[test]
    fn allow_kinds_combine_with_and_entries_with_or() {
        let p = policy(
            "[eligible]\ncgroups = [\"/machine.slice\"]\ncomms = [\"qemu\", \"kvm\"]\n",
            &[],
        );
        assert!(
            p.judge(&facts(5, "kvm", 0, "/machine.slice/vm1.scope", "/x"))
                .is_ok()
        );
        let e = p
            .judge(&facts(5, "bash", 0, "/machine.slice/vm1.scope", "/x"))
            .unwrap_err();
        assert_eq!(e, "not matched by eligible.comms");
        let e = p
            .judge(&facts(5, "qemu", 0, "/user.slice", "/x"))
            .unwrap_err();
        assert_eq!(e, "not matched by eligible.cgroups");
    }

    #[test]
    fn deny_wins_and_any_kind_denies() {
        let p = policy(
            "[eligible]\nall = true\n[ineligible]\nuids = [0]\nexes = [\"/opt/secret/\"]\n",
            &[],
        );
        assert_eq!(
            p.judge(&facts(5, "a", 0, "/", "/bin/a")).unwrap_err(),
            "excluded by ineligible.uids"
        );
        assert_eq!(
            p.judge(&facts(5, "a", 1000, "/", "/opt/secret/vault"))
                .unwrap_err(),
            "excluded by ineligible.exes"
        );
        assert!(p.judge(&facts(5, "a", 1000, "/", "/opt/secretive")).is_ok());
    }

    #[test]
    fn pids_decide_alone_but_deny_still_applies() {
        let p = policy("[ineligible]\ncomms = [\"sshd\"]\n", &[42]);
        assert!(!p.allows_nothing());
        assert!(p.judge(&facts(42, "w", 0, "/", "/w")).is_ok());
        assert!(p.judge(&facts(43, "w", 0, "/", "/w")).is_err());
        assert!(p.judge(&facts(42, "sshd", 0, "/", "/w")).is_err());
        assert_eq!(p.process_filter().pids, vec![42]);
    }

    #[test]
    fn discovery_filter_carries_what_discovery_can_check() {
        let p = policy(
            "[eligible]\nuids = [1000]\nexes = [\"/usr/bin/\"]\ncomms = [\"a\"]\n",
            &[],
        );
        let f = p.process_filter();
        assert_eq!(f.uids, vec![1000]);
        assert_eq!(f.comms, vec!["a".to_string()]);
        assert!(f.pids.is_empty() && f.cgroups.is_empty());
    }

    #[test]
    fn cgroup_and_exe_matching() {
        let have = vec!["/system.slice/a.service".to_string()];
        assert!(in_cgroup("/system.slice", &have));
        assert!(in_cgroup("/sys/fs/cgroup/system.slice/", &have));
        assert!(!in_cgroup("/system.slic", &have));
        assert!(in_cgroup("/", &have));
        assert!(exe_matches(
            Path::new("/usr/bin/"),
            Some(Path::new("/usr/bin/qemu"))
        ));
        assert!(!exe_matches(
            Path::new("/usr/bin"),
            Some(Path::new("/usr/bin/qemu"))
        ));
        assert!(!exe_matches(Path::new("/usr/bin/"), None));
    }

    #[test]
    fn names_alone_admit_only_root() {
        for text in [
            "[eligible]\ncomms = [\"wl\"]\n",
            "[eligible]\nexes = [\"/usr/bin/wl\"]\n",
            "[eligible]\ncomms = [\"wl\"]\nexes = [\"/usr/bin/wl\"]\n",
        ] {
            let p = policy(text, &[]);
            assert!(
                p.judge(&facts(5, "wl", 0, "/", "/usr/bin/wl")).is_ok(),
                "{text}"
            );
            let e = p
                .judge(&facts(6, "wl", 65534, "/", "/usr/bin/wl"))
                .unwrap_err();
            assert!(e.starts_with("untrusted uid 65534"), "{e}");
            assert!(e.contains("eligible.uids"), "{e}");
            assert!(refusal_is_news(&e));
        }
        // uids alongside say who: exactly those uids, root included only
        // if listed.
        let p = policy("[eligible]\ncomms = [\"wl\"]\nuids = [1000]\n", &[]);
        assert!(p.judge(&facts(6, "wl", 1000, "/", "/usr/bin/wl")).is_ok());
        assert_eq!(
            p.judge(&facts(6, "wl", 0, "/", "/usr/bin/wl")).unwrap_err(),
            "not matched by eligible.uids"
        );
        // A cgroup is arranged by root: it says who, too.
        let p = policy(
            "[eligible]\ncomms = [\"wl\"]\ncgroups = [\"/machine.slice\"]\n",
            &[],
        );
        assert!(
            p.judge(&facts(6, "wl", 65534, "/machine.slice/a", "/w"))
                .is_ok()
        );
        // --pid and all = true are explicit.
        let p = policy("[eligible]\ncomms = [\"wl\"]\n", &[6]);
        assert!(p.judge(&facts(6, "wl", 65534, "/", "/w")).is_ok());
        let p = policy("[eligible]\nall = true\n", &[]);
        assert!(p.judge(&facts(6, "wl", 65534, "/", "/w")).is_ok());
        // Deny still names itself first.
        let p = policy(
            "[eligible]\ncomms = [\"wl\"]\n[ineligible]\nuids = [65534]\n",
            &[],
        );
        assert_eq!(
            p.judge(&facts(6, "wl", 65534, "/", "/w")).unwrap_err(),
            "excluded by ineligible.uids"
        );
        // Processes that never matched are not news.
        assert!(!refusal_is_news("not matched by eligible.comms"));
    }

    proptest! {
        /// Adding a deny entry never makes a process eligible, and a process
        /// that matches any deny entry is never eligible.
        #[test]
        fn deny_is_monotone(uid in 0u32..5, deny_uid in 0u32..5, comm in "[a-c]", deny_comm in "[a-c]") {
            let base = policy("[eligible]\nall = true\n", &[]);
            let denied = policy(
                &format!("[eligible]\nall = true\n[ineligible]\nuids = [{deny_uid}]\ncomms = [\"{deny_comm}\"]\n"),
                &[],
            );
            let f = facts(9, &comm, uid, "/", "/bin/x");
            let ok = denied.judge(&f).is_ok();
            prop_assert!(!ok || base.judge(&f).is_ok());
            prop_assert_eq!(ok, uid != deny_uid && comm != deny_comm);
        }
    }
}
