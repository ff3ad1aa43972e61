//! Files of a PKI directory written whole or not at all: a temporary file
//! in the same directory, created with its final mode, then renamed into
//! place. Shared by the CA's files and the index (`super::index`).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Private keys.
pub(crate) const KEY_MODE: u32 = 0o600;
/// Certificates, the CRL, the index.
pub(crate) const CERT_MODE: u32 = 0o644;

/// Writes `contents` to `path` through a temporary file created with `mode`
/// in the same directory, then renames it into place. A key is never on
/// disk with a looser mode, not even for a moment.
pub(crate) fn write_file(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    // A temporary file left by a crash of this same pid is ours to replace.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        if mode & 0o077 != 0 {
            // Public files get their mode whatever the umask; private ones
            // only ever lose bits to it.
            file.set_permissions(Permissions::from_mode(mode))?;
        }
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
