//! `drover-manager`: see the library docs; everything lives in `drover_manager::cli`.

fn main() -> std::process::ExitCode {
    drover_manager::cli::main()
}
