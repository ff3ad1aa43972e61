//! `drover-dns`: see the library docs; everything lives in `drover_dns::cli`.

fn main() -> std::process::ExitCode {
    drover_dns::cli::main()
}
