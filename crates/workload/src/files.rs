//! The `read-files` workload: a process that reads files into page-aligned
//! anonymous buffers when told to (XLH's HTTPerf-like setting, where many
//! processes hold the same file data), beside private memory of its own.
//!
//! One anonymous mapping holds every file, each starting on a page
//! boundary, in the order given; the reads happen in an order shuffled by
//! `--order-seed`, in chunks of `--chunk-kib` (or `--chunk-bytes`), with the syscall chosen by
//! `--syscall` (`readv`/`preadv` split each chunk into four iovecs). The
//! mapping is not touched before the reads, so its pages receive their
//! first content from the file, as a server's fresh buffers would.

use crate::content::PAGE;
use pagesift_linux::sys::{AnonMapping, HugePages};
use serde::Serialize;
use std::fs::File;
use std::hash::Hasher;
use std::io::IoSliceMut;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use twox_hash::XxHash3_64;

/// How the files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadCall {
    Read,
    Pread64,
    Readv,
    Preadv,
}

/// Where one file landed.
#[derive(Serialize, Clone, Debug)]
pub struct Placed {
    pub path: PathBuf,
    /// First address of its buffer (page-aligned).
    pub addr: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// The files' buffers.
pub struct FileBuffers {
    map: AnonMapping,
    files: Vec<(PathBuf, usize, usize)>,
    read: bool,
}

impl FileBuffers {
    /// Maps page-aligned room for every file in `paths` (sizes taken now).
    pub fn map(paths: &[PathBuf]) -> Result<FileBuffers, String> {
        let mut files = Vec::new();
        let mut off = 0usize;
        for p in paths {
            let len = std::fs::metadata(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .len() as usize;
            files.push((p.clone(), off, len));
            off += len.div_ceil(PAGE).max(1) * PAGE;
        }
        let map =
            AnonMapping::new(off.max(PAGE), HugePages::Never).map_err(|e| format!("mmap: {e}"))?;
        Ok(FileBuffers {
            map,
            files,
            read: false,
        })
    }

    /// First address and pages of the mapping.
    pub fn region(&self) -> (u64, u64) {
        (self.map.addr(), (self.map.len() / PAGE) as u64)
    }

    /// Reads every file into its buffer, in an order shuffled by `seed`.
    pub fn read_all(
        &mut self,
        call: ReadCall,
        chunk: usize,
        seed: u64,
    ) -> Result<Vec<Placed>, String> {
        let mut order: Vec<usize> = (0..self.files.len()).collect();
        // Fisher-Yates with a splitmix64 stream: reproducible per seed.
        let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for i in (1..order.len()).rev() {
            order.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let chunk = chunk.max(1);
        let base = self.map.addr();
        let mut placed = Vec::new();
        for i in order {
            let (path, off, len) = self.files[i].clone();
            let mut f = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let buf = &mut self.map.as_mut_slice()[off..off + len];
            let mut done = 0usize;
            while done < len {
                let n = (len - done).min(chunk);
                let piece = &mut buf[done..done + n];
                let got = read_chunk(&mut f, call, piece, done as u64)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if got == 0 {
                    break;
                }
                done += got;
            }
            placed.push(Placed {
                path,
                addr: base + off as u64,
                bytes: done as u64,
            });
        }
        self.read = true;
        Ok(placed)
    }

    /// xxh3-64 over the buffers once read (none before: reading would map
    /// the zero page), as hex.
    pub fn checksum(&self) -> Option<String> {
        if !self.read {
            return None;
        }
        let mut h = XxHash3_64::new();
        h.write(self.map.as_slice());
        Some(format!("{:016x}", h.finish()))
    }
}

fn read_chunk(f: &mut File, call: ReadCall, out: &mut [u8], at: u64) -> std::io::Result<usize> {
    use std::io::Read;
    match call {
        ReadCall::Read => f.read(out),
        ReadCall::Pread64 => f.read_at(out, at),
        ReadCall::Readv | ReadCall::Preadv => {
            let q = out.len().div_ceil(4);
            let mut parts: Vec<IoSliceMut<'_>> = out.chunks_mut(q).map(IoSliceMut::new).collect();
            if call == ReadCall::Readv {
                f.read_vectored(&mut parts)
            } else {
                pagesift_linux::sys::preadv(f, &mut parts, at)
            }
        }
    }
}
