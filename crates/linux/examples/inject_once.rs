//! Injects into one process a given number of times and exits: the
//! injector that the tracer-death tests kill. `inject_once PID ADDR LEN
//! ROUNDS`; each round runs `madvise(MADV_MERGEABLE)`,
//! `madvise(MADV_UNMERGEABLE)` on `ADDR..ADDR+LEN` and `getpid()` in one
//! attach. With `PAGESIFT_INJECT_FAULT=N` the process SIGKILLs itself at
//! the N-th step of its tracer (or with `N:panic` the tracer thread
//! panics), so the kernel's release path is what the target meets. Prints
//! `{"rounds", "done", "tracer_died", "other"}`.

use pagesift_linux::inject::{Advice, InjectConfig, InjectError, Injector, Outcome, Syscall};
use serde_json::json;

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).expect("a hex number"),
            None => s.parse().expect("a number"),
        })
        .collect();
    let [pid, addr, len, rounds] = a[..] else {
        panic!("usage: inject_once PID ADDR LEN ROUNDS");
    };
    let calls = [
        Syscall::Madvise {
            addr,
            len,
            advice: Advice::Mergeable,
        },
        Syscall::Madvise {
            addr,
            len,
            advice: Advice::Unmergeable,
        },
        Syscall::Getpid,
    ];
    let mut inj = Injector::new(InjectConfig::default());
    let (mut done, mut died, mut other) = (0, 0, Vec::new());
    for _ in 0..rounds {
        match inj.run(pid as u32, &calls) {
            Ok(Outcome::Done(i)) if i.results == [0, 0, pid as i64] => done += 1,
            Err(InjectError::Unexpected { what, .. })
                if what.contains("tracer thread has died") =>
            {
                died += 1
            }
            r if other.len() < 3 => other.push(format!("{r:?}")),
            _ => {}
        }
    }
    println!(
        "{}",
        json!({"rounds": rounds, "done": done, "tracer_died": died, "other": other})
    );
}
