//! The guest-files experiment (issue 12, after XLH §5.4): guests, each
//! with its own copy of a disk image, read the same files in different
//! orders, and the bench measures how soon the copies of that file data in
//! guest RAM are merged under pagesift with I/O hints, pagesift without
//! them, and the kernel's KSM.
//!
//! ## The workload
//!
//! The files are the files experiment's ([`crate::files::data_files`]:
//! random bytes, so no file page equals another page or the zero page and
//! every duplicate comes from guests holding the same file), on an ext2
//! disk image ([`crate::guest::DiskImage`]) of which each guest gets its own
//! copy (virtio-blk, `cache=writeback,aio=threads`: QEMU's worker threads
//! `preadv` the blocks straight into guest RAM, where the I/O hint program
//! sees them). The guests ([`crate::guest`], busybox initramfs) boot
//! before t = 0 with ksmd stopped and no daemon running, and wait on their
//! second serial port ([`crate::guest::GuestOptions::input_port`]). At
//! t = 0, once the system under test runs, the harness sends each guest
//! its read order ([`read_orders`]: a shuffle per guest, no two guests
//! alike), and the guest reads every file with `md5sum` into its page
//! cache, then prints the sums ([`INIT_BODY`]; the harness checks them
//! against the host's).
//!
//! ## What is measured
//!
//! *File data in guest RAM* is measured, not inferred from totals. Once
//! every guest has printed its sums, [`FileCopies::locate`] reads each
//! guest's RAM in QEMU (`linux::guest_ram`, present pages only, through
//! `/proc/PID/mem`, which never unshares a merged page) and keeps every
//! page whose 4096 bytes equal a page of the files (looked up by its first
//! 8 bytes, then compared in full): the *copies*, each with the file page
//! it holds. A guest's page cache stays where it was filled, so the copies
//! found then are where the data landed at t = 0.
//!
//! At every sample (4 Hz, from t = 0) [`FileCopies::sample`] reads the
//! pagemap of each guest's whole RAM (the frame behind every page). The
//! saving at that instant ([`saved_pages`]) is, over the frames behind the
//! copies, copies − frames, counting a frame only when every guest page
//! mapped to it is a copy of one and the same file page: before a guest's
//! read lands, its page may sit on a KSM frame of other content (zero pages
//! merged into one), which is no saving of file data. Samples taken before
//! the copies are located are kept and judged once they are. The target is
//! the copies less one per file page (each guest holding one copy of each
//! page: (guests − 1) × the file pages).
//!
//! Times to 50 % and 90 % of the target are taken from that series; the
//! CPU compared is the system's over the window (daemon + ksmd), as in the
//! other experiments. The whole-QEMU saving (Σ (Anonymous − Pss_Anon)) is
//! sampled and plotted beside it: it includes everything else the guests
//! have in common (kernel, initramfs, free pages). The harness's own reads
//! (the guests' pagemaps at every sample, their RAM once to locate) are not
//! part of the CPU compared.

use crate::BenchError;
use crate::experiment::GuestFilesPlan;
use crate::guest::image::{PayloadFile, disk_init_with};
use crate::guest::{Guest, GuestError, GuestImage, GuestOptions, ImageOptions};
use crate::sampler::metric;
use crate::series::Series;
use pagesift_core::{PAGE_SIZE, PageWords, WORDS_PER_PAGE};
use pagesift_linux::guest_ram::GuestRam;
use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PAGE_MIB: f64 = PAGE_SIZE as f64 / (1024.0 * 1024.0);

/// The line a guest prints when it has read every file.
pub const READ_MARKER: &str = "pagesift-guest: read-done";

/// The guests' `/init` after the disk is mounted (see the module header):
/// ready, wait for the order on `/dev/ttyS1`, read the files in that order,
/// print `read-done start=S stop=S md5=I:SUM,...` (guest uptime) and idle.
pub const INIT_BODY: &str = r#"f0=$(find /disk -name data-0.bin)
[ -n "$f0" ] || fail "no data-0.bin on /disk"
dir=${f0%/data-0.bin}
echo "pagesift-guest: ready files=$(ls "$dir" | wc -l)"
read -r order < /dev/ttyS1 || fail "reading the read order from /dev/ttyS1"
start=$(cut -d' ' -f1 /proc/uptime)
sums=""
for i in $order; do
    s=$(md5sum < "$dir/data-$i.bin") || fail "reading data-$i.bin"
    sums="$sums,$i:${s%% *}"
done
stop=$(cut -d' ' -f1 /proc/uptime)
echo "pagesift-guest: read-done start=$start stop=$stop md5=${sums#,}"
while :; do sleep 3600; done
"#;

/// What the guests boot and read: the image, the host's files and their
/// md5 sums.
#[derive(Clone, Debug)]
pub struct GuestFilesImage {
    /// The guest image (disk with the files, [`INIT_BODY`]).
    pub image: GuestImage,
    /// The files, in index order (`data-I.bin`).
    pub files: Vec<PathBuf>,
    /// Their md5 sums, computed on the host.
    pub md5: Vec<String>,
}

/// Writes the plan's files into `work_dir` and builds the image in `dir`.
pub fn build_image(
    dir: &Path,
    work_dir: &Path,
    plan: &GuestFilesPlan,
) -> Result<GuestFilesImage, BenchError> {
    let files = crate::files::data_files(work_dir, plan.files, plan.file_mib)?;
    let mut md5 = Vec::new();
    let mut payload = Vec::new();
    for f in &files {
        md5.push(crate::page_cache::md5_of(f)?);
        payload.push(PayloadFile {
            source: f.clone(),
            bytes: plan.file_mib << 20,
        });
    }
    let opts = ImageOptions {
        files: Some(payload),
        init: Some(disk_init_with(INIT_BODY)),
        ..ImageOptions::default()
    };
    let image = GuestImage::build_with(dir, &opts).map_err(guest_error)?;
    Ok(GuestFilesImage { image, files, md5 })
}

/// A guest error as the bench reports it: what is missing, or the run's
/// failure.
pub fn guest_error(e: GuestError) -> BenchError {
    match e {
        GuestError::Missing { .. } | GuestError::Unsuitable(_) => {
            BenchError::Missing(e.to_string())
        }
        e => BenchError::System(e.to_string()),
    }
}

/// The order each of `guests` guests reads `files` files in: a ChaCha8
/// shuffle per guest, re-drawn while it equals an earlier guest's (as long
/// as the files have enough orders).
pub fn read_orders(guests: usize, files: usize) -> Vec<Vec<usize>> {
    let orders_exist: u64 = (1..=files as u64)
        .try_fold(1u64, |a, n| a.checked_mul(n))
        .unwrap_or(u64::MAX);
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut seed = 0x6775_6573_7466_696c_u64; // "guestfil"
    for _ in 0..guests {
        loop {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            seed += 1;
            let mut order: Vec<usize> = (0..files).collect();
            for i in (1..files).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            if !out.contains(&order) || out.len() as u64 >= orders_exist {
                out.push(order);
                break;
            }
        }
    }
    out
}

/// Boots `plan.guests` guests of `image` at once, each with its input
/// port (`mem_merge`: QEMU's own `MADV_MERGEABLE`, for KSM), and waits
/// until each is ready (waiting on its input port), at most `timeout`;
/// `interrupted` is asked between polls.
pub fn boot(
    image: &GuestImage,
    plan: &GuestFilesPlan,
    name: &str,
    mem_merge: bool,
    timeout: Duration,
    interrupted: &dyn Fn() -> bool,
) -> Result<Vec<Guest>, BenchError> {
    let mut guests = Vec::new();
    for k in 0..plan.guests {
        let mut opts = GuestOptions::new(format!("gf-{name}-{k}"), mem_merge);
        opts.mem_mib = plan.mem_mib;
        opts.input_port = true;
        guests.push(Guest::start(image, opts).map_err(guest_error)?);
    }
    let end = Instant::now() + timeout;
    loop {
        let mut ready = 0;
        for g in &mut guests {
            ready += usize::from(g.poll_ready().map_err(guest_error)?);
        }
        if ready == guests.len() {
            return Ok(guests);
        }
        if interrupted() {
            return Err(BenchError::Interrupted);
        }
        if Instant::now() > end {
            return Err(BenchError::System(format!(
                "{ready} of {} guests ready within {timeout:?}",
                guests.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends each guest its read order (t = 0 of the reads).
pub fn start_reading(guests: &mut [Guest], files: usize) -> Result<(), BenchError> {
    let orders = read_orders(guests.len(), files);
    for (g, order) in guests.iter_mut().zip(orders) {
        let line: Vec<String> = order.iter().map(|i| i.to_string()).collect();
        g.send_line(&line.join(" ")).map_err(guest_error)?;
    }
    Ok(())
}

/// One guest's reads, from its read-done line.
#[derive(Clone, Debug, PartialEq)]
pub struct GuestRead {
    /// Guest uptime when it got the order and when it had read every file, s.
    pub start_s: f64,
    /// See `start_s`.
    pub stop_s: f64,
    /// The files in the order read, with the md5 the guest computed.
    pub sums: Vec<(usize, String)>,
}

impl GuestRead {
    /// Parses the read-done line in a serial log, if there is a whole one
    /// ([`crate::guest::whole_lines`]).
    pub fn parse(log: &str) -> Option<Result<GuestRead, String>> {
        let line = (crate::guest::whole_lines(log).lines()).find(|l| l.starts_with(READ_MARKER))?;
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
        };
        let num = |k: &str| field(k).and_then(|v| v.parse::<f64>().ok());
        let sums: Option<Vec<(usize, String)>> = field("md5").map(|v| {
            v.split(',')
                .filter_map(|p| {
                    let (i, s) = p.split_once(':')?;
                    Some((i.parse().ok()?, s.to_string()))
                })
                .collect()
        });
        Some(match (num("start"), num("stop"), sums) {
            (Some(start_s), Some(stop_s), Some(sums)) => Ok(GuestRead {
                start_s,
                stop_s,
                sums,
            }),
            _ => Err(format!("unreadable line {line:?}")),
        })
    }

    /// An error unless the guest read every file once and each sum is the
    /// host's.
    pub fn check(&self, md5: &[String]) -> Result<(), String> {
        let mut seen = vec![false; md5.len()];
        for (i, sum) in &self.sums {
            let Some(want) = md5.get(*i) else {
                return Err(format!("read a file data-{i}.bin the host has not"));
            };
            if sum != want {
                return Err(format!(
                    "data-{i}.bin: md5 {sum} in the guest, {want} on the host"
                ));
            }
            seen[*i] = true;
        }
        match seen.iter().position(|s| !s) {
            Some(i) => Err(format!("data-{i}.bin was not read")),
            None => Ok(()),
        }
    }
}

/// Every guest's reads once all have printed their read-done line (`None`
/// before); an error names a guest whose sums differ from the host's.
pub fn reads_done(guests: &[Guest], md5: &[String]) -> Result<Option<Vec<GuestRead>>, BenchError> {
    let mut out = Vec::new();
    for g in guests {
        let log = std::fs::read_to_string(g.serial_log()).unwrap_or_default();
        match GuestRead::parse(&log) {
            None => return Ok(None),
            Some(Ok(r)) => {
                r.check(md5)
                    .map_err(|e| BenchError::System(format!("guest {}: {e}", g.name())))?;
                out.push(r);
            }
            Some(Err(e)) => return Err(BenchError::System(format!("guest {}: {e}", g.name()))),
        }
    }
    Ok(Some(out))
}

/// One located copy of a file page in guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileCopy {
    /// The guest (its index).
    pub guest: usize,
    /// The page's index in that guest's RAM.
    pub page: usize,
    /// The file page it holds (index over all files' pages).
    pub content: u32,
}

/// The pages saved among `copies` when guest `g`'s page `i` is backed by
/// frame `frames[g][i]` (0: not present): over the frames behind the
/// copies, copies − 1 each, counting a frame only if every guest page
/// mapped to it is a copy, all of one file page (module header).
pub fn saved_pages(copies: &[FileCopy], frames: &[Vec<u64>]) -> u64 {
    struct Frame {
        content: u32,
        copies: u32,
        mixed: bool,
        mappings: u32,
    }
    let mut by_frame: HashMap<u64, Frame> = HashMap::with_capacity(copies.len());
    for c in copies {
        let pfn = frames
            .get(c.guest)
            .and_then(|g| g.get(c.page))
            .copied()
            .unwrap_or(0);
        if pfn == 0 {
            continue;
        }
        let f = by_frame.entry(pfn).or_insert(Frame {
            content: c.content,
            copies: 0,
            mixed: false,
            mappings: 0,
        });
        f.copies += 1;
        f.mixed |= f.content != c.content;
    }
    for g in frames {
        for pfn in g {
            if *pfn != 0
                && let Some(f) = by_frame.get_mut(pfn)
            {
                f.mappings += 1;
            }
        }
    }
    by_frame
        .values()
        .filter(|f| !f.mixed && f.mappings == f.copies)
        .map(|f| u64::from(f.copies - 1))
        .sum()
}

/// One guest's RAM as the measurement sees it.
#[derive(Debug)]
struct GuestMemory {
    pid: u32,
    ram: Range<u64>,
    pagemap: Pagemap,
}

/// The copies of the file data in the guests' RAM and the saving among
/// them over time (module header).
#[derive(Debug)]
pub struct FileCopies {
    guests: Vec<GuestMemory>,
    /// The file pages, in content order.
    pages: Vec<PageWords>,
    /// Content indices by a page's first 8 bytes.
    by_head: HashMap<u64, Vec<u32>>,
    copies: Option<Vec<FileCopy>>,
    /// Frames of every guest page at samples taken before locating.
    pending: Vec<(f64, Vec<Vec<u64>>)>,
    entries: Vec<PagemapEntry>,
    series: Series,
}

fn head(p: &PageWords) -> u64 {
    u64::from(p[0]) | u64::from(p[1]) << 32
}

impl FileCopies {
    /// Reads the files (host) and opens the guests' pagemaps; `system`
    /// names the series.
    pub fn new(system: &str, files: &[PathBuf], guests: &mut [Guest]) -> Result<Self, BenchError> {
        let mut pages = Vec::new();
        for f in files {
            let bytes = std::fs::read(f)
                .map_err(|e| BenchError::Output(format!("{}: {e}", f.display())))?;
            for chunk in bytes.chunks_exact(PAGE_SIZE) {
                let mut w = [0u32; WORDS_PER_PAGE];
                for (word, b) in w.iter_mut().zip(chunk.chunks_exact(4)) {
                    *word = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                }
                pages.push(w);
            }
        }
        let mut by_head: HashMap<u64, Vec<u32>> = HashMap::with_capacity(pages.len());
        for (i, p) in pages.iter().enumerate() {
            by_head.entry(head(p)).or_default().push(i as u32);
        }
        let mut mem = Vec::new();
        for g in guests {
            let ram = g.ram().map_err(guest_error)?;
            mem.push(GuestMemory {
                pid: g.pid(),
                pagemap: Pagemap::open(g.pid())?,
                ram,
            });
        }
        Ok(FileCopies {
            guests: mem,
            pages,
            by_head,
            copies: None,
            pending: Vec::new(),
            entries: Vec::new(),
            series: Series::new(system, metric::FILE_SAVED, "MiB"),
        })
    }

    /// The frame behind every page of every guest's RAM, now.
    fn frames(&mut self) -> Result<Vec<Vec<u64>>, BenchError> {
        let mut out = Vec::with_capacity(self.guests.len());
        for g in &self.guests {
            let n = ((g.ram.end - g.ram.start) / PAGE_SIZE as u64) as usize;
            self.entries.clear();
            self.entries.resize(n, PagemapEntry(0));
            g.pagemap.read(g.ram.start, &mut self.entries)?;
            out.push(
                self.entries
                    .iter()
                    .map(|e| if e.present() { e.pfn().unwrap_or(0) } else { 0 })
                    .collect(),
            );
        }
        Ok(out)
    }

    /// Takes the sample at `t` s (see the module header).
    pub fn sample(&mut self, t: f64) -> Result<(), BenchError> {
        let frames = self.frames()?;
        match &self.copies {
            Some(c) => self
                .series
                .push(t, saved_pages(c, &frames) as f64 * PAGE_MIB),
            None => self.pending.push((t, frames)),
        }
        Ok(())
    }

    /// Finds the copies (module header) and judges the samples taken so
    /// far. Returns the copies found per guest.
    pub fn locate(&mut self) -> Result<Vec<u64>, BenchError> {
        let mut copies = Vec::new();
        let mut per_guest = Vec::new();
        for (k, g) in self.guests.iter().enumerate() {
            let mut ram = GuestRam::open(g.pid, g.ram.end - g.ram.start)?;
            let before = copies.len();
            ram.for_each_page(|addr, page| {
                if !g.ram.contains(&addr) {
                    return;
                }
                let Some(ids) = self.by_head.get(&head(page)) else {
                    return;
                };
                if let Some(&id) = ids.iter().find(|&&id| self.pages[id as usize] == *page) {
                    copies.push(FileCopy {
                        guest: k,
                        page: ((addr - g.ram.start) / PAGE_SIZE as u64) as usize,
                        content: id,
                    });
                }
            })?;
            per_guest.push((copies.len() - before) as u64);
        }
        for (t, frames) in std::mem::take(&mut self.pending) {
            self.series
                .push(t, saved_pages(&copies, &frames) as f64 * PAGE_MIB);
        }
        self.copies = Some(copies);
        Ok(per_guest)
    }

    /// Whether the copies have been located.
    pub fn located(&self) -> bool {
        self.copies.is_some()
    }

    /// The file pages (over all files).
    pub fn file_pages(&self) -> usize {
        self.pages.len()
    }

    /// The located copies less one per file page that has any: what
    /// merging them could save.
    pub fn target_pages(&self) -> Option<u64> {
        let copies = self.copies.as_ref()?;
        let mut held = vec![false; self.pages.len()];
        for c in copies {
            held[c.content as usize] = true;
        }
        let distinct = held.iter().filter(|&&h| h).count();
        Some((copies.len() - distinct) as u64)
    }

    /// The saving of file data so far (MiB; samples before locating
    /// appear once located).
    pub fn series(&self) -> &Series {
        &self.series
    }

    /// The saving of file data over time (MiB).
    pub fn into_series(self) -> Series {
        self.series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(guest: usize, page: usize, content: u32) -> FileCopy {
        FileCopy {
            guest,
            page,
            content,
        }
    }

    #[test]
    fn a_frame_counts_only_when_it_backs_copies_of_one_file_page_alone() {
        // Two guests of 6 pages; file pages 0 and 1, one copy of each per
        // guest: guest 0 at pages 1 and 2, guest 1 at pages 4 and 0.
        let copies = [copy(0, 1, 0), copy(0, 2, 1), copy(1, 4, 0), copy(1, 0, 1)];
        // Nothing merged: every page its own frame.
        let own = vec![vec![10, 11, 12, 13, 14, 15], vec![20, 21, 22, 23, 24, 25]];
        assert_eq!(saved_pages(&copies, &own), 0);
        // File page 0 merged (both copies on frame 99): one page saved.
        let mut merged = own.clone();
        merged[0][1] = 99;
        merged[1][4] = 99;
        assert_eq!(saved_pages(&copies, &merged), 1);
        // Both merged: two.
        merged[0][2] = 98;
        merged[1][0] = 98;
        assert_eq!(saved_pages(&copies, &merged), 2);
        // Before the reads: the copies' pages sit on one KSM frame of
        // zeros, shared with other guest pages and across file pages: no
        // saving of file data.
        let zeros = vec![vec![10, 7, 7, 7, 14, 7], vec![7, 21, 7, 23, 7, 7]];
        assert_eq!(saved_pages(&copies, &zeros), 0);
        // Frame 99 also backs a guest page that is not a copy: not counted.
        let mut shared = merged.clone();
        shared[1][5] = 99;
        assert_eq!(saved_pages(&copies, &shared), 1);
        // Copies of two file pages on one frame: not counted.
        let mut mixed = own;
        mixed[0][1] = 97;
        mixed[0][2] = 97;
        assert_eq!(saved_pages(&copies, &mixed), 0);
        // Pages not present (0) and a missing guest count nothing.
        assert_eq!(saved_pages(&copies, &[vec![0; 6]]), 0);
    }

    #[test]
    fn each_guest_reads_every_file_once_in_an_order_of_its_own() {
        let orders = read_orders(4, 4);
        assert_eq!(orders.len(), 4);
        for o in &orders {
            let mut s = o.clone();
            s.sort();
            assert_eq!(s, [0, 1, 2, 3]);
        }
        for i in 0..orders.len() {
            for j in 0..i {
                assert_ne!(orders[i], orders[j], "guests {i} and {j}");
            }
        }
        assert_eq!(read_orders(4, 4), orders, "reproducible");
        // Two files have two orders: a third guest repeats one.
        let few = read_orders(3, 2);
        assert_eq!(few.len(), 3);
        assert_ne!(few[0], few[1]);
    }

    #[test]
    fn the_read_line_is_parsed_and_checked_against_the_host() {
        let md5 = vec!["a".repeat(32), "b".repeat(32)];
        let log = format!(
            "boot\npagesift-guest: ready files=2\n{READ_MARKER} start=12.5 stop=14.75 md5=1:{},0:{}\n",
            md5[1], md5[0]
        );
        let r = GuestRead::parse(&log).unwrap().unwrap();
        assert_eq!((r.start_s, r.stop_s), (12.5, 14.75));
        assert_eq!(r.sums[0], (1, md5[1].clone()));
        r.check(&md5).unwrap();
        let bad = log.replace(&format!("0:{}", md5[0]), &format!("0:{}", md5[1]));
        let e = GuestRead::parse(&bad)
            .unwrap()
            .unwrap()
            .check(&md5)
            .unwrap_err();
        assert!(e.contains("data-0.bin: md5"), "{e}");
        let short = log.replace(&format!(",0:{}", md5[0]), "");
        let e = GuestRead::parse(&short)
            .unwrap()
            .unwrap()
            .check(&md5)
            .unwrap_err();
        assert!(e.contains("data-0.bin was not read"), "{e}");
        assert!(GuestRead::parse("pagesift-guest: ready files=2\n").is_none());
        // Being written: not yet a line, whatever it holds so far.
        let cut = log.find(" stop=").unwrap() + " stop=14.7".len();
        assert!(GuestRead::parse(&log[..cut]).is_none());
        assert!(GuestRead::parse(&log[..log.len() - 1]).is_none());
        assert!(
            GuestRead::parse(&format!("{READ_MARKER} start=x\n"))
                .unwrap()
                .is_err()
        );
    }

    #[test]
    fn init_waits_for_the_order_and_prints_what_the_harness_parses() {
        assert!(INIT_BODY.contains("< /dev/ttyS1"));
        assert!(INIT_BODY.contains(&format!("echo \"{READ_MARKER} start=")));
        assert!(INIT_BODY.contains(&format!("echo \"{} files=", crate::guest::READY_MARKER)));
    }
}
