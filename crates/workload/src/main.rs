//! The `pagesift-workload` binary: the library's command line (see the
//! crate documentation for the workloads).

fn main() -> std::process::ExitCode {
    pagesift_workload::main_from(std::env::args_os())
}
