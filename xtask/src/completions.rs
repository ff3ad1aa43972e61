//! Shell completions for droverctl, generated from its clap definition
//! (`droverctl::Cli`), so they always know every command and option.

use clap::CommandFactory;
use clap_complete::Shell;

/// The completion files: (shell, file name, contents).
pub fn droverctl() -> Vec<(Shell, &'static str, Vec<u8>)> {
    [
        (Shell::Bash, "droverctl"),
        (Shell::Zsh, "_droverctl"),
        (Shell::Fish, "droverctl.fish"),
    ]
    .into_iter()
    .map(|(shell, file)| {
        let mut cmd = droverctl::Cli::command();
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cmd, "droverctl", &mut out);
        (shell, file, out)
    })
    .collect()
}
