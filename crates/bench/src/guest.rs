//! Guests for the VM-boot experiment (UKSM FAST '18 §8.2.1, scaled to this
//! machine): QEMU under TCG booting Debian's kernel with a busybox
//! initramfs that this module builds from Debian's packages.
//!
//! ## What a guest is
//!
//! The paper boots 25 VMs "each with a single VCPU and 512MB of memory in
//! parallel, with starting time of 10 seconds apart" (§8.2.1). Here a guest
//! is one `qemu-system-x86_64 -accel tcg` (KVM hangs on this machine) with
//! one vCPU and [`DEFAULT_MEM_MIB`] of RAM that boots:
//!
//! - **the kernel**: the newest `/boot/vmlinuz-*` (package
//!   `linux-image-amd64`). What the initramfs itself needs must be built
//!   in; [`HostTools::find`] checks the kernel's `/boot/config-*` for that
//!   ([`host`]). The drivers for the disk (virtio-pci, virtio-blk, ext4)
//!   are modules on Debian: the initramfs carries them ([`disk`]).
//! - **the initramfs** ([`GuestImage::build`], [`image`]): an uncompressed
//!   cpio (newc) archive holding `/bin/busybox` from `busybox-static` with
//!   its applet links, a `/dev/console` node, an `/init` script, and the
//!   disk's modules.
//! - **the payload**: a fixed, sorted selection of the host's `/usr/lib`
//!   and `/usr/share` files (tens of MiB, the same for every guest of a
//!   run), by default on an ext2 **disk image** ([`disk::DiskImage`]) of
//!   which every guest gets its own copy as a virtio disk
//!   (`-drive file=COPY,if=virtio,format=raw,cache=writeback,aio=threads`);
//!   or, with [`ImageOptions::initramfs`], inside the initramfs.
//!
//! `/init` mounts proc, sysfs and devtmpfs; with a disk it loads the
//! modules, mounts `/dev/vda` read-only and reads every file (md5sum),
//! copies the files into a fresh tmpfs and checks the copy, runs the same
//! programs as every guest (gzip of a tar of the disk into tmpfs, sort of
//! the file list), prints [`READY_MARKER`] with the files' checksum on the
//! serial console and idles. Without a disk it copies the initramfs
//! payload into tmpfs and checks it the same way. Every guest therefore
//! ends up holding the same kernel, the same page cache of the same files
//! and the same tmpfs files: real duplicate page cache and anonymous
//! memory across guests (and, page cache against tmpfs, within one), as in
//! the paper's boot of identical Ubuntu images; the host's page cache
//! holds each guest's disk copy once more.
//!
//! ## Lifecycle
//!
//! [`Guest::start`] spawns QEMU with its serial console written to a file
//! in the image's directory; [`Guest::poll_ready`] / [`Guest::wait_ready`]
//! watch that file for the marker (and for the guest's own failure line,
//! and for QEMU exiting). A [`Guest`] is a guard: dropping it SIGKILLs and
//! reaps QEMU. So that an *interrupted* harness leaves no guest behind
//! either, QEMU is started through util-linux's `setpriv --pdeathsig KILL`
//! (the kernel SIGKILLs it when the thread that started it dies, however it
//! dies) and in its own process group (a terminal's Ctrl-C reaches the
//! harness only, which then tears the guests down in order).
//!
//! `mem-merge` ([`GuestOptions::mem_merge`]) is QEMU's `-machine
//! mem-merge=on|off`: on (QEMU's default) QEMU marks guest RAM
//! `MADV_MERGEABLE` itself, as a KSM user does; off leaves the choice to
//! pagesift.

pub mod disk;
pub mod host;
#[macro_use]
pub mod image;
pub mod numa;
pub mod vm;

pub use disk::{DiskImage, KernelModules};
pub use host::HostTools;
pub use image::{GuestImage, ImageOptions, PayloadOn};
pub use vm::{Guest, GuestOptions};

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Guest RAM, MiB: the paper's VMs had 512 MB each (§8.2.1).
pub const DEFAULT_MEM_MIB: u32 = 512;

/// Guests started 10 s apart, as in the paper (§8.2.1).
pub const START_INTERVAL: Duration = Duration::from_secs(10);

/// Guests of `pagesift bench --quick`. Measured here (2026-11-22, 2 cores
/// shared, load 2-10; `measure_guests_started_ten_seconds_apart` in
/// tests/guest.rs): a guest of 512 MiB with the default 32 MiB payload
/// boots in 5.8-8.5 s of QEMU CPU (6-10 s wall when the machine is
/// quiet), then holds ~345 MiB of RSS and idles at ~0.35 % of a core. Four
/// guests 10 s apart are all up ~45 s after the first start, in ~1.4 GiB.
pub const QUICK_GUESTS: usize = 4;

/// Guests of `pagesift bench --full`: 10 guests, ~3.4 GiB of RSS, far
/// inside this machine's 24 GiB (25 like the paper would take ~8.5 GiB and
/// ~260 s of starts).
pub const FULL_GUESTS: usize = 10;

/// A booted guest prints this line (followed by ` files=... kib=...
/// uptime=...`, and ` disk-md5=...` with a disk) on its serial console
/// when it has read its payload.
pub const READY_MARKER: &str = "pagesift-guest: ready";

/// A guest whose `/init` failed prints this, then the reason, and powers
/// off.
pub const FAILED_MARKER: &str = "pagesift-guest: failed:";

/// The whole lines of a serial log read while the guest may still be
/// writing to it: everything up to its last newline. A line without its
/// newline yet is left for the next look (a full test suite once read
/// `read-done start=3.29 stop=3.5`, the rest of the line on its way).
pub fn whole_lines(log: &str) -> &str {
    log.rfind('\n').map_or("", |end| &log[..end])
}

/// Everything that can go wrong building or running a guest; each names
/// what is missing or what happened.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A program or file the guests need is not installed.
    #[error("{what} not found: run scripts/setup (it installs Debian's {package})")]
    Missing {
        /// What was looked for, and where.
        what: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// Installed, but not usable as it is.
    #[error("{0}")]
    Unsuitable(String),
    /// A bad [`GuestOptions`] or [`ImageOptions`] value.
    #[error("bad guest option {key}: {reason}")]
    BadOption {
        /// The option.
        key: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The guest's `/init` reported a failure on its console.
    #[error("guest {name} failed: {reason} (serial log {})", log.display())]
    Failed {
        /// The guest.
        name: String,
        /// Its `/init`'s reason.
        reason: String,
        /// Its serial log.
        log: PathBuf,
    },
    /// QEMU exited before the guest was ready.
    #[error("guest {name}: QEMU exited ({status}) before the guest was ready; {tail}")]
    Exited {
        /// The guest.
        name: String,
        /// QEMU's exit status.
        status: std::process::ExitStatus,
        /// The end of QEMU's stderr and of the serial log.
        tail: String,
    },
    /// No ready marker within the timeout.
    #[error("guest {name} printed no ready marker within {timeout:?}; {tail}")]
    Timeout {
        /// The guest.
        name: String,
        /// How long was waited.
        timeout: Duration,
        /// The end of the serial log.
        tail: String,
    },
}

impl GuestError {
    fn io(context: impl Into<String>, source: io::Error) -> GuestError {
        GuestError::Io {
            context: context.into(),
            source,
        }
    }
}
