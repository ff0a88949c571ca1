//! cgroup v2 directories made for one test, and workloads started inside
//! them. Removed on drop, deepest first, with anything still inside moved
//! back to the root cgroup first.

use crate::binaries::workload_bin;
use crate::observe::cgroup_of;
use crate::workload::Workload;
use std::path::PathBuf;
use std::process::Command;

/// cgroup v2 directories made for one test below the v2 mount
/// (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host), all
/// under one parent named after the test and its pid. Dropping the guard
/// (also when the test panics) moves any process still in them to the root
/// cgroup and removes them, deepest first. Declare it before the workloads
/// it holds, so that they are killed and reaped first.
pub struct TestCgroups {
    mount: PathBuf,
    /// The parent's path as `/proc/PID/cgroup` shows it.
    parent: String,
    /// Paths made, in creation order (the parent first).
    made: Vec<String>,
}

impl TestCgroups {
    /// Makes the parent cgroup `/<name>-<pid>`; panics without cgroup v2.
    pub fn new(name: &str) -> TestCgroups {
        let mount = pagesift_linux::proc::cgroup2_mount()
            .expect("this test needs cgroup v2 (no cgroup2 mount in /proc/self/mountinfo)");
        let mut c = TestCgroups {
            mount: PathBuf::from(mount),
            parent: format!("/{name}-{}", std::process::id()),
            made: Vec::new(),
        };
        let parent = c.parent.clone();
        c.make(&parent);
        c
    }

    fn make(&mut self, path: &str) {
        let dir = self.dir(path);
        // A directory left by a killed run of this test is reused.
        if !dir.is_dir() {
            std::fs::create_dir(&dir)
                .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        }
        self.made.push(path.to_string());
    }

    /// Makes `REL` (`a/vm`: each component in turn) below the parent and
    /// returns its path as `/proc/PID/cgroup` shows it.
    pub fn create(&mut self, rel: &str) -> String {
        let mut path = self.parent.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            path = format!("{path}/{part}");
            if !self.made.contains(&path) {
                self.make(&path);
            }
        }
        path
    }

    /// The directory of cgroup `path`.
    pub fn dir(&self, path: &str) -> PathBuf {
        self.mount.join(path.trim_start_matches('/'))
    }

    /// The parent's path, as `/proc/PID/cgroup` shows it.
    pub fn parent(&self) -> &str {
        &self.parent
    }

    /// Starts `pagesift-workload ARGS` inside cgroup `path` (a shell moves
    /// itself there, then execs the workload, so its memory is its own
    /// from the start).
    pub fn spawn(&self, path: &str, args: &[&str]) -> Workload {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("echo $$ > \"$1/cgroup.procs\" && shift && exec \"$@\"")
            .arg("sh")
            .arg(self.dir(path))
            .arg(workload_bin())
            .args(args);
        let w = Workload::spawn(cmd, args);
        assert_eq!(cgroup_of(w.pid()), path, "workload {} not moved", w.pid());
        w
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        let root_procs = self.mount.join("cgroup.procs");
        for path in self.made.iter().rev() {
            let dir = self.dir(path);
            let t0 = std::time::Instant::now();
            loop {
                // Anything still inside (the test panicked before its
                // workloads dropped) goes back to the root cgroup.
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = std::fs::write(&root_procs, pid);
                }
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    // EBUSY while an exiting task is still being released.
                    Err(e) if t0.elapsed() > std::time::Duration::from_secs(10) => {
                        eprintln!("could not remove cgroup {}: {e}", dir.display());
                        break;
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
                }
            }
        }
    }
}
