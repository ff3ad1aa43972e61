//! `drover-agent`: see the library docs; everything lives in `drover_agent::cli`.

fn main() -> std::process::ExitCode {
    drover_agent::cli::main()
}
