//! Key and certificate modes do not depend on the umask. Alone in its test
//! binary: the umask is per process and other tests would race with it.

#![cfg(feature = "pki")]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use drover_tls::pki::Pki;

#[test]
fn modes_whatever_the_umask() {
    for umask in [0o000, 0o077, 0o022] {
        // SAFETY: umask(2) cannot fail; this binary runs this one test.
        #[allow(unsafe_code)]
        let old = unsafe { libc::umask(umask) };
        let dir = TempDir::new();
        let pki = Pki::new(dir.path().join("pki"));
        pki.create_ca(&days(1)).unwrap();
        let node = pki.issue_node(&node("n1"), &days(1)).unwrap();
        // SAFETY: as above, restoring the umask read before.
        #[allow(unsafe_code)]
        unsafe {
            libc::umask(old)
        };
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&pki.ca_key()), 0o600, "umask {umask:03o}");
        assert_eq!(mode(&node.private_key), 0o600, "umask {umask:03o}");
        assert_eq!(mode(&pki.ca_certificate()), 0o644, "umask {umask:03o}");
        assert_eq!(mode(&node.certificate), 0o644, "umask {umask:03o}");
        assert_eq!(mode(&pki.crl()), 0o644, "umask {umask:03o}");
    }
}
