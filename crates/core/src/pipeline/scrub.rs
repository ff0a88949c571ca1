//! # Cache scrubbing (Singleton): drop the host's copy of what a guest holds
//!
//! A guest that reads its virtual disk through a host file opened with
//! buffered I/O (QEMU `cache=writeback`) leaves two copies of every block it
//! read: one in its own page cache, one in the host's page cache of the
//! image file. KSM cannot merge the second, because page cache is not
//! anonymous memory. Singleton (§3.3) drops the host copy of every block
//! whose content the guest currently holds ("exclusive caching"); the host
//! cache then keeps what the guest does *not* hold (pages the guest
//! evicted, read-ahead it never asked for), so a guest miss has a better
//! chance of being a host hit.
//!
//! This module holds the decisions, none of the mechanism:
//!
//! 1. [`guest_index`]: the index of guest RAM content, a hash table with one
//!    slot per guest page (Singleton §2.4), rebuilt every pass, and the
//!    §3.3 replacement test that tells a guest eviction from a write.
//! 2. [`plan`]: given the host's cached pages of one image (their content
//!    matched against the index and checked byte for byte, their dirty and
//!    writeback state and the folios they sit in), which byte ranges to
//!    drop. Never a dirty or writeback page, never a page whose content the
//!    guest does not hold, and only whole folios, because the kernel's
//!    `POSIX_FADV_DONTNEED` leaves a large folio alone unless the range
//!    covers all of it.
//! 3. [`frequency`]: when to scrub (Singleton Algorithm 2, §3.4): a period
//!    that lengthens or shortens with the ratio of dropped to cached pages,
//!    and early scrubs under memory pressure.

pub mod frequency;
pub mod guest_index;
pub mod plan;

pub use frequency::{FrequencyControl, FrequencyParams, MemoryStats, Trigger};
pub use guest_index::{Change, GuestIndex, PageStamp, PassCounts};
pub use plan::{CachedPage, DropRange, Folio, Held, plan_drops, plan_runs};
