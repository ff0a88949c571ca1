//! The host programs and files a guest is made of, found and checked
//! before anything is built, so that a missing piece is named up front.
//!
//! - `qemu-system-x86_64` (package `qemu-system-x86`) and `setpriv`
//!   (`util-linux`, essential on Debian) on `PATH`.
//! - A **static** busybox (`busybox-static`): Debian's `busybox` package
//!   installs a dynamically linked `/bin/busybox` that cannot run in an
//!   initramfs without its libc, so the ELF program headers are read and a
//!   `PT_INTERP` (a dynamic loader) is refused.
//! - The **newest** `/boot/vmlinuz-*` (`linux-image-amd64`), newest by
//!   natural order of the release string (`6.1.0-56` after `6.1.0-9`). If
//!   its `/boot/config-*` exists, every option the initramfs itself relies
//!   on must be built in (`=y`); the disk's drivers may be modules, which
//!   the initramfs then carries (`super::disk`).

use super::GuestError;
use std::cmp::Ordering;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Kernel options the guest uses before it can load a module, all of
/// which must be `=y`: the initramfs itself, `#!` and ELF
/// executables, proc/sys/devtmpfs, tmpfs for the payload copy, and the
/// 8250 UART as console (`console=ttyS0`).
pub const REQUIRED_KERNEL_CONFIG: &[&str] = &[
    "CONFIG_BLK_DEV_INITRD",
    "CONFIG_BINFMT_ELF",
    "CONFIG_BINFMT_SCRIPT",
    "CONFIG_PROC_FS",
    "CONFIG_SYSFS",
    "CONFIG_DEVTMPFS",
    "CONFIG_TMPFS",
    "CONFIG_SERIAL_8250",
    "CONFIG_SERIAL_8250_CONSOLE",
];

/// Where busybox-static puts busybox (`/bin` is `/usr/bin` on merged-usr
/// systems; either may be the real file).
const BUSYBOX_PATHS: &[&str] = &["/bin/busybox", "/usr/bin/busybox"];

/// Paths of everything a guest needs on the host.
#[derive(Clone, Debug)]
pub struct HostTools {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// util-linux's `setpriv` (sets QEMU's parent-death signal).
    pub setpriv: PathBuf,
    /// A statically linked busybox.
    pub busybox: PathBuf,
    /// The newest `/boot/vmlinuz-*`.
    pub kernel: PathBuf,
    /// Its release (`6.1.0-56-amd64`).
    pub kernel_release: String,
}

impl HostTools {
    /// Finds and checks everything in the standard places; the error names
    /// the first thing missing and the package that provides it.
    pub fn find() -> Result<HostTools, GuestError> {
        let qemu = find_in_path("qemu-system-x86_64").ok_or_else(|| GuestError::Missing {
            what: "qemu-system-x86_64 (on PATH)".into(),
            package: "qemu-system-x86",
        })?;
        let setpriv = find_in_path("setpriv").ok_or_else(|| GuestError::Missing {
            what: "setpriv (on PATH)".into(),
            package: "util-linux",
        })?;
        let busybox = find_busybox()?;
        let (kernel, kernel_release) = newest_kernel(Path::new("/boot"))?;
        check_kernel_config(Path::new("/boot"), &kernel_release)?;
        Ok(HostTools {
            qemu,
            setpriv,
            busybox,
            kernel,
            kernel_release,
        })
    }
}

/// `name` in a `PATH` directory (plus `/usr/sbin` and `/sbin`, which a
/// non-login root shell may lack), if it is an executable file.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

fn find_busybox() -> Result<PathBuf, GuestError> {
    let Some(path) = BUSYBOX_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        return Err(GuestError::Missing {
            what: format!("busybox (looked for {})", BUSYBOX_PATHS.join(", ")),
            package: "busybox-static",
        });
    };
    let mut head = Vec::new();
    fs::File::open(&path)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut head))
        .map_err(|e| GuestError::io(format!("reading {}", path.display()), e))?;
    match elf_has_interpreter(&head) {
        Some(false) => Ok(path),
        Some(true) => Err(GuestError::Missing {
            what: format!(
                "a static busybox ({} is dynamically linked, from Debian's busybox package)",
                path.display()
            ),
            package: "busybox-static",
        }),
        None => Err(GuestError::Unsuitable(format!(
            "{} is not a 64-bit little-endian ELF executable",
            path.display()
        ))),
    }
}

/// Whether an ELF64 little-endian image (its first bytes, program headers
/// included) names a program interpreter (`PT_INTERP`, i.e. it is
/// dynamically linked); `None` if it is not such an ELF or is cut short.
pub fn elf_has_interpreter(head: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    // e_ident: magic, ELFCLASS64 (2), ELFDATA2LSB (1).
    if head.len() < 64 || head[..4] != *b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[0x20..0x28].try_into().ok()?) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    if phentsize < 4 {
        return None;
    }
    let mut found = false;
    for i in 0..phnum {
        let o = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let p_type = u32::from_le_bytes(head.get(o..o + 4)?.try_into().ok()?);
        found |= p_type == PT_INTERP;
    }
    Some(found)
}

/// The newest `vmlinuz-*` in `boot` and its release string.
pub fn newest_kernel(boot: &Path) -> Result<(PathBuf, String), GuestError> {
    let missing = || GuestError::Missing {
        what: format!("a kernel image ({}/vmlinuz-*)", boot.display()),
        package: "linux-image-amd64",
    };
    let entries = fs::read_dir(boot).map_err(|_| missing())?;
    let release = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let release = name.strip_prefix("vmlinuz-")?.to_string();
            e.path().is_file().then_some(release)
        })
        .max_by(|a, b| natural_cmp(a, b))
        .ok_or_else(missing)?;
    Ok((boot.join(format!("vmlinuz-{release}")), release))
}

/// Checks `boot/config-<release>` (when present) for
/// [`REQUIRED_KERNEL_CONFIG`] built in.
pub fn check_kernel_config(boot: &Path, release: &str) -> Result<(), GuestError> {
    let path = boot.join(format!("config-{release}"));
    let Ok(text) = fs::read_to_string(&path) else {
        return Ok(()); // no config shipped: the boot itself will tell
    };
    let lacking: Vec<String> = REQUIRED_KERNEL_CONFIG
        .iter()
        .filter(|opt| !text.lines().any(|l| l == format!("{opt}=y")))
        .map(|opt| {
            let prefix = format!("{opt}=");
            match text.lines().find_map(|l| l.strip_prefix(prefix.as_str())) {
                Some(v) => format!("{opt}={v}"),
                None => format!("{opt} unset"),
            }
        })
        .collect();
    if lacking.is_empty() {
        Ok(())
    } else {
        Err(GuestError::Unsuitable(format!(
            "kernel {release} has {} ({}): the guest loads no modules, so these must be =y",
            lacking.join(", "),
            path.display()
        )))
    }
}

/// Compares version strings with runs of digits compared as numbers:
/// `6.1.0-9-amd64` < `6.1.0-56-amd64` < `6.12.1-amd64`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (na, nb) = (trim_zeros(&a[..da]), trim_zeros(&b[..db]));
                // Longer digit run (without leading zeros) = larger number.
                let ord = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if ord != Ordering::Equal {
                    return ord;
                }
                (a, b) = (&a[da..], &b[db..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let n = digits.iter().take_while(|&&c| c == b'0').count();
    &digits[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_numbers_as_numbers() {
        let mut v = vec![
            "6.12.1-amd64",
            "6.1.0-56-amd64",
            "6.1.0-9-amd64",
            "6.1.0-10-amd64",
            "5.10.0-28-amd64",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            [
                "5.10.0-28-amd64",
                "6.1.0-9-amd64",
                "6.1.0-10-amd64",
                "6.1.0-56-amd64",
                "6.12.1-amd64"
            ]
        );
        assert_eq!(natural_cmp("1.007", "1.7"), Ordering::Equal);
        assert_eq!(natural_cmp("a", "b"), Ordering::Less);
    }

    /// A minimal ELF64 LE header with program headers of the given types.
    fn elf(types: &[u32]) -> Vec<u8> {
        let mut h = vec![0u8; 64 + 56 * types.len()];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        h[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        h[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            h[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        h
    }

    #[test]
    fn elf_interpreter_detects_dynamic_linking() {
        assert_eq!(elf_has_interpreter(&elf(&[6, 3, 1])), Some(true));
        assert_eq!(elf_has_interpreter(&elf(&[1, 1, 4])), Some(false));
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\n"), None);
        // Program headers beyond the bytes read: not a verdict.
        let mut cut = elf(&[1, 3]);
        cut.truncate(64 + 56);
        assert_eq!(elf_has_interpreter(&cut), None);
    }

    #[test]
    fn newest_kernel_and_its_config() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path();
        assert!(matches!(
            newest_kernel(boot),
            Err(GuestError::Missing {
                package: "linux-image-amd64",
                ..
            })
        ));
        for r in ["6.1.0-9-amd64", "6.1.0-56-amd64", "6.1.0-10-amd64"] {
            fs::write(boot.join(format!("vmlinuz-{r}")), b"k").unwrap();
        }
        fs::write(boot.join("initrd.img-6.9.0-1-amd64"), b"i").unwrap();
        let (path, release) = newest_kernel(boot).unwrap();
        assert_eq!(release, "6.1.0-56-amd64");
        assert_eq!(path, boot.join("vmlinuz-6.1.0-56-amd64"));

        // No config: accepted. A module-built tmpfs: refused, named.
        check_kernel_config(boot, &release).unwrap();
        let mut config: String = REQUIRED_KERNEL_CONFIG
            .iter()
            .map(|o| format!("{o}=y\n"))
            .collect();
        fs::write(boot.join(format!("config-{release}")), &config).unwrap();
        check_kernel_config(boot, &release).unwrap();
        config = config.replace("CONFIG_TMPFS=y", "CONFIG_TMPFS=m");
        fs::write(boot.join(format!("config-{release}")), &config).unwrap();
        let err = check_kernel_config(boot, &release).unwrap_err().to_string();
        assert!(err.contains("CONFIG_TMPFS=m"), "{err}");
    }
}
