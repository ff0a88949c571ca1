//! Compiles the I/O hint BPF program (bpf/iohint.bpf.c) with clang into
//! `$OUT_DIR/iohint.bpf.o`, which `src/iohint.rs` embeds. Needs `clang`
//! (with its BPF target) and libbpf's headers (`bpf/bpf_helpers.h`, Debian
//! package libbpf-dev), both installed by scripts/setup. `$CLANG` names
//! another clang.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/iohint.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("iohint.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    // The uapi headers' <asm/types.h> lives under the multiarch directory.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{clang} failed ({s}) to compile {src}: the build needs clang and libbpf's headers \
             (Debian: apt-get install clang libbpf-dev, or run scripts/setup)"
        ),
        Err(e) => panic!(
            "cannot run {clang} ({e}) to compile {src}: the build needs clang and libbpf's headers \
             (Debian: apt-get install clang libbpf-dev, or run scripts/setup)"
        ),
    }
}
