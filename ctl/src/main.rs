//! The `droverctl` binary; everything lives in the library (`droverctl::cli`).
//!
//! A C `main` rather than Rust's: a short command is mostly process start-up,
//! and std's start-up for a Rust `main` installs a stack-overflow guard (it
//! reads `/proc/self/maps` and sets up an alternate signal stack with two
//! handlers): about 20 of the 107 system calls a `droverctl status` made,
//! and a tenth of a millisecond (`docs/dev/notes/droverctl-startup.md`, run E). What of it
//! droverctl relies on is kept here:
//!
//! * SIGPIPE is ignored, so a closed pipe is a write error droverctl handles
//!   (`droverctl list-units | head` ends quietly, exit 0), as before;
//! * `std::process::exit` flushes stdout, as returning from a Rust `main`
//!   does; arguments and environment are std's as usual (glibc hands them
//!   to std before `main`).
//!
//! A stack overflow is then a plain SIGSEGV instead of std's message first.
#![no_main]

/// The process entry point glibc calls.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: `signal` with SIG_IGN only changes this process's disposition of
    // SIGPIPE; no other thread exists yet, as in std's own start-up.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    std::process::exit(i32::from(droverctl::cli::main()))
}
