//! A deterministic, seeded simulation of a machine with the four region
//! kinds of UKSM §5.1, run through the [`Distiller`] and a model of ksmd.
//!
//! - **static**: statically duplicated regions (every page one of a few
//!   contents), the kind worth merging;
//! - **sparse**: distinct pages, nothing to gain;
//! - **cow-broken**: duplicated pages rewritten with the same content, one
//!   every few tens of microseconds of simulated time, sweeping the region
//!   so that each page is rewritten every fraction of a second (UKSM
//!   §8.1.2 memsets one page every 10 ms; a simulated region is far
//!   smaller than its 2 GB, so the rate per page is what is kept high);
//! - **short-lived**: duplicated regions mapped and unmapped about every
//!   second (UKSM §8.1.3).
//!
//! Time is simulated: each step advances the clock by the sleep T_s plus
//! the scan time the governor budgeted (pages sampled × per-page cost), so
//! the run is reproducible and fast. The ksmd model plays the daemon's
//! actuation: regions on the top level are "mergeable", and at each step
//! their present pages whose content occurs twice or more are merged.

use crate::pipeline::distill::{Distiller, DistillerConfig, WakeReport};
use crate::pipeline::ladder::Move;
use crate::source::{InMemorySource, MemorySource, PageState};
use crate::{Nanos, PageRef, RegionId};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};

/// The four region kinds of UKSM §5.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Static,
    Sparse,
    CowBroken,
    ShortLived,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Static,
        Kind::Sparse,
        Kind::CowBroken,
        Kind::ShortLived,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Kind::Static => "static",
            Kind::Sparse => "sparse",
            Kind::CowBroken => "cow-broken",
            Kind::ShortLived => "short-lived",
        }
    }
}

/// The simulated machine.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Regions of each kind.
    pub regions_per_kind: usize,
    /// Pages per region.
    pub region_pages: u32,
    /// Distinct contents in a static region.
    pub static_contents: u64,
    /// One page of a COW-broken region is rewritten this often (the default,
    /// 50 µs, rewrites each page of a 4096-page region every ~0.2 s).
    pub cow_write_every: Nanos,
    /// A short-lived region lives this long, then is replaced by a new one.
    pub short_lifetime: Nanos,
    /// Per-page sampling cost the simulated scanner pays, ns.
    pub per_page_ns: f64,
    pub distiller: DistillerConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            regions_per_kind: 4,
            region_pages: 4096,
            static_contents: 4,
            cow_write_every: 50_000,
            short_lifetime: 1_000_000_000,
            per_page_ns: 500.0,
            distiller: DistillerConfig::default(),
        }
    }
}

#[derive(Clone, Debug)]
struct SimRegion {
    kind: Kind,
    born: Nanos,
    /// Next page a COW-broken region rewrites.
    cursor: u32,
    /// Time of the last rewrite.
    last_write: Nanos,
}

/// What one simulated wake-up did, with the ladder's view per kind.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Step {
    pub now: Nanos,
    pub wake: WakeReport,
    /// For each kind, the number of its regions at each level.
    pub levels: BTreeMap<Kind, Vec<usize>>,
    /// Pages merged by the ksmd model so far.
    pub merged_pages: u64,
    /// Moves of this step, with the kind of region that moved.
    pub kind_moves: Vec<(Kind, Move)>,
}

pub struct Simulation {
    config: SimConfig,
    src: InMemorySource,
    distiller: Distiller,
    regions: HashMap<RegionId, SimRegion>,
    rng: ChaCha8Rng,
    now: Nanos,
    next_content: u64,
}

impl Simulation {
    pub fn new(config: SimConfig) -> Self {
        let mut sim = Simulation {
            src: InMemorySource::new(),
            distiller: Distiller::new(config.distiller.clone()),
            regions: HashMap::new(),
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            now: 0,
            // Static regions share contents 1..=static_contents; every other
            // content id is fresh.
            next_content: 1 << 32,
            config,
        };
        for kind in Kind::ALL {
            for _ in 0..sim.config.regions_per_kind {
                sim.map(kind);
            }
        }
        sim.distiller.observe_cost(sim.config.per_page_ns);
        sim.distiller.sync_regions(&sim.src, 0);
        sim
    }

    fn fresh(&mut self) -> u64 {
        self.next_content += 1;
        self.next_content
    }

    fn map(&mut self, kind: Kind) -> RegionId {
        let n = self.config.region_pages as usize;
        let contents: Vec<u64> = match kind {
            Kind::Static => (0..n)
                .map(|_| 1 + self.rng.random_range(0..self.config.static_contents))
                .collect(),
            Kind::Sparse => (0..n).map(|_| self.fresh()).collect(),
            Kind::CowBroken | Kind::ShortLived => {
                let c = self.fresh();
                vec![c; n]
            }
        };
        let id = self.src.map(kind as u32 + 1, &contents);
        self.regions.insert(
            id,
            SimRegion {
                kind,
                born: self.now,
                cursor: 0,
                last_write: self.now,
            },
        );
        id
    }

    pub fn now(&self) -> Nanos {
        self.now
    }
    pub fn distiller(&self) -> &Distiller {
        &self.distiller
    }
    pub fn source(&self) -> &InMemorySource {
        &self.src
    }
    pub fn kind_of(&self, id: RegionId) -> Option<Kind> {
        self.regions.get(&id).map(|r| r.kind)
    }

    /// Regions of each kind at each level.
    pub fn levels_by_kind(&self) -> BTreeMap<Kind, Vec<usize>> {
        let levels = self.distiller.ladder().levels();
        let mut out: BTreeMap<Kind, Vec<usize>> =
            Kind::ALL.iter().map(|&k| (k, vec![0; levels])).collect();
        for (&id, r) in &self.regions {
            if let Some(l) = self.distiller.ladder().level_of(id) {
                out.get_mut(&r.kind).expect("every kind")[l] += 1;
            }
        }
        out
    }

    /// One wake-up of the scanner, preceded by the workloads' activity and
    /// ksmd's merging during the sleep.
    pub fn step(&mut self) -> Step {
        let sleep = self.distiller.config().sleep;
        self.advance_workloads(self.now + sleep);
        self.ksmd();
        self.distiller.sync_regions(&self.src, self.now);
        let wake = self.distiller.wake(&mut self.src, self.now);
        let scanned: u64 = wake.sampled.iter().sum();
        self.now += (scanned as f64 * self.config.per_page_ns) as Nanos;
        let kind_moves = wake
            .moves
            .iter()
            .filter_map(|m| self.kind_of(m.region()).map(|k| (k, *m)))
            .collect();
        // Forget regions the source no longer has (after their moves are named).
        let live: Vec<RegionId> = self.src.regions().iter().map(|r| r.id).collect();
        self.regions.retain(|id, _| live.contains(id));
        Step {
            now: self.now,
            levels: self.levels_by_kind(),
            merged_pages: self.merged_pages(),
            kind_moves,
            wake,
        }
    }

    /// Runs the workloads from `self.now` to `until`.
    fn advance_workloads(&mut self, until: Nanos) {
        let ids: Vec<RegionId> = self.regions.keys().copied().collect();
        for id in ids {
            let r = self.regions[&id].clone();
            match r.kind {
                Kind::CowBroken => {
                    // memset one page with the same content every period,
                    // sweeping the region (UKSM §8.1.2).
                    let writes = (until - r.last_write) / self.config.cow_write_every;
                    let mut cursor = r.cursor;
                    for _ in 0..writes {
                        let p = PageRef {
                            region: id,
                            page: cursor,
                        };
                        let c = self.src.content(p).expect("live region");
                        self.src.write(p, c).expect("live region");
                        cursor = (cursor + 1) % self.config.region_pages;
                    }
                    let e = self.regions.get_mut(&id).expect("live");
                    e.cursor = cursor;
                    e.last_write += writes * self.config.cow_write_every;
                }
                Kind::ShortLived if until - r.born >= self.config.short_lifetime => {
                    self.src.unmap(id);
                    self.map(Kind::ShortLived);
                }
                _ => {}
            }
        }
        self.now = until;
    }

    /// The ksmd model: top-level regions are mergeable; their present pages
    /// whose content occurs at least twice among mergeable pages merge.
    fn ksmd(&mut self) {
        let top = self.distiller.ladder().levels() - 1;
        let mergeable = self.distiller.ladder().regions_at(top);
        let sizes: HashMap<RegionId, u32> =
            self.src.regions().iter().map(|r| (r.id, r.pages)).collect();
        let mut count: HashMap<u64, u32> = HashMap::new();
        let mut pages = Vec::new();
        for &id in &mergeable {
            let Some(&len) = sizes.get(&id) else {
                continue;
            };
            for page in 0..len {
                let p = PageRef { region: id, page };
                match self.src.state(p) {
                    Ok(PageState::Present) | Ok(PageState::Merged) => {
                        let c = self.src.content(p).expect("live");
                        *count.entry(c).or_default() += 1;
                        pages.push((p, c));
                    }
                    _ => {}
                }
            }
        }
        for (p, c) in pages {
            if count[&c] >= 2 {
                self.src.merge(p).expect("live");
            }
        }
    }

    /// Pages currently merged in the simulated machine.
    pub fn merged_pages(&self) -> u64 {
        let mut n = 0;
        for r in self.src.regions() {
            for page in 0..r.pages {
                if self.src.state(PageRef { region: r.id, page }) == Ok(PageState::Merged) {
                    n += 1;
                }
            }
        }
        n
    }
}
