//! The guests' virtual disk and the kernel modules that read it: a small,
//! reusable piece (the VM-boot experiment uses it; so can any experiment
//! whose guests must read files from a disk, e.g. for I/O hints or host
//! page cache that duplicates guest memory).
//!
//! ## The disk image ([`DiskImage::build`])
//!
//! An ext2 file system (4 KiB blocks, so every file's data starts on a
//! page boundary in the image, in the host's page cache of it and in the
//! guest's page cache) made by e2fsprogs' `mke2fs -d`, which copies a
//! directory tree into the new file system without mounting anything.
//! The tree is the payload ([`super::image::select_payload`]) at the same
//! paths as on the host (`/usr/lib/...`), staged in a scratch directory
//! and removed afterwards. Before that, the host computes the checksum the
//! guest will print: `md5sum` of every file in sorted path order (`find .
//! -type f | LC_ALL=C sort | xargs md5sum`), then `md5sum` of that list.
//!
//! One image per run; [`DiskImage::copy_for`] gives each guest its own
//! copy (`cp --reflink=auto`: shared extents where the file system can,
//! a real copy elsewhere), so that every guest reads its own host file,
//! through the host's page cache (`cache=writeback`), as separate VMs do.
//!
//! ## The modules ([`KernelModules::collect`])
//!
//! Debian's kernel builds virtio-pci, virtio-blk and ext4 as modules, so
//! the initramfs carries them: each wanted module and, from the kernel's
//! `modules.dep`, everything it needs, in load order (dependencies
//! first). A module built in (`modules.builtin`) is skipped. Compressed
//! modules (`.ko.xz`, `.ko.zst`, `.ko.gz`, as newer Debian kernels ship
//! them) are decompressed on the host with `xz`, `zstd` or `gzip`, since
//! busybox's `insmod` may lack the decompressor.

use super::GuestError;
use super::host::find_in_path;
use super::image::PayloadFile;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Modules the guest needs to read an ext2 file system on a virtio disk
/// (ext2 is served by the ext4 driver: `CONFIG_EXT4_USE_FOR_EXT2`).
pub const DISK_MODULES: &[&str] = &["virtio_pci", "virtio_blk", "ext4"];

/// Modules loaded when the kernel has them as modules: Linux 6.1's ext4
/// refuses to mount anything (ext2 included) without the `crc32c`
/// crypto driver, which it asks for by name, not by module dependency;
/// the generic one runs on any guest CPU.
pub const OPTIONAL_DISK_MODULES: &[&str] = &["crc32c_generic"];

/// Free room in the image beyond the files: metadata, inode tables,
/// directories (mke2fs fails when the tree does not fit).
const SLACK_BYTES: u64 = 16 << 20;

/// Kernel modules, in the order `insmod` must load them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelModules {
    /// `(module name, uncompressed .ko bytes)`, dependencies first.
    pub modules: Vec<(String, Vec<u8>)>,
}

impl KernelModules {
    /// `optional` modules the kernel has (first), then `wanted`, with
    /// their dependencies, from `/lib/modules/<release>`.
    pub fn collect(
        release: &str,
        wanted: &[&str],
        optional: &[&str],
    ) -> Result<KernelModules, GuestError> {
        KernelModules::collect_in(&Path::new("/lib/modules").join(release), wanted, optional)
    }

    /// [`collect`](Self::collect) from a modules directory.
    pub fn collect_in(
        dir: &Path,
        wanted: &[&str],
        optional: &[&str],
    ) -> Result<KernelModules, GuestError> {
        let read = |name: &str| {
            fs::read_to_string(dir.join(name)).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    GuestError::Missing {
                        what: format!("{}/{name}", dir.display()),
                        package: "linux-image-amd64",
                    }
                } else {
                    GuestError::io(format!("reading {}/{name}", dir.display()), e)
                }
            })
        };
        let deps = parse_modules_dep(&read("modules.dep")?);
        let builtin: Vec<String> = fs::read_to_string(dir.join("modules.builtin"))
            .unwrap_or_default()
            .lines()
            .map(module_name)
            .collect();
        let mut order: Vec<String> = Vec::new();
        for o in optional {
            let o = o.replace('-', "_");
            if deps.contains_key(&o) {
                load_order(&o, &deps, &mut order, 0)?;
            }
        }
        for w in wanted {
            let w = w.replace('-', "_");
            if builtin.contains(&w) {
                continue;
            }
            if !deps.contains_key(&w) {
                return Err(GuestError::Unsuitable(format!(
                    "kernel module {w} is neither in {0}/modules.dep nor built in \
                     ({0}/modules.builtin): the guest cannot read its disk",
                    dir.display()
                )));
            }
            load_order(&w, &deps, &mut order, 0)?;
        }
        let mut modules = Vec::new();
        for name in order {
            let (path, _) = &deps[&name];
            modules.push((name, decompress(&dir.join(path))?));
        }
        Ok(KernelModules { modules })
    }
}

/// `kernel/fs/ext4/ext4.ko.xz` → `ext4` (`-` read as `_`, as the kernel does).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// `modules.dep`: module name → (its path, its dependencies' names).
pub fn parse_modules_dep(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(path, deps)| {
            let path = path.trim().to_string();
            let deps = deps.split_whitespace().map(module_name).collect();
            (module_name(&path), (path, deps))
        })
        .collect()
}

/// Appends `name` after its dependencies (each once) to `order`.
fn load_order(
    name: &str,
    deps: &BTreeMap<String, (String, Vec<String>)>,
    order: &mut Vec<String>,
    depth: usize,
) -> Result<(), GuestError> {
    if order.iter().any(|m| m == name) {
        return Ok(());
    }
    if depth > 64 {
        return Err(GuestError::Unsuitable(format!(
            "modules.dep: a dependency cycle through {name}"
        )));
    }
    let Some((_, needs)) = deps.get(name) else {
        return Err(GuestError::Unsuitable(format!(
            "modules.dep names {name} as a dependency but has no entry for it"
        )));
    };
    for d in needs {
        load_order(d, deps, order, depth + 1)?;
    }
    order.push(name.to_string());
    Ok(())
}

/// A module file's bytes, decompressed by its suffix.
fn decompress(path: &Path) -> Result<Vec<u8>, GuestError> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".ko") {
        return fs::read(path).map_err(|e| GuestError::io(format!("reading {name}"), e));
    } else if name.ends_with(".ko.xz") {
        ("xz", "xz-utils")
    } else if name.ends_with(".ko.zst") {
        ("zstd", "zstd")
    } else if name.ends_with(".ko.gz") {
        ("gzip", "gzip")
    } else {
        return Err(GuestError::Unsuitable(format!(
            "{name}: not a kernel module this builder knows"
        )));
    };
    let bin = find_in_path(tool.0).ok_or_else(|| GuestError::Missing {
        what: format!("{} (to decompress {name})", tool.0),
        package: tool.1,
    })?;
    let out = Command::new(&bin)
        .args(["-d", "-c"])
        .arg(path)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| GuestError::io(format!("running {}", bin.display()), e))?;
    if !out.status.success() {
        return Err(GuestError::Unsuitable(format!(
            "{} -d -c {name} failed ({}): {}",
            tool.0,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// A built disk image (see the module header).
#[derive(Clone, Debug)]
pub struct DiskImage {
    path: PathBuf,
    bytes: u64,
    files: usize,
    checksum: String,
}

impl DiskImage {
    /// Writes `dir/disk.ext2` holding `files` at their host paths.
    pub fn build(dir: &Path, files: &[PayloadFile]) -> Result<DiskImage, GuestError> {
        let mke2fs = find_in_path("mke2fs").ok_or_else(|| GuestError::Missing {
            what: "mke2fs (on PATH)".into(),
            package: "e2fsprogs",
        })?;
        let stage = dir.join("disk-tree");
        let _ = fs::remove_dir_all(&stage);
        let staged = || -> std::io::Result<()> {
            for f in files {
                let rel = f.source.strip_prefix("/").unwrap_or(&f.source);
                let to = stage.join(rel);
                fs::create_dir_all(to.parent().expect("a file has a parent"))?;
                fs::copy(&f.source, &to)?;
            }
            Ok(())
        };
        staged().map_err(|e| GuestError::io(format!("staging {}", stage.display()), e))?;
        let result = DiskImage::make(dir, &stage, &mke2fs, files);
        let _ = fs::remove_dir_all(&stage);
        result
    }

    fn make(
        dir: &Path,
        stage: &Path,
        mke2fs: &Path,
        files: &[PayloadFile],
    ) -> Result<DiskImage, GuestError> {
        let checksum = tree_checksum(stage)?;
        let path = dir.join("disk.ext2");
        let _ = fs::remove_file(&path);
        let data: u64 = files.iter().map(|f| f.bytes.div_ceil(4096) * 4096).sum();
        let kib = (data + data / 8 + SLACK_BYTES) / 1024;
        let out = Command::new(mke2fs)
            .args(["-q", "-F", "-t", "ext2", "-b", "4096", "-m", "0"])
            .args(["-L", "pagesift", "-E", "root_owner=0:0", "-d"])
            .arg(stage)
            .arg(&path)
            .arg(format!("{kib}k"))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .output()
            .map_err(|e| GuestError::io(format!("running {}", mke2fs.display()), e))?;
        if !out.status.success() {
            return Err(GuestError::Unsuitable(format!(
                "mke2fs -d {} {} failed ({}): {}",
                stage.display(),
                path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let bytes = fs::metadata(&path)
            .map_err(|e| GuestError::io(format!("reading {}", path.display()), e))?
            .len();
        Ok(DiskImage {
            path,
            bytes,
            files: files.len(),
            checksum,
        })
    }

    /// The image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Regular files on it.
    pub fn files(&self) -> usize {
        self.files
    }

    /// md5 of the sorted `md5sum` list of its files (what a guest that read
    /// every file prints).
    pub fn checksum(&self) -> &str {
        &self.checksum
    }

    /// A copy of the image for guest `name` (`<dir>/<name>.disk`), made
    /// afresh.
    pub fn copy_for(&self, name: &str) -> Result<PathBuf, GuestError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let to = dir.join(format!("{name}.disk"));
        let _ = fs::remove_file(&to);
        let status = Command::new("cp")
            .arg("--reflink=auto")
            .arg(&self.path)
            .arg(&to)
            .stderr(Stdio::inherit())
            .status()
            .map_err(|e| GuestError::io("running cp", e))?;
        if !status.success() {
            return Err(GuestError::Unsuitable(format!(
                "cp --reflink=auto {} {} failed ({status})",
                self.path.display(),
                to.display()
            )));
        }
        // The copy sits dirty in the host's page cache until writeback
        // (about 30 s). An image at rest is clean, and scrubbing rightly
        // never drops a dirty page: write it back now, so that a guest
        // starts from the state of an image that has been on disk a while.
        fs::File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(|e| GuestError::io(format!("syncing {}", to.display()), e))?;
        Ok(to)
    }
}

/// The host's `md5sum` of every file under `dir` in sorted path order,
/// then of that list: the same pipeline the guest runs.
pub fn tree_checksum(dir: &Path) -> Result<String, GuestError> {
    let out = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . -type f | LC_ALL=C sort | xargs md5sum | md5sum")
        .arg("sh")
        .arg(dir)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| GuestError::io("running sh (md5sum)", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(sum) if out.status.success() && sum.len() == 32 => Ok(sum.to_string()),
        _ => Err(GuestError::Unsuitable(format!(
            "md5sum of {} failed ({}): {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/mbcache.ko.xz kernel/fs/jbd2/jbd2.ko.xz\n\
kernel/lib/crc16.ko.xz:\n\
kernel/fs/mbcache.ko.xz:\n\
kernel/fs/jbd2/jbd2.ko.xz:\n\
kernel/drivers/virtio/virtio_pci.ko.xz: kernel/drivers/virtio/virtio_pci_legacy_dev.ko.xz kernel/drivers/virtio/virtio_pci_modern_dev.ko.xz kernel/drivers/virtio/virtio.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz\n\
kernel/drivers/virtio/virtio_pci_legacy_dev.ko.xz:\n\
kernel/drivers/virtio/virtio_pci_modern_dev.ko.xz:\n\
kernel/drivers/virtio/virtio.ko.xz:\n\
kernel/drivers/virtio/virtio_ring.ko.xz:\n\
kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz\n";

    #[test]
    fn modules_load_after_their_dependencies_each_once() {
        let deps = parse_modules_dep(DEP);
        assert_eq!(deps["ext4"].0, "kernel/fs/ext4/ext4.ko.xz");
        let mut order = Vec::new();
        for w in DISK_MODULES {
            load_order(w, &deps, &mut order, 0).unwrap();
        }
        assert_eq!(
            order,
            [
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio",
                "virtio_ring",
                "virtio_pci",
                "virtio_blk",
                "crc16",
                "mbcache",
                "jbd2",
                "ext4"
            ]
        );
        let mut cyclic = parse_modules_dep("a.ko: b.ko\nb.ko: a.ko\n");
        assert!(load_order("a", &cyclic, &mut Vec::new(), 0).is_err());
        cyclic.remove("b");
        assert!(load_order("a", &cyclic, &mut Vec::new(), 0).is_err());
    }

    #[test]
    fn modules_are_collected_decompressed_and_builtins_skipped() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path();
        fs::create_dir_all(m.join("kernel/a")).unwrap();
        fs::write(m.join("kernel/a/dep.ko"), b"plain module").unwrap();
        let st = Command::new("sh")
            .arg("-c")
            .arg("printf 'xz module' | xz -c > \"$1\"")
            .arg("sh")
            .arg(m.join("kernel/a/top.ko.xz"))
            .status()
            .unwrap();
        assert!(st.success());
        fs::write(
            m.join("modules.dep"),
            "kernel/a/top.ko.xz: kernel/a/dep.ko\nkernel/a/dep.ko:\n",
        )
        .unwrap();
        fs::write(m.join("modules.builtin"), "kernel/fs/ext4/ext4.ko\n").unwrap();
        let got = KernelModules::collect_in(m, &["top", "ext4"], &["absent"]).unwrap();
        assert_eq!(
            got.modules,
            [
                ("dep".to_string(), b"plain module".to_vec()),
                ("top".to_string(), b"xz module".to_vec())
            ]
        );
        let err = KernelModules::collect_in(m, &["virtio_blk"], &[]).unwrap_err();
        assert!(err.to_string().contains("virtio_blk"), "{err}");
        // An optional module the kernel has comes first.
        let got = KernelModules::collect_in(m, &[], &["dep"]).unwrap();
        assert_eq!(got.modules.len(), 1);
    }

    #[test]
    fn the_tree_checksum_is_md5sum_of_the_sorted_list() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("b")).unwrap();
        fs::write(d.path().join("b/x"), b"x").unwrap();
        fs::write(d.path().join("a"), b"a").unwrap();
        // md5sum output of "./a" then "./b/x", hashed again.
        let list = "0cc175b9c0f1b6a831c399e269772661  ./a\n\
                    9dd4e461268c8034f5c8564e155c67a6  ./b/x\n";
        let want = Command::new("md5sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(list.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        let want = String::from_utf8(want.stdout).unwrap();
        assert_eq!(tree_checksum(d.path()).unwrap(), want[..32]);
    }
}
