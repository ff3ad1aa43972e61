//! `drover-proxy`: see the library docs; everything lives in `drover_proxy::cli`.

fn main() -> std::process::ExitCode {
    drover_proxy::cli::main()
}
