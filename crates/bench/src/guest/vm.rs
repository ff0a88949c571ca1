//! One running guest: QEMU under TCG, its serial log, and the guard that
//! kills it.
//!
//! QEMU's command line, and why:
//!
//! ```text
//! setpriv --pdeathsig KILL --        die with the thread that started us
//! qemu-system-x86_64 -name pagesift-<name>
//!   -accel tcg                       KVM hangs on this machine
//!   -machine pc,mem-merge=on|off     QEMU's own MADV_MERGEABLE on guest RAM
//!   -m <mem_mib> -smp 1              the paper's single-vCPU VMs (§8.2.1)
//!   -nodefaults -no-user-config      no NIC, VGA, monitor or config files
//!   -display none -no-reboot         a guest that reboots or panics exits
//!   -serial file:<dir>/<name>.serial
//!   -kernel <vmlinuz> -initrd <initramfs.cpio>
//!   -append "console=ttyS0 panic=-1 no_timer_check"
//!   -drive file=<dir>/<name>.disk,if=virtio,format=raw,cache=writeback,aio=threads
//!                                    with a disk image: the guest's own copy
//! ```
//!
//! The copy is made when the guest starts and removed when it is dropped.
//!
//! With [`GuestOptions::input_port`] the guest also gets a second serial
//! port (its `/dev/ttyS1`) on a Unix socket QEMU listens on,
//! `<dir>/<name>.input` (`-chardev socket,server=on,wait=off` and
//! `-serial chardev:input`), for lines from the harness
//! ([`Guest::send_line`]): a guest's `/init` can wait there for the moment
//! the harness chooses, and for what to do then.
//!
//! QEMU's stderr goes to `<dir>/<name>.qemu.log`. Readiness is polled from
//! the serial log (the whole log is re-read: it stays a few tens of KiB).
//! The guest's RAM is found once in `/proc/PID/maps` as the anonymous
//! read-write, not executable (TCG's code buffer is rwx) mapping of
//! exactly `mem_mib` MiB and remembered, so a later
//! split of that VMA (pagesift marking part of it mergeable) does not lose
//! it.

use super::{FAILED_MARKER, GuestError, GuestImage, READY_MARKER};
use std::fs;
use std::io::Write;
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often [`Guest::wait_ready`] looks at the serial log.
const POLL: Duration = Duration::from_millis(50);

/// How much of a log an error quotes.
const TAIL_LINES: usize = 12;

/// How to run one guest.
#[derive(Clone, Debug)]
pub struct GuestOptions {
    /// Its name: letters, digits, `-` and `_`; names its log files, so it
    /// must be unique among the guests of one image directory.
    pub name: String,
    /// Guest RAM, MiB.
    pub mem_mib: u32,
    /// QEMU's `mem-merge`: guest RAM made `MADV_MERGEABLE` by QEMU itself.
    pub mem_merge: bool,
    /// A second serial port (`/dev/ttyS1`) the harness writes lines to
    /// (see the module header).
    pub input_port: bool,
}

impl GuestOptions {
    /// A guest of [`super::DEFAULT_MEM_MIB`].
    pub fn new(name: impl Into<String>, mem_merge: bool) -> GuestOptions {
        GuestOptions {
            name: name.into(),
            mem_mib: super::DEFAULT_MEM_MIB,
            mem_merge,
            input_port: false,
        }
    }

    fn check(&self) -> Result<(), GuestError> {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if self.name.is_empty() || !self.name.chars().all(plain) {
            return Err(GuestError::BadOption {
                key: "name",
                reason: format!("{:?}: use letters, digits, '-' and '_'", self.name),
            });
        }
        // Below ~128 MiB the payload's two copies do not fit; above 3 GiB
        // the pc machine splits RAM around the PCI hole (two mappings).
        if !(128..=3072).contains(&self.mem_mib) {
            return Err(GuestError::BadOption {
                key: "mem_mib",
                reason: format!("{} MiB: use 128..=3072", self.mem_mib),
            });
        }
        Ok(())
    }
}

/// A running guest; SIGKILLed and reaped on drop. QEMU also gets SIGKILL
/// from the kernel when the *thread* that called [`Guest::start`] ends
/// (`PR_SET_PDEATHSIG` semantics), so start guests from a thread that
/// outlives them (the harness's main thread).
#[derive(Debug)]
pub struct Guest {
    child: Child,
    opts: GuestOptions,
    serial: PathBuf,
    qemu_log: PathBuf,
    started: Instant,
    ready_after: Option<Duration>,
    ram: Option<Range<u64>>,
    disk: Option<PathBuf>,
    /// The checksum a guest that read every file of its disk prints.
    disk_md5: Option<String>,
    /// The input port's socket, and the connection to it once made.
    input: Option<(PathBuf, Option<UnixStream>)>,
}

impl Guest {
    /// Starts QEMU for `image` (see the module header); returns at once,
    /// before the guest boots.
    pub fn start(image: &GuestImage, opts: GuestOptions) -> Result<Guest, GuestError> {
        opts.check()?;
        let serial = image.dir().join(format!("{}.serial", opts.name));
        let qemu_log = image.dir().join(format!("{}.qemu.log", opts.name));
        // A stale log of an earlier guest of this name must not look ready.
        match fs::remove_file(&serial) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(GuestError::io(format!("removing {}", serial.display()), e));
            }
            _ => {}
        }
        let stderr = fs::File::create(&qemu_log)
            .map_err(|e| GuestError::io(format!("creating {}", qemu_log.display()), e))?;
        let input = image.dir().join(format!("{}.input", opts.name));
        if opts.input_port {
            match fs::remove_file(&input) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(GuestError::io(format!("removing {}", input.display()), e));
                }
                _ => {}
            }
        }
        let disk = image.disk().map(|d| d.copy_for(&opts.name)).transpose()?;
        let tools = image.tools();
        let merge = if opts.mem_merge { "on" } else { "off" };
        let mut cmd = Command::new(&tools.setpriv);
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(&tools.qemu)
            .args(["-name", &format!("pagesift-{}", opts.name)])
            .args(["-accel", "tcg"])
            .args(["-machine", &format!("pc,mem-merge={merge}")])
            .args(["-m", &opts.mem_mib.to_string(), "-smp", "1"])
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            .arg("-no-reboot")
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-kernel")
            .arg(image.kernel())
            .arg("-initrd")
            .arg(image.initramfs())
            // no_timer_check: on a loaded host the TCG guest's IO-APIC
            // timer check can time out and panic the boot (seen here while
            // two guests booted beside a compile).
            .args(["-append", "console=ttyS0 panic=-1 no_timer_check"]);
        if opts.input_port {
            cmd.arg("-chardev")
                .arg(format!(
                    "socket,id=input,path={},server=on,wait=off",
                    input.display()
                ))
                .args(["-serial", "chardev:input"]);
        }
        if let Some(d) = &disk {
            cmd.arg("-drive").arg(format!(
                "file={},if=virtio,format=raw,cache=writeback,aio=threads",
                d.display()
            ));
        }
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                if let Some(d) = &disk {
                    let _ = fs::remove_file(d);
                }
                return Err(GuestError::io(
                    format!("starting {}", tools.setpriv.display()),
                    e,
                ));
            }
        };
        Ok(Guest {
            child,
            serial,
            qemu_log,
            started: Instant::now(),
            ready_after: None,
            ram: None,
            disk,
            disk_md5: image
                .disk()
                .filter(|_| !image.custom_init())
                .map(|d| d.checksum().to_string()),
            input: opts.input_port.then_some((input, None)),
            opts,
        })
    }

    /// QEMU's pid (what `pagesift run --pid` takes).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.opts.name
    }

    /// Its options.
    pub fn options(&self) -> &GuestOptions {
        &self.opts
    }

    /// Guest RAM, MiB.
    pub fn mem_mib(&self) -> u32 {
        self.opts.mem_mib
    }

    /// This guest's copy of the disk image, if it has one.
    pub fn disk(&self) -> Option<&Path> {
        self.disk.as_deref()
    }

    /// The serial console's log file.
    pub fn serial_log(&self) -> &Path {
        &self.serial
    }

    /// When QEMU was started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// From start to the ready marker, once seen.
    pub fn boot_time(&self) -> Option<Duration> {
        self.ready_after
    }

    /// Whether the guest has printed its ready marker (checked now);
    /// an error if its `/init` failed or QEMU exited.
    pub fn poll_ready(&mut self) -> Result<bool, GuestError> {
        if self.ready_after.is_some() {
            return Ok(true);
        }
        let elapsed = self.started.elapsed();
        let text = fs::read_to_string(&self.serial).unwrap_or_default();
        // Its disk-md5 must not be read half written.
        let log = super::whole_lines(&text);
        if let Some(line) = log.lines().find(|l| l.starts_with(READY_MARKER)) {
            // A guest with a disk proves it read every file of it.
            if let Some(want) = &self.disk_md5 {
                let got = line
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix("disk-md5="));
                if got != Some(want.as_str()) {
                    return Err(GuestError::Failed {
                        name: self.opts.name.clone(),
                        reason: format!(
                            "it read disk-md5={}, the host's files give {want}",
                            got.unwrap_or("(none)")
                        ),
                        log: self.serial.clone(),
                    });
                }
            }
            self.ready_after = Some(elapsed);
            // QEMU mapped guest RAM long before the guest printed anything.
            let _ = self.ram();
            return Ok(true);
        }
        if let Some(reason) = log.lines().find_map(|l| l.strip_prefix(FAILED_MARKER)) {
            return Err(GuestError::Failed {
                name: self.opts.name.clone(),
                reason: reason.trim().to_string(),
                log: self.serial.clone(),
            });
        }
        match self.child.try_wait() {
            Ok(Some(status)) => Err(GuestError::Exited {
                name: self.opts.name.clone(),
                status,
                tail: self.tails(),
            }),
            Ok(None) => Ok(false),
            Err(e) => Err(GuestError::io(
                format!("waiting for QEMU {}", self.pid()),
                e,
            )),
        }
    }

    /// Waits up to `timeout` (from now) for the ready marker; returns the
    /// boot time (from [`start`](Self::start)).
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration, GuestError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.poll_ready()? {
                return Ok(self.ready_after.expect("set when ready"));
            }
            if Instant::now() >= deadline {
                return Err(GuestError::Timeout {
                    name: self.opts.name.clone(),
                    timeout,
                    tail: self.tails(),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Whether QEMU is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// QEMU's resident set, KiB (`VmRSS`).
    pub fn rss_kib(&self) -> Result<u64, GuestError> {
        procfs::process::Process::new(self.pid() as i32)
            .and_then(|p| p.status())
            .map(|s| s.vmrss.unwrap_or(0))
            .map_err(|e| {
                GuestError::io(
                    format!("reading /proc/{}/status", self.pid()),
                    std::io::Error::other(e),
                )
            })
    }

    /// The address range of guest RAM in QEMU (see the module header).
    pub fn ram(&mut self) -> Result<Range<u64>, GuestError> {
        if let Some(r) = &self.ram {
            return Ok(r.clone());
        }
        let want = u64::from(self.opts.mem_mib) << 20;
        let maps = procfs::process::Process::new(self.pid() as i32)
            .and_then(|p| p.maps())
            .map_err(|e| {
                GuestError::io(
                    format!("reading /proc/{}/maps", self.pid()),
                    std::io::Error::other(e),
                )
            })?;
        let found: Vec<Range<u64>> = maps
            .iter()
            .filter(|m| {
                m.pathname == procfs::process::MMapPath::Anonymous
                    && m.perms.contains(procfs::process::MMPermissions::READ)
                    && m.perms.contains(procfs::process::MMPermissions::WRITE)
                    // TCG's code buffer (1 GiB by default) is rwx.
                    && !m.perms.contains(procfs::process::MMPermissions::EXECUTE)
                    && m.address.1 - m.address.0 == want
            })
            .map(|m| m.address.0..m.address.1)
            .collect();
        match found.as_slice() {
            [r] => {
                self.ram = Some(r.clone());
                Ok(r.clone())
            }
            _ => Err(GuestError::Unsuitable(format!(
                "guest {}: {} anonymous read-write mappings of {} MiB in QEMU {} (want one)",
                self.opts.name,
                found.len(),
                self.opts.mem_mib,
                self.pid()
            ))),
        }
    }

    /// Writes `line` and a newline to the guest's input port (its
    /// `/dev/ttyS1`; [`GuestOptions::input_port`]), connecting to QEMU's
    /// socket on first use and keeping the connection for the guest's
    /// lifetime (QEMU passes bytes on as the guest's UART takes them).
    pub fn send_line(&mut self, line: &str) -> Result<(), GuestError> {
        let name = self.opts.name.clone();
        let Some((path, conn)) = self.input.as_mut() else {
            return Err(GuestError::BadOption {
                key: "input_port",
                reason: format!("guest {name} was started without an input port"),
            });
        };
        if conn.is_none() {
            let c = UnixStream::connect(&*path)
                .map_err(|e| GuestError::io(format!("connecting to {}", path.display()), e))?;
            *conn = Some(c);
        }
        let c = conn.as_mut().expect("connected above");
        c.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| c.flush())
            .map_err(|e| GuestError::io(format!("writing to {}", path.display()), e))
    }

    /// SIGKILLs QEMU and reaps it.
    pub fn stop(mut self) -> Result<(), GuestError> {
        self.kill_and_reap()
    }

    fn kill_and_reap(&mut self) -> Result<(), GuestError> {
        // An exited-and-reaped child makes kill() a no-op Ok.
        let _ = self.child.kill();
        let reaped = self
            .child
            .wait()
            .map(|_| ())
            .map_err(|e| GuestError::io(format!("reaping QEMU {}", self.pid()), e));
        // QEMU is gone: its disk copy and input socket go too.
        if let Some(d) = self.disk.take() {
            let _ = fs::remove_file(d);
        }
        if let Some((path, _)) = self.input.take() {
            let _ = fs::remove_file(path);
        }
        reaped
    }

    /// The last lines of QEMU's stderr and of the serial log.
    fn tails(&self) -> String {
        format!(
            "{} ends with:\n{}\n{} ends with:\n{}",
            self.qemu_log.display(),
            tail(&self.qemu_log),
            self.serial.display(),
            tail(&self.serial)
        )
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.kill_and_reap();
    }
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_bad_names_and_sizes() {
        GuestOptions::new("vm-1_a", true).check().unwrap();
        for bad in ["", "a b", "../x", "a,b"] {
            let err = GuestOptions::new(bad, true).check().unwrap_err();
            assert!(err.to_string().contains("bad guest option name"), "{err}");
        }
        let mut o = GuestOptions::new("vm", false);
        o.mem_mib = 64;
        assert!(o.check().unwrap_err().to_string().contains("mem_mib"));
        o.mem_mib = 4096;
        assert!(o.check().is_err());
    }
}
