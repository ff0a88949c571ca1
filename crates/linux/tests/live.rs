//! Live tests: real `pagesift-workload` processes, discovered, inspected and
//! read through pagesift-linux, checked against the exact counts each
//! workload reports, and checked for harm (checksum, RSS, page tables and
//! present pages unchanged after a full read).
//!
//! They need root (PFNs and other processes' memory). Workloads are small
//! (8–32 MiB) so the suite is quick; throughput is measured by
//! `examples/read_throughput.rs`, not here.

use pagesift_core::source::{MemorySource, PageState, SourceError};
use pagesift_core::{PageRef, PageWords, RegionId, WORDS_PER_PAGE};
use pagesift_linux::discover::{self, ProcessFilter, RegionKind, SmapsReason};
use pagesift_linux::inject::{Advice, InjectConfig, Injector, Outcome, Syscall};
use pagesift_linux::inspect::{PageClass, PageInfo, PageInspector};
use pagesift_linux::kpageflags::KPageFlags;
use pagesift_linux::pagemap::{Pagemap, category};
use pagesift_linux::source::SmapsReads;
use pagesift_linux::{Capability, LinuxError, LinuxSource, RemoteReader, SourceConfig};
use pagesift_testkit::*;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

fn source_for(pids: &[u32]) -> LinuxSource {
    LinuxSource::new(
        ProcessFilter::pids(pids.iter().copied()),
        SourceConfig::default(),
    )
    .expect("LinuxSource")
}

/// The region of `src` that starts at `start` in process `pid`.
fn region_at(src: &LinuxSource, pid: u32, start: u64) -> RegionId {
    src.linux_regions()
        .find(|r| r.pid == pid && r.start == start)
        .unwrap_or_else(|| panic!("no region of {pid} at {start:#x}"))
        .id
}

/// `pid`'s regions in `src`: (first address, pages, mergeable, id), in
/// address order.
fn regions_of(src: &LinuxSource, pid: u32) -> Vec<(u64, u32, bool, RegionId)> {
    let mut v: Vec<_> = (src.linux_regions())
        .filter(|r| r.pid == pid)
        .map(|r| (r.start, r.pages, r.mergeable, r.id))
        .collect();
    v.sort();
    v
}

/// Classes of every page of a region.
fn classes(src: &mut LinuxSource, region: RegionId) -> Vec<PageInfo> {
    let pages = src.region(region).unwrap().pages;
    let mut out = vec![PageInfo::default(); pages as usize];
    for (k, chunk) in out.chunks_mut(512).enumerate() {
        src.inspect(region, (k * 512) as u32, chunk)
            .expect("inspect");
    }
    out
}

/// Reads every page of `region` whose class is in `which`; returns the
/// contents in page order.
fn read_all(
    src: &mut LinuxSource,
    region: RegionId,
    infos: &[PageInfo],
    which: &[PageClass],
) -> Vec<Vec<u32>> {
    let refs: Vec<PageRef> = infos
        .iter()
        .enumerate()
        .filter(|(_, i)| which.contains(&i.class()))
        .map(|(p, _)| PageRef {
            region,
            page: p as u32,
        })
        .collect();
    let mut buf = vec![[0u32; WORDS_PER_PAGE]; 1024];
    let mut out = Vec::with_capacity(refs.len());
    for batch in refs.chunks(1024) {
        let n = src.read_pages(batch, &mut buf[..batch.len()]);
        assert_eq!(n, batch.len(), "a present page could not be read");
        out.extend(buf[..n].iter().map(|p| p.to_vec()));
    }
    out
}

/// (distinct, duplicate pages, pages with duplicates, duplicated contents)
fn content_counts<'a>(pages: impl IntoIterator<Item = &'a Vec<u32>>) -> (u64, u64, u64, u64) {
    let mut m: HashMap<&Vec<u32>, u64> = HashMap::new();
    let mut n = 0;
    for p in pages {
        *m.entry(p).or_default() += 1;
        n += 1;
    }
    let distinct = m.len() as u64;
    let with_dups: u64 = m.values().filter(|&&c| c > 1).sum();
    let dup_contents = m.values().filter(|&&c| c > 1).count() as u64;
    (distinct, n - distinct, with_dups, dup_contents)
}

fn count_class(infos: &[PageInfo], c: PageClass) -> u64 {
    infos.iter().filter(|i| i.class() == c).count() as u64
}

#[test]
fn discovery_finds_the_workload_and_never_itself() {
    require_root();
    let w = Workload::start(&["static-dup", "--mib", "8"]);
    let pid = w.pid();
    let (start, pages) = w.region();

    let all = discover::list_processes(&ProcessFilter::all()).unwrap();
    assert!(all.iter().any(|p| p.pid == pid));
    assert!(all.iter().all(|p| p.pid != std::process::id()));

    let me = all.iter().find(|p| p.pid == pid).unwrap().clone();
    let by_comm = discover::list_processes(&ProcessFilter {
        comms: vec!["pagesift-worklo".into()], // comm is cut to 15 bytes
        ..Default::default()
    })
    .unwrap();
    assert!(by_comm.iter().any(|p| p.pid == pid));
    assert!(by_comm.iter().all(|p| p.comm == "pagesift-worklo"));
    let by_uid_cgroup = discover::list_processes(&ProcessFilter {
        uids: vec![me.uid],
        cgroups: vec![me.cgroup.clone()],
        ..Default::default()
    })
    .unwrap();
    assert!(by_uid_cgroup.iter().any(|p| p.pid == pid));
    let other_uid = discover::list_processes(&ProcessFilter {
        pids: vec![pid],
        uids: vec![me.uid + 12345],
        ..Default::default()
    })
    .unwrap();
    assert!(other_uid.is_empty());

    let regions = discover::process_regions(pid).unwrap();
    let r = regions
        .eligible
        .iter()
        .find(|r| r.start == start)
        .expect("workload region kept");
    assert_eq!(r.pages(), pages);
    assert_eq!(r.kind, RegionKind::Anonymous);
    assert!(!r.mergeable, "workloads never call MADV_MERGEABLE");
    // The vDSO/vvar special mappings are never kept.
    assert!(!regions.rejected.is_empty());
    let kept: HashSet<u64> = regions.eligible.iter().map(|r| r.start).collect();
    assert!(regions.rejected.iter().all(|r| !kept.contains(&r.start)));

    // A thread id selects its process.
    let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    let tid = *tids
        .iter()
        .find(|&&t| t != pid)
        .expect("the workload's command thread");
    let by_tid = discover::list_processes(&ProcessFilter::pids([tid, pid])).unwrap();
    assert_eq!(by_tid.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![pid]);

    // Naming pagesift's own process is refused.
    let own = std::process::id();
    assert!(matches!(
        discover::list_processes(&ProcessFilter::pids([own])),
        Err(LinuxError::OwnProcess(_))
    ));
    assert!(matches!(
        discover::process_regions(own),
        Err(LinuxError::OwnProcess(_))
    ));
}

/// A source over many processes at once, selected by cgroup (the
/// workloads inherit this test's) and command name (so that the test opens
/// no process it did not start).
#[test]
fn a_source_over_a_cgroup_covers_all_its_selected_processes() {
    require_root();
    let w1 = Workload::start(&["random", "--mib", "1"]);
    let w2 = Workload::start(&["static-dup", "--mib", "1"]);
    let me = procfs::process::Process::myself().unwrap();
    let mine: Vec<String> = me
        .cgroups()
        .unwrap()
        .into_iter()
        .map(|c| c.pathname)
        .filter(|p| p != "/")
        .collect();
    if mine.is_empty() {
        eprintln!("skipped: this test runs in the root cgroup of every hierarchy");
        return;
    }
    let filter = ProcessFilter {
        cgroups: mine,
        comms: vec!["pagesift-worklo".into()],
        ..Default::default()
    };
    let src = LinuxSource::new(filter, SourceConfig::default()).unwrap();
    let pids: HashSet<u32> = src.processes().map(|p| p.pid).collect();
    assert!(pids.contains(&w1.pid()) && pids.contains(&w2.pid()));
    assert!(src.processes().all(|p| p.comm == "pagesift-worklo"));
    region_at(&src, w1.pid(), w1.region().0);
    region_at(&src, w2.pid(), w2.region().0);
    assert!(src.regions().iter().all(|r| r.owner != std::process::id()));
}

#[test]
fn a_pid_that_does_not_exist_says_so() {
    require_root();
    let e =
        LinuxSource::new(ProcessFilter::pids([NO_SUCH_PID]), SourceConfig::default()).unwrap_err();
    assert!(matches!(e, LinuxError::NoSuchProcess(NO_SUCH_PID)), "{e:?}");
    assert_eq!(e.to_string(), format!("no process with pid {NO_SUCH_PID}"));
    assert!(matches!(
        discover::process_regions(NO_SUCH_PID),
        Err(LinuxError::NoSuchProcess(_))
    ));
    assert!(matches!(
        Pagemap::open(NO_SUCH_PID),
        Err(LinuxError::NoSuchProcess(_))
    ));
}

/// Checks one workload's region against its report, page class by page
/// class and content by content.
fn check_against_report(args: &[&str]) {
    let w = Workload::start(args);
    let pid = w.pid();
    let (start, pages) = w.region();
    let mut src = source_for(&[pid]);
    let id = region_at(&src, pid, start);
    assert_eq!(src.region(id).unwrap().pages as u64, pages);
    let infos = classes(&mut src, id);
    assert_eq!(
        count_class(&infos, PageClass::Anon),
        w.count("present_pages"),
        "{args:?}"
    );
    assert_eq!(
        count_class(&infos, PageClass::Zero),
        w.count("zero_pages"),
        "{args:?}"
    );
    assert_eq!(
        count_class(&infos, PageClass::NotPresent),
        w.count("untouched_pages"),
        "{args:?}"
    );
    let contents = read_all(&mut src, id, &infos, &[PageClass::Anon]);
    let (distinct, dup, with_dups, dup_contents) = content_counts(&contents);
    assert_eq!(distinct, w.count("distinct_contents"), "{args:?}");
    assert_eq!(dup, w.count("duplicate_pages"), "{args:?}");
    assert_eq!(with_dups, w.count("pages_with_duplicates"), "{args:?}");
    assert_eq!(dup_contents, w.count("duplicated_contents"), "{args:?}");
    // Zero-page mappings read as zeros.
    for z in read_all(&mut src, id, &infos, &[PageClass::Zero]) {
        assert!(z.iter().all(|&x| x == 0));
    }
}

#[test]
fn static_dup_contents_match_the_report() {
    require_root();
    check_against_report(&[
        "static-dup",
        "--mib",
        "8",
        "--contents",
        "5",
        "--hole-every",
        "9",
        "--zero-every",
        "7",
        "--untouched-mib",
        "2",
        "--seed",
        "3",
    ]);
}

#[test]
fn random_contents_match_the_report() {
    require_root();
    check_against_report(&["random", "--mib", "8", "--hole-every", "4", "--seed", "4"]);
}

#[test]
fn mixed_contents_match_the_report() {
    require_root();
    check_against_report(&[
        "mixed",
        "--mib",
        "16",
        "--dup-ratio",
        "0.3",
        "--run-pages",
        "8",
        "--dup-contents",
        "20",
        "--zero-every",
        "13",
        "--seed",
        "5",
    ]);
}

#[test]
fn cow_broken_contents_match_the_report() {
    require_root();
    check_against_report(&["cow-broken", "--mib", "4", "--interval-ms", "1"]);
}

#[test]
fn fork_family_frames_and_contents_match_the_report() {
    require_root();
    let w = Workload::start(&[
        "fork-family",
        "--mib",
        "8",
        "--children",
        "3",
        "--dirty-fraction",
        "0.3",
        "--dup-ratio",
        "0.4",
        "--seed",
        "6",
    ]);
    let mut pids = vec![w.pid()];
    pids.extend(w.children());
    assert_eq!(pids.len(), 4);
    let (start, _) = w.region();
    let mut src = source_for(&pids);
    let mut all_pages = Vec::new();
    let mut pfns = HashSet::new();
    let mut virt = 0;
    for &pid in &pids {
        let id = region_at(&src, pid, start);
        let infos = classes(&mut src, id);
        let anon: Vec<&PageInfo> = infos
            .iter()
            .filter(|i| i.class() == PageClass::Anon)
            .collect();
        virt += anon.len() as u64;
        pfns.extend(anon.iter().map(|i| i.pfn().unwrap()));
        // Pages still shared with the parent are not exclusive.
        if pid != w.pid() {
            let shared = anon.iter().filter(|i| !i.exclusive()).count();
            assert!(
                shared > 0,
                "child {pid}: {} pages, none shared with the parent",
                anon.len()
            );
        }
        all_pages.extend(read_all(&mut src, id, &infos, &[PageClass::Anon]));
    }
    assert_eq!(virt, w.count("family.virtual_present_pages"));
    assert_eq!(pfns.len() as u64, w.count("family.physical_pages"));
    let (distinct, dup_virtual, _, _) = content_counts(&all_pages);
    assert_eq!(distinct, w.count("family.distinct_contents"));
    assert_eq!(dup_virtual, w.count("family.duplicate_pages_virtual"));
    assert_eq!(
        pfns.len() as u64 - distinct,
        w.count("family.duplicate_pages")
    );
}

#[test]
fn a_full_read_changes_nothing_in_the_target() {
    require_root();
    let mut w = Workload::start(&[
        "static-dup",
        "--mib",
        "16",
        "--contents",
        "3",
        "--hole-every",
        "5",
        "--zero-every",
        "11",
        "--untouched-mib",
        "8",
    ]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let sum_before = w.checksum(); // also warms up the workload's command thread
    // The command thread goes on for a moment after its answer (back to
    // its read of stdin): measure once the process has stopped changing,
    // so that its last page, not ours, is not counted against the reads
    // (seen once under the full suite's load: RSS + 4 kB).
    let mut rss_pte = rss_and_pte(pid);
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = rss_and_pte(pid);
        if now == rss_pte {
            break;
        }
        rss_pte = now;
    }
    let (rss0, pte0) = rss_pte;
    let present0 = present_count(pid, start, pages);
    let entries0 = pagemap_entries(pid, start, pages);

    // Read every page of every region the source offers, asking for all of
    // them, present or not: the source must refuse the non-present ones.
    let mut src = source_for(&[pid]);
    let ids: Vec<RegionId> = src.regions().iter().map(|r| r.id).collect();
    let mut read = 0;
    let mut refused = 0;
    let mut buf = vec![[0u32; WORDS_PER_PAGE]; 256];
    for id in ids {
        let infos = classes(&mut src, id);
        for (p, info) in infos.iter().enumerate() {
            let class = info.class();
            let page = PageRef {
                region: id,
                page: p as u32,
            };
            match src.read_page(page, &mut buf[0]) {
                Ok(()) => {
                    assert!(class.resident(), "read a non-present page ({class:?})");
                    read += 1;
                }
                Err(SourceError::Other(msg)) => {
                    assert!(!class.resident(), "{class:?}: {msg}");
                    refused += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert!(read >= w.count("present_pages") + w.count("zero_pages"));
    assert!(refused >= w.count("untouched_pages"));

    let (rss1, pte1) = rss_and_pte(pid);
    assert_eq!(
        present_count(pid, start, pages),
        present0,
        "a page was faulted in"
    );
    assert!(rss1 <= rss0, "RSS grew from {rss0} to {rss1} kB");
    assert!(pte1 <= pte0, "VmPTE grew from {pte0} to {pte1} kB");
    // Same frames, same flags: nothing was copied or remapped.
    assert!(
        pagemap_entries(pid, start, pages) == entries0,
        "pagemap changed"
    );
    assert_eq!(w.checksum(), sum_before, "the target's memory changed");
}

/// Control for `access_marks`: a remote read marks the pages it reads as
/// used (`FOLL_TOUCH`, then `folio_mark_accessed`), although the process
/// never touched them; its memory is unchanged. The bench's notes count
/// this over each experiment's workload, beside the kernel's KSM.
#[test]
fn control_a_remote_read_marks_the_pages_it_reads_referenced() {
    require_root();
    let mut w = Workload::start(&["random", "--mib", "4"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let sum = w.checksum();
    let mut flags = KPageFlags::open().expect("kpageflags");
    let before = pagesift_linux::access_marks::of_process(pid, &mut flags).expect("marks");
    let mut reader = RemoteReader::new(pid).expect("reader");
    let mut out = vec![[0u32; WORDS_PER_PAGE]; pages as usize];
    let addrs: Vec<u64> = (0..pages).map(|k| start + k * 4096).collect();
    assert_eq!(
        reader.read_pages_unpinned(&addrs, &mut out).unwrap(),
        pages as usize
    );
    let after = pagesift_linux::access_marks::of_process(pid, &mut flags).expect("marks");
    // Each page went one step up (referenced, or from referenced to
    // active); none was already active.
    assert!(before.active < pages / 10, "{before:?}");
    assert!(
        after.use_steps() >= before.use_steps() + pages * 9 / 10,
        "{pages} pages read: {before:?} → {after:?}"
    );
    assert_eq!(w.checksum(), sum, "the target's memory changed");
}

/// Reading a fork family must not unshare the pages the children still
/// share with the parent (a pinned read would copy each of them).
#[test]
fn a_full_read_of_a_fork_family_keeps_shared_pages_shared() {
    require_root();
    let mut w = Workload::start(&[
        "fork-family",
        "--mib",
        "8",
        "--children",
        "2",
        "--dirty-fraction",
        "0.25",
        "--hole-every",
        "10",
        "--seed",
        "9",
    ]);
    let mut pids = vec![w.pid()];
    pids.extend(w.children());
    let (start, pages) = w.region();
    let sum = w.checksum();
    let snapshot = |pids: &[u32]| -> Vec<_> {
        pids.iter()
            .map(|&p| pagemap_entries(p, start, pages))
            .collect()
    };
    let before = snapshot(&pids);
    let shared_before = before[0]
        .iter()
        .filter(|e| e.present() && !e.exclusive())
        .count();
    assert!(shared_before > 0);

    let mut src = source_for(&pids);
    let ids: Vec<RegionId> = src.regions().iter().map(|r| r.id).collect();
    let mut read = 0;
    for id in ids {
        let infos = classes(&mut src, id);
        read += read_all(&mut src, id, &infos, &[PageClass::Anon, PageClass::Zero]).len();
    }
    assert!(read as u64 >= 3 * w.count("present_pages"));
    assert!(
        snapshot(&pids) == before,
        "a read changed a frame or its sharing"
    );
    assert_eq!(w.checksum(), sum);
}

/// The control for the test above: a pinned read (`process_vm_readv`) of
/// pages shared after fork makes the kernel copy them in the target.
#[test]
fn control_a_pinned_read_unshares_fork_shared_pages() {
    require_root();
    let w = Workload::start(&[
        "fork-family",
        "--mib",
        "1",
        "--children",
        "1",
        "--dirty-fraction",
        "0",
    ]);
    let (start, pages) = w.region();
    let before = pagemap_entries(w.pid(), start, pages);
    assert!(before.iter().all(|e| e.present() && !e.exclusive()));
    let mut r = RemoteReader::new(w.pid()).unwrap();
    let mut buf = vec![[0u32; WORDS_PER_PAGE]; pages as usize];
    assert_eq!(
        r.read_range_unpinned(start, &mut buf).unwrap(),
        pages as usize
    );
    assert!(
        pagemap_entries(w.pid(), start, pages) == before,
        "the unpinned read changed it"
    );
    assert_eq!(r.read_range(start, &mut buf).unwrap(), pages as usize);
    let after = pagemap_entries(w.pid(), start, pages);
    let copied = after
        .iter()
        .zip(&before)
        .filter(|(a, b)| a.pfn() != b.pfn())
        .count();
    assert_eq!(copied as u64, pages, "every shared page got a new frame");
    assert!(after.iter().all(|e| e.exclusive()));
}

/// The control for the test above: a remote read of an untouched page
/// (bypassing the presence check) does fault it in and allocate page
/// tables, so the checks above can fail.
#[test]
fn control_a_blind_remote_read_faults_pages_in() {
    require_root();
    let w = Workload::start(&["random", "--mib", "1", "--untouched-mib", "8"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let tail = start + 4 * (1 << 20); // 4 MiB into the untouched tail
    let present0 = present_count(pid, start, pages);
    let (_, pte0) = rss_and_pte(pid);
    let mut r = RemoteReader::new(pid).unwrap();
    let mut buf = vec![[0u32; WORDS_PER_PAGE]; 16];
    assert_eq!(r.read_range(tail, &mut buf).unwrap(), 16);
    assert_eq!(present_count(pid, start, pages), present0 + 16);
    let (_, pte1) = rss_and_pte(pid);
    assert!(
        pte1 > pte0,
        "no page table was allocated ({pte0} -> {pte1} kB)"
    );
}

#[test]
fn read_pages_stops_at_a_non_present_page() {
    require_root();
    let w = Workload::start(&["random", "--mib", "1", "--hole-every", "3"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let mut src = source_for(&[pid]);
    let id = region_at(&src, pid, start);
    let p = |i| PageRef {
        region: id,
        page: i,
    };
    assert_eq!(src.page_state(p(0)), Ok(PageState::Present));
    assert_eq!(src.page_state(p(2)), Ok(PageState::NotPresent));
    let mut out = vec![[0u32; WORDS_PER_PAGE]; 4];
    assert_eq!(src.read_pages(&[p(0), p(1), p(2), p(3)], &mut out), 2);
    assert!(matches!(
        src.read_page(p(2), &mut out[0]),
        Err(SourceError::Other(_))
    ));
    assert!(matches!(
        src.page_state(p(pages as u32)),
        Err(SourceError::OutOfRange(_))
    ));
    assert_eq!(
        present_count(pid, start, pages) as u64,
        w.count("present_pages")
    );
}

/// A process whose `ksm_stat` says no VMA is mergeable is discovered from
/// maps, and that look stands for an smaps read of its `mg` flags: after
/// pagesift marks a range of it (and records it, as the daemon does), the
/// next refresh still reads maps, not smaps' walk of every present page,
/// and knows the range is mergeable. The target keeps its memory.
#[test]
fn a_process_with_nothing_mergeable_is_refreshed_from_maps_after_a_mark() {
    require_root();
    let _g = serial();
    let mut w = Workload::start(&["static-dup", "--mib", "8"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let sum_before = w.checksum();
    let ksm_stat = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).unwrap();
    assert!(
        ksm_stat.contains("ksm_mergeable: no"),
        "this kernel's ksm_stat says whether a VMA is mergeable (Linux 6.14+): {ksm_stat}"
    );
    let mut src = source_for(&[pid]);
    let reads = |src: &LinuxSource| (src.discovery().smaps_total(), src.discovery().maps);
    assert_eq!(reads(&src), (0, 1), "discovered from maps");
    assert!(src.smaps_reads().is_empty());
    let len = pages * pagesift_core::PAGE_SIZE as u64;
    let mut inj = Injector::new(InjectConfig::default());
    let advice = Syscall::Madvise {
        addr: start,
        len,
        advice: Advice::Mergeable,
    };
    let done = inj.run(pid, &[advice]).expect("injection");
    assert!(
        matches!(done, Outcome::Done(ref i) if i.results == vec![0]),
        "{done:?}"
    );
    src.note_advised(pid, start, start + len, true);
    src.refresh().unwrap();
    assert_eq!(reads(&src), (0, 2), "the refresh after the mark read maps");
    let r = region_at(&src, pid, start);
    assert!(src.linux_regions().any(|x| x.id == r && x.mergeable));
    // What is known of its `mg` flags forgotten (as after an unmark the
    // daemon could not confirm), the next refresh reads smaps, and says
    // why, for the process.
    src.distrust_mergeable(pid);
    src.refresh().unwrap();
    assert_eq!(reads(&src), (1, 2));
    assert_eq!(
        src.discovery().smaps.get(&SmapsReason::MergeableUnknown),
        Some(&1),
        "{:?}",
        src.discovery()
    );
    assert_eq!(
        src.smaps_reads(),
        vec![SmapsReads {
            pid,
            reads: 1,
            last: SmapsReason::MergeableUnknown
        }]
    );
    let r = region_at(&src, pid, start);
    assert!(src.linux_regions().any(|x| x.id == r && x.mergeable));
    // Unmarked again; the workload's pages are as it wrote them.
    let undo = Syscall::Madvise {
        addr: start,
        len,
        advice: Advice::Unmergeable,
    };
    assert!(matches!(inj.run(pid, &[undo]), Ok(Outcome::Done(_))));
    assert!(w.alive());
    assert_eq!(
        w.checksum(),
        sum_before,
        "the workload's memory is unchanged"
    );
}

#[test]
fn a_process_killed_mid_read_is_gone() {
    require_root();
    let mut w = Workload::start(&["random", "--mib", "32"]);
    let pid = w.pid();
    let (start, _) = w.region();
    let mut src = source_for(&[pid]);
    let id = region_at(&src, pid, start);
    let pages = src.region(id).unwrap().pages;
    let refs: Vec<PageRef> = (0..pages)
        .map(|page| PageRef { region: id, page })
        .collect();
    let mut buf = vec![[0u32; WORDS_PER_PAGE]; 256];
    let mut reader = RemoteReader::new(pid).unwrap();
    assert_eq!(src.read_pages(&refs[..256], &mut buf), 256);
    w.kill();
    // Keep reading; within a few seconds the exit completes and every
    // access reports the region gone.
    let t = std::time::Instant::now();
    let err = loop {
        let mut one: PageWords = [0; WORDS_PER_PAGE];
        match src.read_page(
            refs[(t.elapsed().as_micros() as usize) % refs.len()],
            &mut one,
        ) {
            Ok(()) => assert!(
                t.elapsed().as_secs() < 10,
                "still readable 10 s after SIGKILL"
            ),
            Err(e) => break e,
        }
    };
    assert_eq!(err, SourceError::Gone(id));
    assert_eq!(src.gone(), &[pid]);
    assert_eq!(src.page_state(refs[0]), Err(SourceError::Gone(id)));
    assert!(src.regions().is_empty());
    // The lower layers say the same once it is reaped, by both read paths;
    // a new reader finds no such process.
    w.wait();
    assert!(matches!(
        reader.read_range(start, &mut buf[..1]),
        Err(LinuxError::Gone(_))
    ));
    assert!(matches!(
        reader.read_range_unpinned(start, &mut buf[..1]),
        Err(LinuxError::Gone(_))
    ));
    assert!(matches!(
        RemoteReader::new(pid),
        Err(LinuxError::NoSuchProcess(_))
    ));
    // A named pid that has exited is dropped on refresh, not an error, and
    // is counted once.
    src.refresh().unwrap();
    assert!(src.regions().is_empty());
    assert_eq!(src.take_gone(), vec![pid]);
    src.refresh().unwrap();
    assert!(src.gone().is_empty());
}

#[test]
fn pagemap_readers_see_a_gone_process() {
    require_root();
    let mut w = Workload::start(&["random", "--mib", "1"]);
    let pid = w.pid();
    let (start, _) = w.region();
    let pm = Pagemap::open(pid).unwrap();
    w.kill();
    w.wait();
    let mut e = vec![pagesift_linux::pagemap::PagemapEntry(0); 8];
    assert!(matches!(pm.read(start, &mut e), Err(LinuxError::Gone(p)) if p == pid));
}

#[test]
fn missing_capabilities_are_named() {
    require_root();
    let w = Workload::start(&["random", "--mib", "1"]);
    let pid = w.pid();
    let (start, _) = w.region();

    // Without CAP_SYS_ADMIN: no PFNs.
    let e = std::thread::spawn(move || {
        pagesift_linux::caps::drop_from_this_thread(&[Capability::SysAdmin]).unwrap();
        LinuxSource::new(ProcessFilter::pids([pid]), SourceConfig::default()).unwrap_err()
    })
    .join()
    .unwrap();
    assert!(
        matches!(
            e,
            LinuxError::MissingCapability {
                cap: Capability::SysAdmin,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}");

    // A pagemap opened without CAP_SYS_ADMIN hides PFNs; inspecting it
    // names the capability instead of misreading PFN 0.
    let kpf = KPageFlags::open().unwrap();
    let e = std::thread::spawn(move || {
        pagesift_linux::caps::drop_from_this_thread(&[Capability::SysAdmin]).unwrap();
        let pm = Pagemap::open(pid).unwrap();
        assert!(!pm.pfns_visible());
        let mut ins = PageInspector::with(pm, kpf);
        let mut out = vec![PageInfo::default(); 4];
        ins.inspect(start, &mut out).unwrap_err()
    })
    .join()
    .unwrap();
    assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}");

    // Without CAP_SYS_PTRACE the memory of a process with more privileges
    // cannot be read, and the error names the capability, whether it comes
    // from a reader or from a whole source.
    let (e1, e2) = std::thread::spawn(move || {
        pagesift_linux::caps::drop_from_this_thread(&[Capability::SysPtrace]).unwrap();
        let e1 = RemoteReader::new(pid).unwrap_err();
        let e2 = LinuxSource::new(ProcessFilter::pids([pid]), SourceConfig::default()).unwrap_err();
        (e1, e2)
    })
    .join()
    .unwrap();
    // The page map needs only ptrace *read* access, which CAP_SYS_ADMIN and
    // CAP_PERFMON also grant on this kernel; without all three it is refused.
    let e3 = std::thread::spawn(move || {
        use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
        let mut s = capabilities(None).unwrap();
        let drop = CapabilitySet::SYS_PTRACE | CapabilitySet::SYS_ADMIN | CapabilitySet::PERFMON;
        s.effective.remove(drop);
        s.permitted.remove(drop);
        set_capabilities(None, s).unwrap();
        Pagemap::open(pid).unwrap_err()
    })
    .join()
    .unwrap();
    for e in [e1, e2, e3] {
        assert!(
            matches!(
                e,
                LinuxError::MissingCapability {
                    cap: Capability::SysPtrace,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("CAP_SYS_PTRACE"), "{e}");
    }
}

/// The workload of the two PAGEMAP_SCAN tests ([`HOLEY_STATIC_DUP`]).
fn holey_static_dup() -> Workload {
    Workload::start(HOLEY_STATIC_DUP)
}

/// A region's present page runs (one PAGEMAP_SCAN walk) cover exactly the
/// pages that pagemap, read entry by entry, shows present: holes, zero-page
/// mappings and untouched memory in between.
#[test]
fn present_page_runs_cover_exactly_the_present_pages() {
    require_root();
    let w = holey_static_dup();
    let pid = w.pid();
    let (start, _) = w.region();
    let mut src = source_for(&[pid]);
    let id = region_at(&src, pid, start);
    let runs = src.present_page_runs(id).expect("present runs");
    assert!(
        runs.windows(2).all(|r| r[0].1 <= r[1].0),
        "sorted, disjoint"
    );
    let infos = classes(&mut src, id);
    let mut present = 0;
    for (i, info) in infos.iter().enumerate() {
        let in_runs = runs.iter().any(|&(a, b)| (a..b).contains(&(i as u32)));
        let shown = info.class().state() != PageState::NotPresent;
        assert_eq!(in_runs, shown, "page {i}: {:?}", info.class());
        present += shown as u64;
    }
    assert_eq!(present, w.count("present_pages") + w.count("zero_pages"));
}

#[test]
fn pagemap_scan_agrees_with_pagemap() {
    require_root();
    let w = holey_static_dup();
    let pid = w.pid();
    let (start, pages) = w.region();
    let pm = Pagemap::open(pid).unwrap();
    let runs = pm.present_runs(start, start + pages * 4096).unwrap();
    let present: u64 = runs.iter().map(|r| (r.end - r.start) / 4096).sum();
    let zero: u64 = runs
        .iter()
        .filter(|r| r.categories & category::PFNZERO != 0)
        .map(|r| (r.end - r.start) / 4096)
        .sum();
    assert_eq!(present, present_count(pid, start, pages) as u64);
    assert_eq!(present, w.count("present_pages") + w.count("zero_pages"));
    assert_eq!(zero, w.count("zero_pages"));
}

#[test]
fn thp_pages_are_flagged_as_the_kernel_accounts_them() {
    require_root();
    let w = Workload::start(&["random", "--mib", "8", "--thp"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let mut src = source_for(&[pid]);
    let id = region_at(&src, pid, start);
    let infos = classes(&mut src, id);
    let thp = infos.iter().filter(|i| i.thp()).count() as u64;
    // The kernel's own account of the region: smaps AnonHugePages.
    let smaps = procfs::process::Process::new(pid as i32)
        .unwrap()
        .smaps()
        .unwrap();
    let m = smaps.iter().find(|m| m.address.0 == start).unwrap();
    let huge_kb = m.extension.map.get("AnonHugePages").copied().unwrap_or(0) / 1024;
    assert_eq!(thp * 4, huge_kb);
    assert_eq!(count_class(&infos, PageClass::Anon), pages);
    // And the contents are still all distinct.
    let contents = read_all(&mut src, id, &infos, &[PageClass::Anon]);
    assert_eq!(content_counts(&contents).0, w.count("distinct_contents"));
}

#[test]
fn region_ids_are_stable_and_never_reused() {
    require_root();
    let w = Workload::start(&["static-dup", "--mib", "2"]);
    let pid = w.pid();
    let (start, _) = w.region();
    let mut src = source_for(&[pid]);
    let ids = |src: &LinuxSource| -> HashMap<u64, RegionId> {
        src.linux_regions().map(|r| (r.start, r.id)).collect()
    };
    let before = ids(&src);
    src.refresh().unwrap();
    let after = ids(&src);
    // Every region still there keeps its id (the workload may still be
    // starting its command thread, which adds regions).
    assert!(before.len() > 5);
    for (s, id) in &before {
        if let Some(id2) = after.get(s) {
            assert_eq!(id, id2);
        }
    }
    assert_eq!(before[&start], after[&start]);

    // A region that goes away and comes back is a new region.
    let s = Workload::start(&["short-lived", "--mib", "2", "--period-ms", "150"]);
    let (start, _) = s.region();
    let mut src = source_for(&[s.pid()]);
    let first = region_at(&src, s.pid(), start);
    let t = std::time::Instant::now();
    let mut saw_gone = false;
    let later = loop {
        assert!(
            t.elapsed().as_secs() < 10,
            "the short-lived region never cycled"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        src.refresh().unwrap();
        match src
            .linux_regions()
            .find(|r| r.start == start && r.pages == 512)
        {
            None => saw_gone = true,
            Some(r) if saw_gone => break r.id,
            Some(_) => {}
        }
    };
    assert_ne!(later, first);
    assert!(later > first);
    let mut page: PageWords = [0; WORDS_PER_PAGE];
    // The old id finds nothing.
    assert_eq!(
        src.read_page(
            PageRef {
                region: first,
                page: 0
            },
            &mut page
        ),
        Err(SourceError::Gone(first))
    );
}

#[test]
fn long_regions_are_sliced() {
    require_root();
    let w = Workload::start(&["static-dup", "--mib", "4"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let config = SourceConfig {
        max_region_pages: 300,
        ..SourceConfig::default()
    };
    let src = LinuxSource::new(ProcessFilter::pids([pid]), config).unwrap();
    let slices: Vec<_> = src
        .linux_regions()
        .filter(|r| r.start >= start && r.start < start + pages * 4096)
        .collect();
    // Cut at multiples of 300 pages in the address space: one slice per
    // 300-page window the VMA touches, the inner ones full and aligned.
    let (first, last) = (start / 4096, start / 4096 + pages - 1);
    assert_eq!(slices.len() as u64, last / 300 - first / 300 + 1);
    assert_eq!(slices.iter().map(|r| r.pages as u64).sum::<u64>(), pages);
    assert!(slices.iter().all(|r| r.pages <= 300));
    for s in &slices[1..] {
        assert_eq!(
            s.start / 4096 % 300,
            0,
            "slice at {:#x} is not aligned",
            s.start
        );
        assert_eq!((s.vma_start, s.vma_end), (start, start + pages * 4096));
    }
    // A VMA that fits in one slice is one region, wherever it lies.
    let whole = LinuxSource::new(
        ProcessFilter::pids([pid]),
        SourceConfig {
            max_region_pages: pages as u32,
            ..SourceConfig::default()
        },
    )
    .unwrap();
    let r = whole
        .linux_regions()
        .find(|r| r.start == start)
        .expect("the VMA's region");
    assert_eq!(r.pages as u64, pages);
    for w in slices.windows(2) {
        assert_eq!(
            w[0].start + w[0].pages as u64 * 4096,
            w[1].start,
            "slices are contiguous"
        );
    }
}

/// The helper process of [`maps_discovery_agrees_with_smaps`] (run by it,
/// ignored otherwise): maps one VMA of each kind discovery must tell
/// apart, prints their addresses and obeys commands from stdin.
#[test]
#[ignore = "helper process of maps_discovery_agrees_with_smaps"]
fn vma_zoo_child() {
    use pagesift_linux::sys::{AnonMapping, HugePages, KindMapping, MappingKind};
    use std::io::BufRead;
    use std::os::fd::AsFd;
    if std::env::var_os("PAGESIFT_VMA_ZOO").is_none() {
        return;
    }
    const LEN: usize = 16 << 12;
    let mut anon = AnonMapping::new(LEN, HugePages::Never).unwrap();
    anon.as_mut_slice().fill(7);
    // An unlinked file: private and shared file mappings of it.
    let file = tempfile::tempfile().unwrap();
    file.set_len(LEN as u64).unwrap();
    let zero = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/zero")
        .unwrap();
    let private = KindMapping::new(LEN, MappingKind::PrivateFile(file.as_fd()), 1).unwrap();
    let shared_file = KindMapping::new(LEN, MappingKind::SharedFile(file.as_fd()), 2).unwrap();
    let dev_zero = KindMapping::new(LEN, MappingKind::PrivateFile(zero.as_fd()), 3).unwrap();
    let shared = KindMapping::new(LEN, MappingKind::SharedAnonymous, 4).unwrap();
    let mut droppable = Some(KindMapping::new(LEN, MappingKind::Droppable, 5).unwrap());
    // Only where huge pages are reserved (vm.nr_hugepages).
    let hugetlb = KindMapping::new(2 << 20, MappingKind::HugetlbAnonymous, 6).ok();
    let addr = |m: &Option<KindMapping>| m.as_ref().map_or(0, |m| m.addr());
    println!(
        "ZOO anon={} private={} shared_file={} dev_zero={} shared={} droppable={} hugetlb={}",
        anon.addr(),
        private.addr(),
        shared_file.addr(),
        dev_zero.addr(),
        shared.addr(),
        addr(&droppable),
        addr(&hugetlb)
    );
    let mut mergeable = None;
    let mut many: Option<AnonMapping> = None;
    for line in std::io::stdin().lock().lines() {
        let at = match line.unwrap().as_str() {
            "unmap-droppable" => {
                drop(droppable.take());
                0
            }
            "mergeable" => {
                let m = KindMapping::new(LEN, MappingKind::Mergeable, 8).unwrap();
                mergeable.insert(m).addr()
            }
            // MANY one-page VMAs, every fourth page written, the rest
            // untouched: discovery probes them together.
            "many" => {
                let mut m = AnonMapping::new(MANY * 4096, HugePages::Never).unwrap();
                for page in (0..MANY).step_by(4) {
                    m.as_mut_slice()[page * 4096] = 9;
                }
                assert_eq!(m.split_vmas(1).unwrap(), MANY);
                many.insert(m).addr()
            }
            // One of them, untouched, read: a zero-page mapping only.
            "read-one" => {
                let m = many.as_ref().unwrap();
                std::hint::black_box(m.as_slice()[4096 * 5]);
                m.addr()
            }
            _ => break,
        };
        println!("ZOO done {at}");
    }
}

/// One-page VMAs the zoo maps on `many`.
const MANY: usize = 64;

/// `MapsDiscovery` (maps plus per-VMA checks) classifies every VMA of a
/// process with shared, private-file, `/dev/zero`, droppable and (where
/// huge pages are reserved) hugetlb mappings exactly as smaps does, and
/// falls back to smaps where it must: for a droppable VMA, and for a
/// process with a `VM_MERGEABLE` VMA.
#[test]
fn maps_discovery_agrees_with_smaps() {
    use pagesift_linux::discover::{
        Ineligible, MapsDiscovery, ProcessRegions, RegionsFrom, SmapsReason,
    };
    use std::io::{BufRead, Write};
    require_root();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "vma_zoo_child", "--ignored", "--nocapture"])
        .env("PAGESIFT_VMA_ZOO", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let child = Kill(child);
    let pid = child.0.id();
    let mut zoo_line = || loop {
        let mut l = String::new();
        assert_ne!(out.read_line(&mut l).unwrap(), 0, "the zoo child died");
        if let Some(rest) = l.strip_prefix("ZOO ") {
            return rest.trim().to_string();
        }
    };
    let addrs: HashMap<String, u64> = zoo_line()
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let pagemap = Pagemap::open(pid).unwrap();
    let mut kpf = KPageFlags::open().unwrap();
    let mut fast = MapsDiscovery::new();
    let same = |a: &ProcessRegions, b: &ProcessRegions| {
        let key = |r: &pagesift_linux::discover::Region| {
            (r.start, r.end, r.kind, r.path.clone(), r.mergeable)
        };
        assert_eq!(
            a.eligible.iter().map(key).collect::<Vec<_>>(),
            b.eligible.iter().map(key).collect::<Vec<_>>()
        );
        assert_eq!(a.rejected, b.rejected);
    };
    let reason =
        |r: &ProcessRegions, at: u64| r.rejected.iter().find(|x| x.start == at).map(|x| x.reason);
    let kept = |r: &ProcessRegions, at: u64| r.eligible.iter().find(|x| x.start == at).cloned();

    // 1. With a droppable VMA maps cannot decide: smaps, same answer.
    let (r, from) = fast.process_regions(pid, &pagemap, &mut kpf).unwrap();
    assert_eq!(from, RegionsFrom::Smaps(SmapsReason::MaybeDroppable));
    same(&r, &discover::process_regions(pid).unwrap());
    assert_eq!(reason(&r, addrs["droppable"]), Some(Ineligible::Droppable));

    // 2. Without it, maps decides everything, exactly as smaps does.
    writeln!(stdin, "unmap-droppable").unwrap();
    zoo_line();
    let (r, from) = fast.process_regions(pid, &pagemap, &mut kpf).unwrap();
    assert_eq!(from, RegionsFrom::Maps);
    let smaps = discover::process_regions(pid).unwrap();
    same(&r, &smaps);
    assert!(
        r.eligible
            .iter()
            .all(|x| !x.mergeable && x.thp_advised.is_none())
    );
    assert_eq!(kept(&r, addrs["anon"]).unwrap().kind, RegionKind::Anonymous);
    assert_eq!(
        kept(&r, addrs["private"]).unwrap().kind,
        RegionKind::PrivateFile
    );
    assert_eq!(
        kept(&r, addrs["dev_zero"]).unwrap().kind,
        RegionKind::PrivateFile
    );
    assert_eq!(reason(&r, addrs["shared"]), Some(Ineligible::Shared));
    assert_eq!(reason(&r, addrs["shared_file"]), Some(Ineligible::Shared));
    if addrs["hugetlb"] != 0 {
        assert_eq!(reason(&r, addrs["hugetlb"]), Some(Ineligible::Hugetlb));
    } else {
        eprintln!("no huge pages reserved (vm.nr_hugepages): hugetlb not checked");
    }
    // The vDSO and vvar are rejected (special mappings).
    assert!(r.rejected.len() >= 2);

    // 3. Many small anonymous VMAs, probed by one shared scan: each is
    // judged by its own pages. All are kept, from maps...
    writeln!(stdin, "many").unwrap();
    let at: u64 = zoo_line().strip_prefix("done ").unwrap().parse().unwrap();
    let (r, from) = fast.process_regions(pid, &pagemap, &mut kpf).unwrap();
    assert_eq!(from, RegionsFrom::Maps);
    same(&r, &discover::process_regions(pid).unwrap());
    let end = at + (MANY as u64) * 4096;
    let small: Vec<_> = (r.eligible.iter())
        .filter(|x| x.start >= at && x.end <= end)
        .collect();
    assert_eq!(small.len(), MANY);
    assert!(small.iter().all(|x| x.kind == RegionKind::Anonymous));
    // ... until one of them, between a written and an empty neighbour,
    // holds only a zero-page mapping: undecided, smaps.
    writeln!(stdin, "read-one").unwrap();
    zoo_line();
    let (r, from) = fast.process_regions(pid, &pagemap, &mut kpf).unwrap();
    assert_eq!(from, RegionsFrom::Smaps(SmapsReason::MaybeDroppable));
    same(&r, &discover::process_regions(pid).unwrap());

    // 4. A VM_MERGEABLE VMA needs smaps' `mg` flags.
    writeln!(stdin, "mergeable").unwrap();
    let at: u64 = zoo_line().strip_prefix("done ").unwrap().parse().unwrap();
    let (r, from) = fast.process_regions(pid, &pagemap, &mut kpf).unwrap();
    assert_eq!(from, RegionsFrom::Smaps(SmapsReason::Mergeable));
    assert!(kept(&r, at).unwrap().mergeable);
    same(&r, &discover::process_regions(pid).unwrap());
    drop(child);
}

/// A process that execs another program in place (same pid, same start
/// time) is a new process to the source at the next refresh: new image,
/// new command name, and the old one reported gone. The daemon's marks of
/// the old image must not follow it, and its injection check compares
/// against this image.
#[test]
fn a_process_that_execs_in_place_is_a_new_one_after_refresh() {
    pagesift_testkit::require_root();
    let mut child = std::process::Command::new("sh")
        .args(["-c", "read _; exec sleep 30"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut src = LinuxSource::new(ProcessFilter::pids([pid]), SourceConfig::default()).unwrap();
    let before = src.processes().find(|p| p.pid == pid).unwrap().clone();
    assert_eq!(before.comm, "sh");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // The new image shows in stat a moment before the new name does.
    let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    while discover::identity(pid).map(|(_, image)| image) == Some(before.image)
        || comm().trim() != "sleep"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the shell never exec'd"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    src.refresh().unwrap();
    let after = src.processes().find(|p| p.pid == pid).unwrap().clone();
    assert_eq!(after.start_time, before.start_time, "the same process");
    assert_eq!(after.comm, "sleep");
    assert_ne!(after.image, before.image);
    assert_eq!(
        discover::identity(pid),
        Some((after.start_time, after.image))
    );
    assert!(
        src.take_gone().contains(&pid),
        "the old image is reported gone"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A process's cgroup is read again at every refresh (eligibility and the
/// savings per cgroup follow a process that moves, as libvirt and
/// container runtimes move theirs after they start them).
#[test]
fn a_refresh_follows_a_process_into_another_cgroup() {
    require_root();
    let mut cgroups = TestCgroups::new("pagesift-refresh");
    let first = cgroups.create("first");
    let second = cgroups.create("second/inner");
    let w = cgroups.spawn(&first, &["static-dup", "--mib", "1"]);
    let mut src = source_for(&[w.pid()]);
    let seen = |src: &LinuxSource| {
        let p = src.processes().find(|p| p.pid == w.pid()).expect("listed");
        (p.cgroup.clone(), p.cgroups.clone())
    };
    assert_eq!(seen(&src).0, first);
    std::fs::write(
        cgroups.dir(&second).join("cgroup.procs"),
        w.pid().to_string(),
    )
    .unwrap();
    assert_eq!(seen(&src).0, first, "nothing read before the refresh");
    src.refresh().unwrap();
    let (cgroup, all) = seen(&src);
    assert_eq!(cgroup, second);
    assert!(all.contains(&second) && !all.contains(&first), "{all:?}");
}

/// However many VMAs the processes map, at most `max_regions` are tracked:
/// the largest, with the same ids from one refresh to the next, and the
/// number left out is told.
#[test]
fn at_most_max_regions_are_tracked_the_largest_first() {
    require_root();
    let many = Workload::start(&["--die-with-parent", "vmas", "--count", "3000"]);
    let big = Workload::start(&["--die-with-parent", "static-dup", "--mib", "1"]);
    let (big_start, _) = big.region();
    let all = source_for(&[many.pid(), big.pid()]);
    let found = all.linux_regions().count();
    assert!(found > 3000, "{found} regions without a limit");
    drop(all);
    let config = SourceConfig {
        max_regions: 100,
        ..SourceConfig::default()
    };
    let filter = ProcessFilter::pids([many.pid(), big.pid()]);
    let mut src = LinuxSource::new(filter, config).expect("LinuxSource");
    let ids: Vec<RegionId> = src.linux_regions().map(|r| r.id).collect();
    assert_eq!(ids.len(), 100);
    assert_eq!(src.left_out(), found - 100);
    let kept_big = region_at(&src, big.pid(), big_start);
    let smallest_kept = src.linux_regions().map(|r| r.pages).min().unwrap();
    assert!(
        src.linux_regions()
            .any(|r| r.id == kept_big && r.pages == 256),
        "the 256-page region is kept"
    );
    assert_eq!(smallest_kept, 1, "the rest are one-page VMAs");
    src.refresh().unwrap();
    let again: Vec<RegionId> = src.linux_regions().map(|r| r.id).collect();
    assert_eq!(ids, again, "the same regions, the same ids");
    assert_eq!(src.left_out(), found - 100);
}

/// Why the exact scan and the demo's meter read kpageflags only for the
/// pages `inspect::flags_needed` names, instead of going through
/// `PageInspector` (which reads every present page's flags, THP bit
/// included): on a private anonymous region, reading the flags of every
/// page costs a multiple of reading pagemap alone. Both paths must give
/// every page the same class; the figures are printed, not asserted
/// (run with `--nocapture`).
#[test]
fn skipping_kpageflags_reads() {
    use pagesift_linux::inspect::{classify, flags_needed};
    use pagesift_linux::kpageflags::KpfFlags;
    use pagesift_linux::pagemap::PagemapEntry;
    use std::time::Instant;

    require_root();
    let w = Workload::start(&["mixed", "--mib", "32", "--zero-every", "5", "--seed", "4"]);
    let (start, pages) = w.region();
    let n = pages as usize;

    // Every present page's flags, through the inspector.
    let mut inspector = PageInspector::open(w.pid()).unwrap();
    let mut infos = vec![PageInfo::default(); n];
    let mut all_ns = u128::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        inspector.inspect(start, &mut infos).unwrap();
        all_ns = all_ns.min(t.elapsed().as_nanos());
    }

    // Only the flags `flags_needed` asks for (anonymous, not mergeable).
    let pagemap = Pagemap::open(w.pid()).unwrap();
    let mut kpf = KPageFlags::open().unwrap();
    let mut entries = vec![PagemapEntry(0); n];
    let (mut pfns, mut at, mut flags) = (Vec::new(), Vec::new(), Vec::new());
    let mut needed_ns = u128::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        pagemap.read(start, &mut entries).unwrap();
        pfns.clear();
        at.clear();
        for (i, e) in entries.iter().enumerate() {
            if flags_needed(*e, true, false) {
                pfns.push(e.pfn().unwrap());
                at.push(i);
            }
        }
        flags.clear();
        flags.resize(pfns.len(), KpfFlags(0));
        kpf.read_many(&pfns, &mut flags).unwrap();
        needed_ns = needed_ns.min(t.elapsed().as_nanos());
    }
    let mut read = vec![None; n];
    for (&i, &f) in at.iter().zip(&flags) {
        read[i] = Some(f);
    }
    let mut zero = 0;
    for (i, info) in infos.iter().enumerate() {
        let class = classify(entries[i], read[i]);
        assert_eq!(class, info.class(), "page {i}: {:?}", info);
        zero += (class == PageClass::Zero) as usize;
    }
    assert!(
        zero > 0,
        "the zero-page mappings are found without reading every page's flags"
    );
    println!(
        "{n} pages, {} with flags needed: every page's flags {:.1} ns/page, \
         only the needed ones {:.1} ns/page ({:.1}x)",
        pfns.len(),
        all_ns as f64 / n as f64,
        needed_ns as f64 / n as f64,
        all_ns as f64 / needed_ns as f64
    );
}

/// The sampler's batched path (`sample_pages`) against the page-by-page
/// one, over two processes at once: a fork family (pages shared with the
/// children go through `/proc/PID/mem`, exclusive ones through
/// `process_vm_readv`) and a workload with holes, zero pages and untouched
/// memory. Each batch mixes the two processes and strides through their
/// regions as a level's walk does. The states must match, every present
/// page must be read with the words a single read gives, no other page is
/// read, and the targets must be unchanged: same checksums, same frames,
/// same sharing, nothing faulted in.
#[test]
fn sampling_in_batches_agrees_with_single_reads_and_changes_nothing() {
    require_root();
    let mut fam = Workload::start(&[
        "fork-family",
        "--mib",
        "8",
        "--children",
        "1",
        "--dirty-fraction",
        "0.5",
        "--hole-every",
        "9",
        "--seed",
        "3",
    ]);
    let mut holes = Workload::start(&[
        "static-dup",
        "--mib",
        "8",
        "--contents",
        "5",
        "--hole-every",
        "4",
        "--zero-every",
        "7",
        "--untouched-mib",
        "2",
    ]);
    let (fam_start, fam_pages) = fam.region();
    let (holes_start, holes_pages) = holes.region();
    let sums = (fam.checksum(), holes.checksum());
    let entries = |pid: u32, start: u64, pages: u64| pagemap_entries(pid, start, pages);
    let before = (
        entries(fam.pid(), fam_start, fam_pages),
        entries(holes.pid(), holes_start, holes_pages),
    );
    let present_before = present_count(holes.pid(), holes_start, holes_pages);

    let mut src = source_for(&[fam.pid(), holes.pid()]);
    let a = region_at(&src, fam.pid(), fam_start);
    let b = region_at(&src, holes.pid(), holes_start);
    // Interleave the two regions, striding by 5 pages.
    let mut pages = Vec::new();
    for k in 0..fam_pages.max(holes_pages) / 5 {
        for (r, n) in [(a, fam_pages), (b, holes_pages)] {
            if k * 5 < n {
                pages.push(PageRef {
                    region: r,
                    page: (k * 5) as u32,
                });
            }
        }
    }
    let mut words = vec![[0u32; WORDS_PER_PAGE]; 64];
    let mut states = vec![Ok(PageState::NotPresent); 64];
    let mut read = vec![false; 64];
    let mut single = [0u32; WORDS_PER_PAGE];
    let mut seen: Vec<PageState> = Vec::new();
    for batch in pages.chunks(64) {
        src.sample_pages(batch, &mut words, &mut states, &mut read);
        for (i, &p) in batch.iter().enumerate() {
            let state = states[i].clone().expect("state");
            assert_eq!(Ok(state), src.page_state(p), "state of {p:?}");
            seen.push(state);
            let readable = matches!(state, PageState::Present | PageState::Merged);
            assert_eq!(read[i], readable, "{p:?} in state {state:?}");
            if readable {
                src.read_page(p, &mut single).expect("single read");
                assert!(words[i] == single, "{p:?}: the batch read other words");
            }
        }
    }
    for s in [PageState::Present, PageState::NotPresent, PageState::Zero] {
        assert!(seen.contains(&s), "no {s:?} page among the samples");
    }
    assert!(
        entries(fam.pid(), fam_start, fam_pages) == before.0,
        "a read changed a frame or its sharing in the fork parent"
    );
    assert!(
        entries(holes.pid(), holes_start, holes_pages) == before.1,
        "a read changed a frame of the workload with holes"
    );
    assert_eq!(
        present_count(holes.pid(), holes_start, holes_pages),
        present_before,
        "a page was faulted in"
    );
    assert_eq!((fam.checksum(), holes.checksum()), sums);
}

/// A region unmapped and mapped again at the same address shows the same
/// line in the maps, but fresh frames: `check_renewed` finds it renewed
/// (`pagesift_linux::renewal`). A region that lives on is never found so,
/// nor one whose pages are only read, and neither workload is changed by
/// the look (two one-entry pagemap reads per region).
#[test]
fn a_region_mapped_anew_at_the_same_address_is_found_renewed() {
    require_root();
    let cycling = Workload::start(&["short-lived", "--mib", "8", "--period-ms", "300"]);
    let mut steady = Workload::start(&["static-dup", "--mib", "8", "--seed", "5"]);
    let sum = steady.checksum();
    let (c_start, _) = cycling.region();
    let (s_start, _) = steady.region();
    // The cycle's region is there half of the time: discover until it is.
    let mut src = source_for(&[cycling.pid(), steady.pid()]);
    let c_pid = cycling.pid();
    let found = |src: &LinuxSource| {
        (src.linux_regions())
            .find(|r| r.pid == c_pid && r.start == c_start)
            .map(|r| r.id)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while found(&src).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        src.refresh().expect("refresh");
    }
    let c_id = found(&src).expect("the cycle's region seen mapped");
    let s_id = region_at(&src, steady.pid(), s_start);
    let mut renewed: HashMap<RegionId, usize> = HashMap::new();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for id in src.check_renewed(256, None) {
            *renewed.entry(id).or_default() += 1;
        }
        // Reads of the steady region's pages do not move its frames.
        let mut out: Vec<PageWords> = vec![[0; WORDS_PER_PAGE]; 1];
        let _ = src.read_pages(
            &[PageRef {
                region: s_id,
                page: 3,
            }],
            &mut out,
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("renewals in 4 s: {renewed:?}");
    // About 7 new mappings in 4 s (a 600 ms cycle): each is seen when it
    // is unmapped or mapped anew, once (a range seen unmapped is no
    // evidence for the next look).
    let cycles = renewed.get(&c_id).copied().unwrap_or(0);
    assert!(
        (2..=10).contains(&cycles),
        "renewals of the cycle: {renewed:?}"
    );
    assert!(!renewed.contains_key(&s_id), "{renewed:?}");
    assert_eq!(renewed.len(), 1, "{renewed:?}");
    // Only the ones asked about are looked at.
    let only: std::collections::BTreeSet<RegionId> = [s_id].into();
    for _ in 0..10 {
        assert!(src.check_renewed(256, Some(&only)).is_empty());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        steady.checksum(),
        sum,
        "the steady workload's memory changed"
    );
    let mut cycling = cycling;
    assert!(cycling.alive(), "the cycling workload died");
}

/// With `read_record` on, a reader's reads on both paths are recorded for
/// exactly the pages read, and they are the pages the kernel's LRU now
/// believes used (the reason for the record: NUMA placement must not take
/// that activity for the process's).
#[test]
fn the_read_record_names_exactly_the_pages_whose_lru_marks_our_reads_set() {
    require_root();
    use pagesift_linux::read_record;
    let mut w = Workload::start(&["random", "--mib", "1"]);
    let pid = w.pid();
    let (start, pages) = w.region();
    let sum = w.checksum();
    let page = pagesift_linux::PAGE_SIZE;
    read_record::enable();
    // Per page, its steps up the LRU's ladder of use: 1 referenced, 2
    // active (a read moves a page one step).
    let steps = |pid: u32| -> Vec<u8> {
        let entries = pagemap_entries(pid, start, pages);
        let pfns: Vec<u64> = entries.iter().map(|e| e.pfn().expect("present")).collect();
        let mut flags = vec![pagesift_linux::kpageflags::KpfFlags(0); pfns.len()];
        KPageFlags::open()
            .unwrap()
            .read_many(&pfns, &mut flags)
            .unwrap();
        flags
            .iter()
            .map(|f| u8::from(f.referenced()) + 2 * u8::from(f.active()))
            .collect()
    };
    let before = steps(pid);
    assert!(
        before.iter().all(|&s| s < 2),
        "a page written once and left alone is not active: {before:?}"
    );
    let mut r = RemoteReader::new(pid).unwrap();
    let mut buf = vec![[0u32; WORDS_PER_PAGE]; 32];
    // Pinned: every other page of the first 32; unpinned: pages 64..96.
    let pinned: Vec<u64> = (0..16).map(|i| start + 2 * i * page).collect();
    assert_eq!(r.read_pages(&pinned, &mut buf).unwrap(), 16);
    assert_eq!(
        r.read_range_unpinned(start + 64 * page, &mut buf).unwrap(),
        32
    );
    let read = |i: u64| (i < 32 && i.is_multiple_of(2)) || (64..96).contains(&i);
    let after = steps(pid);
    for i in 0..pages {
        let addr = start + i * page;
        assert_eq!(read_record::was_read(pid, addr), read(i), "page {i}");
        // A referenced page a read activates loses `PG_referenced` at
        // once but joins the active list only when its CPU's batch drains
        // (`folio_activate`): 1 -> 0 for a while. Either way it changed.
        let (b, a) = (before[i as usize], after[i as usize]);
        assert_eq!(a != b, read(i), "LRU steps of page {i}: {b} -> {a}");
    }
    read_record::retain(|p| p != pid);
    assert!(!read_record::was_read(pid, start), "forgotten when gone");
    assert!(w.alive());
    assert_eq!(w.checksum(), sum, "reading changed the target's memory");
}

/// A refresh of some processes re-reads their maps only: a mark's split
/// shows in the process refreshed, another process's regions stay as they
/// were (same ids, its own mark not seen yet) until a full refresh, and a
/// process that exited is dropped. Both workloads' memory is unchanged and
/// they keep running.
#[test]
fn a_refresh_of_one_process_reads_its_maps_and_keeps_the_others() {
    require_root();
    let _g = serial();
    let mut a = Workload::start(&["static-dup", "--mib", "8"]);
    let mut b = Workload::start(&["static-dup", "--mib", "8"]);
    let (pa, pb) = (a.pid(), b.pid());
    let (sum_a, sum_b) = (a.checksum(), b.checksum());
    let mut src = source_for(&[pa, pb]);
    let maps_reads = |src: &LinuxSource| src.discovery().maps;
    let b_before = regions_of(&src, pb);
    let reads_before = maps_reads(&src);
    // Mark the middle quarter of each workload's region: its VMA splits
    // in three.
    let mut inj = Injector::new(InjectConfig::default());
    let mut middle = |w: &Workload, pid: u32, advice: Advice| {
        let (start, pages) = w.region();
        let quarter = pages / 4 * pagesift_core::PAGE_SIZE as u64;
        let call = Syscall::Madvise {
            addr: start + quarter,
            len: quarter,
            advice,
        };
        let done = inj.run(pid, &[call]).expect("injection");
        assert!(
            matches!(done, Outcome::Done(ref i) if i.results == vec![0]),
            "{done:?}"
        );
        (start + quarter, start + 2 * quarter)
    };
    let (ma, ma_end) = middle(&a, pa, Advice::Mergeable);
    let (mb, _) = middle(&b, pb, Advice::Mergeable);
    src.note_advised(pa, ma, ma_end, true);
    src.refresh_pids(&[pa].into()).unwrap();
    assert_eq!(
        maps_reads(&src),
        reads_before + 1,
        "one process's maps read"
    );
    let split = regions_of(&src, pa);
    assert!(
        split.iter().any(|r| r.0 == ma && r.2) && split.iter().any(|r| r.0 == ma_end && !r.2),
        "the marked process's split and flag are seen: {split:?}"
    );
    assert_eq!(
        regions_of(&src, pb),
        b_before,
        "the other process's regions are as they were"
    );
    // A full refresh sees the other process's split too.
    src.refresh().unwrap();
    assert!(
        regions_of(&src, pb).iter().any(|r| r.0 == mb),
        "{:?}",
        regions_of(&src, pb)
    );
    // Unmark both; the workloads' memory is as they wrote it.
    middle(&a, pa, Advice::Unmergeable);
    middle(&b, pb, Advice::Unmergeable);
    assert!(a.alive() && b.alive());
    assert_eq!(
        a.checksum(),
        sum_a,
        "the first workload's memory is unchanged"
    );
    assert_eq!(
        b.checksum(),
        sum_b,
        "the second workload's memory is unchanged"
    );
    // A process refreshed after it exited is dropped, the other kept.
    let b_now = regions_of(&src, pb);
    a.kill();
    a.wait_exit();
    src.refresh_pids(&[pa].into()).unwrap();
    assert!(regions_of(&src, pa).is_empty());
    assert!(!src.processes().any(|p| p.pid == pa));
    assert_eq!(regions_of(&src, pb), b_now);
    assert!(b.alive());
}

/// A process that came since the last refresh is opened and read by a
/// refresh of its pid alone, with every other process's regions kept; a
/// pid that names no process is passed over.
#[test]
fn a_refresh_of_a_new_process_reads_it_and_keeps_the_others() {
    require_root();
    let _g = serial();
    let mut b = Workload::start(&["static-dup", "--mib", "8"]);
    let pb = b.pid();
    let mut src =
        LinuxSource::new(ProcessFilter::all(), SourceConfig::default()).expect("LinuxSource");
    let b_before = regions_of(&src, pb);
    assert!(!b_before.is_empty());
    let mut c = Workload::start(&["static-dup", "--mib", "8"]);
    let pc = c.pid();
    let sum_c = c.checksum();
    assert!(regions_of(&src, pc).is_empty(), "not read yet");
    let reads = src.discovery().maps;
    assert!(
        !src.refresh_pids(&[u32::MAX - 1].into()).unwrap(),
        "a pid that names no process changes nothing"
    );
    assert!(src.refresh_pids(&[pc, u32::MAX - 1].into()).unwrap());
    let (start, _) = c.region();
    assert!(
        regions_of(&src, pc).iter().any(|r| r.0 == start),
        "the new process's region is tracked: {:?}",
        regions_of(&src, pc)
    );
    assert!(src.processes().any(|p| p.pid == pc));
    assert_eq!(src.discovery().maps, reads + 1, "one process's maps read");
    assert_eq!(
        regions_of(&src, pb),
        b_before,
        "the other process's regions are as they were"
    );
    assert!(b.alive() && c.alive());
    assert_eq!(c.checksum(), sum_c, "the new process's memory is unchanged");
}
