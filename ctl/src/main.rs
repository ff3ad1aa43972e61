//! The `droverctl` binary; everything lives in the library (`droverctl::cli`).

fn main() -> std::process::ExitCode {
    droverctl::cli::main()
}
