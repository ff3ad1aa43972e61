//! The `droverctl` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    droverctl::main()
}
