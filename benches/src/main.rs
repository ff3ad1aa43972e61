//! `drover-bench`: see the library docs; everything lives in `drover_bench::cli`.

fn main() -> std::process::ExitCode {
    drover_bench::cli::main()
}
