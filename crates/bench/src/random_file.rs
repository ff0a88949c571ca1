//! Files of random bytes, the data the experiments share: the
//! interpreter-workers' data file, the files experiment's files, the
//! page-cache experiment's disk data and the scrub tests' files.
//!
//! ChaCha8 from a seed, so that a file is the same in every run (and
//! every run of a seed), no page of it equals another page of it or the
//! zero page, and files of different seeds share no page: every
//! duplicate an experiment offers comes from its processes or guests
//! holding the same file, never from the data itself.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` of ChaCha8 random content from `seed` to `path`,
/// through a temporary file and a rename, so that a half-written file is
/// never used.
pub fn write(path: &Path, bytes: u64, seed: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        rng.fill_bytes(&mut chunk[..n]);
        out.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_is_random_reproducible_and_whole() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        write(&a, 3 << 20 | 100, 7).unwrap();
        write(&b, 3 << 20 | 100, 7).unwrap();
        let (x, y) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(x.len(), 3 << 20 | 100);
        assert_eq!(x, y);
        // No two pages alike, none zero.
        let mut pages: Vec<&[u8]> = x.chunks_exact(4096).collect();
        assert!(pages.iter().all(|p| p.iter().any(|&c| c != 0)));
        pages.sort();
        pages.dedup();
        assert_eq!(pages.len(), x.len() / 4096);
        write(&b, 4096, 8).unwrap();
        assert_ne!(std::fs::read(&b).unwrap()[..], x[..4096]);
    }
}
