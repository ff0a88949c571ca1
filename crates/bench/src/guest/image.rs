//! The guest image: Debian's kernel plus an initramfs built here, and,
//! where the payload goes on a disk ([`PayloadOn::Disk`], the default), a
//! disk image ([`super::disk`]).
//!
//! The initramfs is an uncompressed cpio "newc" archive (the format the
//! kernel unpacks into its rootfs; written with the `cpio` crate), laid out
//! as:
//!
//! ```text
//! bin/busybox            busybox-static's binary
//! bin/sh, usr/bin/md5sum, ...   its applet links (`busybox --list-full`)
//! dev/console            char 5:1, init's stdin/stdout before devtmpfs
//! init                   INIT_SCRIPT, or DISK_INIT_SCRIPT with a disk
//! proc/ sys/ data/ disk/ mount points
//! payload/usr/lib/...    initramfs payload: host files, same paths as on the host
//! lib/modules/pagesift/NN-name.ko   disk payload: the modules to read it, in load order
//! ```
//!
//! With the payload on a disk, each guest gets its own copy of the image
//! as a virtio disk; its `/init` loads the modules, mounts the disk read-
//! only, reads every file (`md5sum`, through the guest's page cache),
//! copies the tree into tmpfs and checks the copy, and runs the same
//! programs as every other guest (an archive of the disk compressed into
//! tmpfs, a sort of the file list by hash), then prints the checksum of the files
//! it read ([`super::disk::DiskImage::checksum`] on the host).
//!
//! **Payload selection** ([`select_payload`]): each root (by default
//! `/usr/lib` then `/usr/share`: shared libraries and data, a realistic
//! mix of binary and text) gets an equal share of the byte budget, filled
//! by a depth-first walk in sorted name order with regular files (never
//! symlinks) of [`MIN_FILE_BYTES`]..=[`MAX_FILE_BYTES`] whose paths are
//! plain (no spaces or shell metacharacters, so the guest's `find | xargs`
//! needs no quoting). The same host gives the same payload; every guest of
//! a run boots the same archive.
//!
//! Everything has mtime 0 and uid/gid 0, so the archive depends only on
//! the inputs' contents.

use super::disk::{DISK_MODULES, DiskImage, KernelModules, OPTIONAL_DISK_MODULES};
use super::{GuestError, HostTools};
use std::collections::BTreeSet;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Smallest payload file: below a page every file costs a page of guest
/// page cache anyway, and tiny files only add per-file work under TCG.
pub const MIN_FILE_BYTES: u64 = 4096;

/// Largest payload file: a few big files would crowd out the variety.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Default payload: "tens of MiB", so that a guest's copies of it (rootfs
/// and tmpfs) dominate what it holds, inside [`super::DEFAULT_MEM_MIB`].
pub const DEFAULT_PAYLOAD_BYTES: u64 = 32 << 20;

/// The start of every guest `/init`: PATH, `fail` (print the failure
/// marker and power off), and the pseudo file systems and tmpfs `/data`.
macro_rules! init_prelude {
    () => {
        r#"#!/bin/sh
# /init of a pagesift-bench guest (crates/bench/src/guest/image.rs).
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
fail() {
    echo "pagesift-guest: failed: $*"
    reboot -f
    while :; do sleep 1; done
}
mount -t proc proc /proc || fail "mounting /proc"
mount -t sysfs sysfs /sys || fail "mounting /sys"
mount -t devtmpfs devtmpfs /dev || fail "mounting devtmpfs on /dev"
mount -t tmpfs -o mode=0755 data /data || fail "mounting a tmpfs on /data"
"#
    };
}

/// Loads the disk's modules and mounts `/dev/vda` (ext2) read-only on
/// `/disk`.
macro_rules! disk_mount {
    () => {
        r#"echo "pagesift-guest: init at $(cut -d' ' -f1 /proc/uptime) s; loading modules"
for m in /lib/modules/pagesift/*.ko; do
    [ -e "$m" ] || continue
    insmod "$m" || fail "insmod $m"
done
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1))
    [ $i -le 600 ] || fail "no /dev/vda after 60 s"
    sleep 0.1
done
mount -t ext2 -o ro /dev/vda /disk || fail "mounting /dev/vda (ext2) on /disk"
"#
    };
}

/// `bin` stripped into `dir` (a tenth of the size, and TCG unpacks the
/// initramfs slowly; copied as it is where `strip` fails) and the payload
/// that runs it in a guest: the shared libraries `ldd` names (the loader
/// included) and the stripped copy, each at its host path. An `/init`
/// copies `/payload/.` to `/` and makes the files executable (the
/// initramfs stores payload files 0644). Returns the copy's path.
pub fn program_payload(bin: &Path, dir: &Path) -> Result<(PathBuf, Vec<PayloadFile>), GuestError> {
    let name = bin.file_name().unwrap_or_else(|| "program".as_ref());
    let stripped = dir.join(name);
    let ok = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(bin)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        fs::copy(bin, &stripped)
            .map_err(|e| GuestError::io(format!("copying {}", bin.display()), e))?;
    }
    let mut payload = Vec::new();
    for p in shared_libraries(bin)?.into_iter().chain([stripped.clone()]) {
        let bytes = fs::metadata(&p)
            .map_err(|e| GuestError::io(format!("reading {}", p.display()), e))?
            .len();
        payload.push(PayloadFile { source: p, bytes });
    }
    Ok((stripped, payload))
}

/// The shared libraries `ldd` names for `bin` (the loader included).
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>, GuestError> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(|e| GuestError::io(format!("running ldd {}", bin.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// A disk guest's `/init` made of the common start (pseudo file systems,
/// modules, `/dev/vda` mounted read-only on `/disk`) and `body`, a shell
/// script that must print [`super::READY_MARKER`] and never exit. Its ready
/// line is not checked against the disk's checksum.
pub fn disk_init_with(body: &str) -> String {
    format!("{}{}{}", init_prelude!(), disk_mount!(), body)
}

/// The guest's `/init`. It must never exit (PID 1 exiting panics the
/// kernel); on failure it prints [`super::FAILED_MARKER`] and powers off,
/// which ends QEMU (`-no-reboot`).
pub const INIT_SCRIPT: &str = concat!(
    init_prelude!(),
    r#"echo "pagesift-guest: init at $(cut -d' ' -f1 /proc/uptime) s; copying the payload into tmpfs"
cp -a /payload/. /data/ || fail "copying /payload into the tmpfs /data"
(cd /payload && find . -type f | sort | xargs md5sum) > /payload.md5 || fail "reading /payload"
(cd /data && find . -type f | sort | xargs md5sum) > /data.md5 || fail "reading /data"
cmp -s /payload.md5 /data.md5 || fail "the tmpfs copy differs from /payload"
echo "pagesift-guest: ready files=$(wc -l < /data.md5) kib=$(du -sk /data | cut -f1) uptime=$(cut -d' ' -f1 /proc/uptime)"
while :; do sleep 3600; done
"#
);

/// The guest's `/init` when the payload is on a disk (`/dev/vda`, ext2).
/// It loads the modules the initramfs carries, reads every file of the
/// disk, copies them into tmpfs, runs the same programs as every guest,
/// prints the ready line with `disk-md5=` (md5 of the sorted `md5sum`
/// list, as [`super::disk::tree_checksum`] computes on the host) and idles.
pub const DISK_INIT_SCRIPT: &str = concat!(
    init_prelude!(),
    disk_mount!(),
    r#"echo "pagesift-guest: disk mounted at $(cut -d' ' -f1 /proc/uptime) s; reading it"
(cd /disk && find . -type f | sort | xargs md5sum) > /disk.md5 || fail "reading /disk"
sum=$(md5sum < /disk.md5 | cut -d' ' -f1)
cp -a /disk/. /data/ || fail "copying /disk into the tmpfs /data"
(cd /data && find . -type f | sort | xargs md5sum) > /data.md5 || fail "reading /data"
cmp -s /disk.md5 /data.md5 || fail "the tmpfs copy differs from /disk"
# The same programs in every guest.
tar -cf - -C /disk . | gzip -1 > /data/disk.tar.gz || fail "archiving /disk"
sort /disk.md5 > /data/by-hash || fail "sorting the file list"
echo "pagesift-guest: ready files=$(wc -l < /disk.md5) kib=$(du -sk /disk | cut -f1) disk-md5=$sum archive-kib=$(du -sk /data/disk.tar.gz | cut -f1) uptime=$(cut -d' ' -f1 /proc/uptime)"
while :; do sleep 3600; done
"#
);

/// Where the payload goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadOn {
    /// In the initramfs (`/payload`), copied into tmpfs by `/init`.
    Initramfs,
    /// On an ext2 disk image each guest reads from its own copy
    /// (virtio-blk), see [`super::disk`].
    Disk,
}

/// What goes into the payload.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    /// Byte budget, shared equally by the roots.
    pub payload_bytes: u64,
    /// Host directories to take files from, in order.
    pub payload_roots: Vec<PathBuf>,
    /// Initramfs or disk.
    pub payload_on: PayloadOn,
    /// With a disk: these files instead of a selection from
    /// `payload_roots` (each at its host path on the disk).
    pub files: Option<Vec<PayloadFile>>,
    /// With a disk: this `/init` instead of [`DISK_INIT_SCRIPT`] (see
    /// [`disk_init_with`]).
    pub init: Option<String>,
    /// With a disk: host files the initramfs carries as well, under
    /// `payload/` at their host paths (a program and its libraries, see
    /// [`program_payload`]), for an `/init` that runs them.
    pub initramfs_files: Vec<PayloadFile>,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            payload_bytes: DEFAULT_PAYLOAD_BYTES,
            payload_roots: vec!["/usr/lib".into(), "/usr/share".into()],
            payload_on: PayloadOn::Disk,
            files: None,
            init: None,
            initramfs_files: Vec::new(),
        }
    }
}

impl ImageOptions {
    /// The default payload in the initramfs (no disk, no modules).
    pub fn initramfs() -> ImageOptions {
        ImageOptions {
            payload_on: PayloadOn::Initramfs,
            ..ImageOptions::default()
        }
    }
}

/// One host file of the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadFile {
    /// Where it is on the host (absolute).
    pub source: PathBuf,
    /// Its size when selected.
    pub bytes: u64,
}

impl PayloadFile {
    /// Its path in the initramfs: `payload/` + the host path.
    pub fn archive_path(&self) -> String {
        let host = self.source.to_str().expect("payload paths are plain ASCII");
        format!("payload/{}", host.trim_start_matches('/'))
    }
}

/// A built guest image: the kernel to boot and the initramfs written into
/// a directory, which also receives the guests' serial logs.
#[derive(Clone, Debug)]
pub struct GuestImage {
    dir: PathBuf,
    initramfs: PathBuf,
    tools: HostTools,
    payload_files: usize,
    payload_bytes: u64,
    initramfs_bytes: u64,
    disk: Option<DiskImage>,
    modules: Vec<String>,
    custom_init: bool,
}

impl GuestImage {
    /// Finds the host tools ([`HostTools::find`]) and writes
    /// `dir/initramfs.cpio` and `dir/disk.ext2` with the default payload.
    pub fn build(dir: &Path) -> Result<GuestImage, GuestError> {
        GuestImage::build_with(dir, &ImageOptions::default())
    }

    /// [`build`](Self::build) with another payload.
    pub fn build_with(dir: &Path, opts: &ImageOptions) -> Result<GuestImage, GuestError> {
        let tools = HostTools::find()?;
        fs::create_dir_all(dir)
            .map_err(|e| GuestError::io(format!("creating {}", dir.display()), e))?;
        let applets = busybox_applets(&tools.busybox)?;
        let payload = match &opts.files {
            Some(files) => files.clone(),
            None => select_payload(&opts.payload_roots, opts.payload_bytes)?,
        };
        if payload.is_empty() {
            return Err(GuestError::BadOption {
                key: "payload_roots",
                reason: format!(
                    "no file of {MIN_FILE_BYTES}..={MAX_FILE_BYTES} bytes under {:?}",
                    opts.payload_roots
                ),
            });
        }
        let (content, disk) = match opts.payload_on {
            PayloadOn::Initramfs => (
                Content {
                    init: INIT_SCRIPT,
                    payload: &payload,
                    modules: KernelModules::default(),
                },
                None,
            ),
            PayloadOn::Disk => (
                Content {
                    init: opts.init.as_deref().unwrap_or(DISK_INIT_SCRIPT),
                    payload: &opts.initramfs_files,
                    modules: KernelModules::collect(
                        &tools.kernel_release,
                        DISK_MODULES,
                        OPTIONAL_DISK_MODULES,
                    )?,
                },
                Some(DiskImage::build(dir, &payload)?),
            ),
        };
        let initramfs = dir.join("initramfs.cpio");
        let tmp = dir.join("initramfs.cpio.tmp");
        let write = || -> io::Result<u64> {
            let out = BufWriter::new(fs::File::create(&tmp)?);
            let bytes = write_initramfs(out, &tools.busybox, &applets, &content)?;
            fs::rename(&tmp, &initramfs)?;
            Ok(bytes)
        };
        let initramfs_bytes =
            write().map_err(|e| GuestError::io(format!("writing {}", initramfs.display()), e))?;
        Ok(GuestImage {
            dir: dir.to_path_buf(),
            initramfs,
            tools,
            payload_files: payload.len(),
            payload_bytes: payload.iter().map(|f| f.bytes).sum(),
            initramfs_bytes,
            disk,
            modules: content
                .modules
                .modules
                .into_iter()
                .map(|(n, _)| n)
                .collect(),
            custom_init: opts.init.is_some(),
        })
    }

    /// The disk image every guest gets a copy of, when the payload is on a
    /// disk.
    pub fn disk(&self) -> Option<&DiskImage> {
        self.disk.as_ref()
    }

    /// Whether `/init` is the caller's ([`ImageOptions::init`]): its ready
    /// line carries no disk checksum.
    pub fn custom_init(&self) -> bool {
        self.custom_init
    }

    /// The kernel modules the initramfs carries, in load order.
    pub fn modules(&self) -> &[String] {
        &self.modules
    }

    /// The directory holding the initramfs and the guests' logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kernel the guests boot.
    pub fn kernel(&self) -> &Path {
        &self.tools.kernel
    }

    /// The initramfs.
    pub fn initramfs(&self) -> &Path {
        &self.initramfs
    }

    /// The host programs and files found.
    pub fn tools(&self) -> &HostTools {
        &self.tools
    }

    /// Files in the payload.
    pub fn payload_files(&self) -> usize {
        self.payload_files
    }

    /// Bytes in the payload.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    /// Size of the initramfs archive.
    pub fn initramfs_bytes(&self) -> u64 {
        self.initramfs_bytes
    }
}

/// busybox's applet paths (`busybox --list-full`: `usr/bin/md5sum`, ...),
/// without busybox itself.
fn busybox_applets(busybox: &Path) -> Result<Vec<String>, GuestError> {
    let out = Command::new(busybox)
        .arg("--list-full")
        .output()
        .map_err(|e| GuestError::io(format!("running {} --list-full", busybox.display()), e))?;
    if !out.status.success() {
        return Err(GuestError::Unsuitable(format!(
            "{} --list-full failed ({})",
            busybox.display(),
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty() && l != "bin/busybox")
        .collect())
}

/// A path the guest's shell pipeline handles without quoting.
fn plain_path(p: &Path) -> bool {
    p.to_str().is_some_and(|s| {
        s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"/._+-@".contains(&c))
    })
}

/// The payload: see the module header.
pub fn select_payload(roots: &[PathBuf], budget: u64) -> Result<Vec<PayloadFile>, GuestError> {
    let mut chosen: Vec<PayloadFile> = Vec::new();
    let mut seen = BTreeSet::new();
    let share = budget / roots.len().max(1) as u64;
    for root in roots {
        let mut left = share;
        walk_sorted(root, &mut |path, bytes| {
            if (MIN_FILE_BYTES..=MAX_FILE_BYTES).contains(&bytes)
                && bytes <= left
                && plain_path(path)
                && seen.insert(path.to_path_buf())
            {
                left -= bytes;
                chosen.push(PayloadFile {
                    source: path.to_path_buf(),
                    bytes,
                });
            }
            // Stop once the share cannot take even the smallest file.
            left >= MIN_FILE_BYTES
        })
        .map_err(|e| GuestError::io(format!("walking {}", root.display()), e))?;
    }
    Ok(chosen)
}

/// Depth-first walk of regular files under `dir` in sorted name order
/// (symlinks are not followed); `visit(path, size)` returns false to
/// stop. Unreadable subdirectories are skipped; an unreadable `dir` itself
/// is an error.
fn walk_sorted(dir: &Path, visit: &mut dyn FnMut(&Path, u64) -> bool) -> io::Result<bool> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Ok(meta) = e.path().symlink_metadata() else {
            continue;
        };
        let path = e.path();
        let go_on = if meta.is_dir() {
            walk_sorted(&path, visit).unwrap_or(true)
        } else if meta.is_file() {
            visit(&path, meta.len())
        } else {
            true
        };
        if !go_on {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What an initramfs holds besides busybox.
#[derive(Clone, Debug)]
pub struct Content<'a> {
    /// The `/init` script.
    pub init: &'a str,
    /// Host files under `payload/`.
    pub payload: &'a [PayloadFile],
    /// Modules under `lib/modules/pagesift/`, in load order.
    pub modules: KernelModules,
}

/// Writes the initramfs (see the module header) to `out`; returns its
/// size in bytes.
pub fn write_initramfs<W: Write>(
    out: W,
    busybox: &Path,
    applets: &[String],
    content: &Content,
) -> io::Result<u64> {
    let mut w = ArchiveWriter {
        out: CountingWriter { inner: out, n: 0 },
        ino: 0,
        dirs: BTreeSet::new(),
    };
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "data", "disk",
    ] {
        w.dir_all(d)?;
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    w.entry("dev/console", 0o020_600, (5, 1), &[])?;
    w.entry("bin/busybox", 0o100_755, (0, 0), &fs::read(busybox)?)?;
    for applet in applets {
        if let Some((parent, _)) = applet.rsplit_once('/') {
            w.dir_all(parent)?;
        }
        w.entry(applet, 0o120_777, (0, 0), b"/bin/busybox")?;
    }
    w.entry("init", 0o100_755, (0, 0), content.init.as_bytes())?;
    if !content.modules.modules.is_empty() {
        w.dir_all("lib/modules/pagesift")?;
    }
    for (i, (name, bytes)) in content.modules.modules.iter().enumerate() {
        // The number keeps the shell's sorted glob in load order.
        let path = format!("lib/modules/pagesift/{i:02}-{name}.ko");
        w.entry(&path, 0o100_644, (0, 0), bytes)?;
    }
    for f in content.payload {
        let path = f.archive_path();
        if let Some((parent, _)) = path.rsplit_once('/') {
            w.dir_all(parent)?;
        }
        // Read now: the size in the header must be the bytes written.
        w.entry(&path, 0o100_644, (0, 0), &fs::read(&f.source)?)?;
    }
    let mut out = cpio::newc::trailer(w.out)?;
    out.flush()?;
    Ok(out.n)
}

struct ArchiveWriter<W: Write> {
    out: CountingWriter<W>,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl<W: Write> ArchiveWriter<W> {
    /// One entry: `mode` includes the file type; `rdev` for device nodes;
    /// `data` is the content (the target, for a symlink).
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        self.ino += 1;
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file over 4 GiB"))?;
        let mut entry = cpio::newc::Builder::new(name)
            .ino(self.ino)
            .mode(mode)
            .nlink(if mode & 0o170_000 == 0o040_000 { 2 } else { 1 })
            .rdev_major(rdev.0)
            .rdev_minor(rdev.1)
            .write(&mut self.out, size);
        entry.write_all(data)?;
        entry.finish()?;
        Ok(())
    }

    /// `path` and its ancestors, each once, parents first.
    fn dir_all(&mut self, path: &str) -> io::Result<()> {
        let mut at = 0;
        while at < path.len() {
            let end = path[at..].find('/').map_or(path.len(), |i| at + i);
            let prefix = &path[..end];
            if self.dirs.insert(prefix.to_string()) {
                self.entry(prefix, 0o040_755, (0, 0), &[])?;
            }
            at = end + 1;
        }
        Ok(())
    }
}

/// Counts the bytes written through it.
struct CountingWriter<W: Write> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    /// One entry read back from an archive.
    #[derive(Debug, PartialEq)]
    struct ReadEntry {
        mode: u32,
        rdev: (u32, u32),
        data: Vec<u8>,
        /// Its position in the archive.
        at: usize,
    }

    /// Every entry of a newc archive, by name.
    fn read_archive(mut bytes: &[u8]) -> BTreeMap<String, ReadEntry> {
        let mut entries = BTreeMap::new();
        loop {
            let mut r = cpio::newc::Reader::new(bytes).unwrap();
            if r.entry().is_trailer() {
                return entries;
            }
            let e = r.entry().clone();
            let mut data = Vec::new();
            r.read_to_end(&mut data).unwrap();
            let read = ReadEntry {
                mode: e.mode(),
                rdev: (e.rdev_major(), e.rdev_minor()),
                data,
                at: entries.len(),
            };
            let prev = entries.insert(e.name().to_string(), read);
            assert!(prev.is_none(), "{} twice", e.name());
            bytes = r.finish().unwrap();
        }
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::create_dir_all(p.join("a/deep")).unwrap();
        fs::create_dir_all(p.join("b")).unwrap();
        fs::write(p.join("a/deep/one"), vec![1u8; 5000]).unwrap();
        fs::write(p.join("a/two"), vec![2u8; 9000]).unwrap();
        fs::write(p.join("a/tiny"), b"too small").unwrap();
        fs::write(p.join("a/with space"), vec![3u8; 5000]).unwrap();
        fs::write(p.join("b/three"), vec![4u8; 6000]).unwrap();
        fs::write(p.join("b/four"), vec![5u8; 7000]).unwrap();
        std::os::unix::fs::symlink(p.join("b/four"), p.join("b/link")).unwrap();
        d
    }

    #[test]
    fn payload_is_sorted_bounded_and_plain() {
        let d = tree();
        let roots = [d.path().join("a"), d.path().join("b")];
        let names = |v: Vec<PayloadFile>| -> Vec<String> {
            v.iter()
                .map(|f| {
                    f.source
                        .strip_prefix(d.path())
                        .unwrap()
                        .display()
                        .to_string()
                })
                .collect()
        };
        // Each root gets half; sorted walk; tiny, spaced and symlinked
        // files are never taken.
        let all = select_payload(&roots, 1 << 20).unwrap();
        assert_eq!(names(all), ["a/deep/one", "a/two", "b/four", "b/three"]);
        // 2 x 7000: a/deep/one fits, a/two does not; b/four fits.
        let some = select_payload(&roots, 14_000).unwrap();
        assert_eq!(names(some.clone()), ["a/deep/one", "b/four"]);
        assert_eq!(some.iter().map(|f| f.bytes).sum::<u64>(), 12_000);
        assert!(select_payload(&[d.path().join("missing")], 1 << 20).is_err());
    }

    #[test]
    fn initramfs_holds_busybox_links_console_init_and_payload() {
        let d = tree();
        let busybox = d.path().join("a/two"); // any file stands in
        let applets = vec!["bin/sh".to_string(), "usr/sbin/chroot".to_string()];
        let payload = select_payload(&[d.path().join("b")], 1 << 20).unwrap();
        let mut bytes = Vec::new();
        let content = Content {
            init: INIT_SCRIPT,
            payload: &payload,
            modules: KernelModules {
                modules: vec![
                    ("virtio".into(), b"first".to_vec()),
                    ("virtio_blk".into(), b"second".to_vec()),
                ],
            },
        };
        let n = write_initramfs(&mut bytes, &busybox, &applets, &content).unwrap();
        assert_eq!(n, bytes.len() as u64);
        let e = read_archive(&bytes);

        assert_eq!(e["bin/busybox"].data, vec![2u8; 9000]);
        assert_eq!(e["bin/busybox"].mode, 0o100_755);
        assert_eq!(e["bin/sh"].mode, 0o120_777);
        assert_eq!(e["bin/sh"].data, b"/bin/busybox");
        assert_eq!(e["usr/sbin/chroot"].mode, 0o120_777);
        assert_eq!(e["dev/console"].mode & 0o170_000, 0o020_000);
        assert_eq!(e["dev/console"].rdev, (5, 1));
        assert_eq!(e["init"].data, INIT_SCRIPT.as_bytes());
        assert_eq!(e["init"].mode, 0o100_755);
        assert_eq!(e["lib/modules/pagesift/00-virtio.ko"].data, b"first");
        assert_eq!(e["lib/modules/pagesift/01-virtio_blk.ko"].data, b"second");
        for dir in ["proc", "sys", "dev", "data", "disk", "usr", "usr/sbin"] {
            assert_eq!(e[dir].mode, 0o040_755, "{dir}");
        }
        for f in &payload {
            let path = f.archive_path();
            assert_eq!(e[&path].data, fs::read(&f.source).unwrap(), "{path}");
            assert_eq!(e[&path].mode, 0o100_644, "{path}");
        }
        // The kernel creates no missing parents: each directory entry must
        // come before everything under it.
        for (name, entry) in &e {
            if let Some((parent, _)) = name.rsplit_once('/') {
                assert_eq!(e[parent].mode, 0o040_755, "{parent}");
                assert!(e[parent].at < entry.at, "{parent} after {name}");
            }
        }
    }

    #[test]
    fn init_prints_the_markers_the_harness_waits_for() {
        for init in [INIT_SCRIPT, DISK_INIT_SCRIPT] {
            assert!(init.contains(&format!("echo \"{} files=", super::super::READY_MARKER)));
            assert!(init.contains(&format!("echo \"{} $*\"", super::super::FAILED_MARKER)));
            assert!(init.starts_with("#!/bin/sh\n"));
        }
        assert!(DISK_INIT_SCRIPT.contains("disk-md5=$sum"));
        assert!(DISK_INIT_SCRIPT.contains("/dev/vda"));
    }
}
