//! The `random-reads` workload: one process reading random blocks of a
//! file for a while, through the page cache, as a guest's database or
//! file server would (Singleton §4's random-read workload). It is what
//! the page-cache experiment runs inside its guests.
//!
//! Block `i` is `[i · block, (i + 1) · block)`; the blocks are drawn
//! uniformly (the crate's SplitMix64 seeded by `--seed`, so a run can be repeated and
//! two guests given different seeds read in different orders) and read
//! with one `pread` each into one reused buffer. Reads end at the first
//! block drawn after `--seconds` of the caller's monotonic clock; the
//! result is one JSON line: reads, bytes and seconds.
//!
//! A shell loop of `dd` calls (one process per block) measured the
//! guest's process start-ups, not its reads: under TCG a start-up costs
//! tens of times a 64 KiB read from the page cache.

use crate::layout::SplitMix64;
use serde::Serialize;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// What one run read.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub struct Reads {
    /// Blocks read in full.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds from the first read to the end of the last.
    pub seconds: f64,
}

/// The blocks of `len` bytes `block` bytes long (a partial last block is
/// not drawn).
pub fn blocks(len: u64, block: u64) -> u64 {
    len / block.max(1)
}

/// Reads random `block`-byte blocks of `path` for `seconds`.
pub fn run(path: &Path, block: u64, seconds: f64, seed: u64) -> Result<Reads, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let n = blocks(len, block);
    if n == 0 {
        return Err(format!(
            "{}: {len} bytes, smaller than one {block}-byte block",
            path.display()
        ));
    }
    let mut buf = vec![0u8; block as usize];
    let mut rng = SplitMix64::new(seed);
    let window = Duration::from_secs_f64(seconds.max(0.0));
    let t0 = Instant::now();
    let mut reads = 0u64;
    while t0.elapsed() < window {
        let i = rng.next_u64() % n;
        file.read_exact_at(&mut buf, i * block)
            .map_err(|e| format!("{} at block {i}: {e}", path.display()))?;
        reads += 1;
    }
    Ok(Reads {
        reads,
        bytes: reads * block,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_whole_blocks_of_the_file_until_the_time_is_up() {
        let dir = std::env::temp_dir().join(format!("pagesift-rr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        let mut f = File::create(&path).unwrap();
        // 10 blocks of 4 KiB and a partial one, never drawn.
        f.write_all(&vec![7u8; 10 * 4096 + 100]).unwrap();
        drop(f);
        let r = run(&path, 4096, 0.05, 3).unwrap();
        assert!(r.reads > 0, "{r:?}");
        assert_eq!(r.bytes, r.reads * 4096);
        assert!(r.seconds >= 0.05, "{r:?}");
        assert_eq!(blocks(10 * 4096 + 100, 4096), 10);
        let err = run(&path, 1 << 20, 0.01, 3).unwrap_err();
        assert!(err.contains("smaller than one"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
