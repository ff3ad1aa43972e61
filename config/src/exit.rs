//! How a drover daemon's process ends, the same for every binary: success is
//! exit status 0; a failure is exactly one line on stderr, `PROGRAM: reason`
//! (the error and its causes, [`crate::logging::error_line`]), and status 1.
//! One line, because under systemd stderr lands in the journal and logging may
//! itself point at stderr.

use crate::logging::error_line;
use std::error::Error;
use std::process::ExitCode;

/// The exit status of `result`, its error printed as one line after `program: `.
pub fn status<E: AsRef<dyn Error>>(program: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {}", error_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// `--check`: the lines on stdout and status 0, or the reason on stderr
/// (`PROGRAM --check: reason`) and status 1.
pub fn check_status<E: AsRef<dyn Error>>(program: &str, lines: Result<Vec<String>, E>) -> ExitCode {
    status(
        &format!("{program} --check"),
        lines.map(|lines| println!("{}", lines.join("\n"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("bad")]
    struct Bad;

    struct Boxed(Box<dyn Error>);
    impl AsRef<dyn Error> for Boxed {
        fn as_ref(&self) -> &(dyn Error + 'static) {
            self.0.as_ref()
        }
    }

    #[test]
    fn success_is_zero_and_a_failure_one() {
        assert_eq!(status::<Boxed>("p", Ok(())), ExitCode::SUCCESS);
        assert_eq!(status("p", Err(Boxed(Box::new(Bad)))), ExitCode::FAILURE);
        assert_eq!(
            check_status("p", Err::<Vec<String>, _>(Boxed(Box::new(Bad)))),
            ExitCode::FAILURE
        );
        assert_eq!(
            check_status::<Boxed>("p", Ok(vec!["a".into()])),
            ExitCode::SUCCESS
        );
    }
}
