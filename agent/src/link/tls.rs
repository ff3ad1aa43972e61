//! The agent's TLS settings: loaded from the `TLS*` files at start, and read
//! again on `SIGHUP`.
//!
//! Invariants:
//!
//! * the certificate in force always names this agent's node: a certificate
//!   for another node is refused at start (exit 1) and on reload (logged),
//!   since the manager would refuse it anyway and the link would go down
//!   for nothing;
//! * a reload replaces the settings for the *next* dial only: the session
//!   up keeps its TLS connection (rustls holds its config by `Arc`), so
//!   rotating the node's certificate, key, CA bundle or CRL drops nothing.
//!   The new certificate is what the manager sees at the next reconnect;
//! * files that fail to load on reload change nothing: the settings in
//!   force stay, and the error names the file; so does a CRL older (lower
//!   CRL number) than the one in force for the same CA, which would
//!   un-revoke a manager certificate (the manager's rule,
//!   `ClientSettings::crl_rollback_from`);
//! * the paths are those of the running configuration: the config files
//!   themselves are not read again (pointing at other files, or turning TLS
//!   on or off, needs a restart).

use drover_config::TlsFiles;
use drover_protocol::NodeName;
use drover_tls::{ClientSettings, Connector};

/// Loads the agent's TLS settings from `files` and checks that the
/// certificate names `node`. The error is one line.
pub fn load(files: &TlsFiles, node: &NodeName) -> Result<ClientSettings, String> {
    let settings = ClientSettings::load(files).map_err(|e| format!("TLS: {e}"))?;
    if settings.identity().node() != node {
        return Err(format!(
            "TLS: the certificate {} is for node '{}', but this agent is node '{node}'; \
             the manager would refuse it",
            files.certificate.display(),
            settings.identity().node(),
        ));
    }
    Ok(settings)
}

/// The connector the link dials with: `files` loaded and checked for
/// `node`, the manager's certificate required to name `server_name`.
pub fn connector(
    files: &TlsFiles,
    node: &NodeName,
    server_name: &str,
) -> Result<Connector, String> {
    Connector::new(load(files, node)?, server_name).map_err(|e| format!("TLS: {e}"))
}

/// Reads `files` again and puts them in force on `connector` for the next
/// dial. On error nothing changes. Returns the line logged.
pub fn reload(connector: &Connector, files: &TlsFiles, node: &NodeName) -> Result<String, String> {
    let settings = load(files, node)?;
    if let Some(older) = settings.crl_rollback_from(&connector.settings()) {
        let crl = files.crl.as_deref().unwrap_or(std::path::Path::new("?"));
        return Err(format!("TLS: refusing {}: {older}", crl.display()));
    }
    let serial = settings.identity().serial().to_string();
    connector.reload(settings);
    Ok(format!(
        "TLS files read again (certificate serial {serial}); the next connection to the \
         manager uses them, the current one stays"
    ))
}

/// Reloads the TLS files on every `SIGHUP` until the runtime ends, between
/// `RELOADING=1` and `READY=1` (so `systemctl reload` returns once it is
/// applied). Without TLS a `SIGHUP` is logged and ignored (it no longer ends
/// the agent).
pub fn spawn_reload_on_sighup(tls: Option<(Connector, TlsFiles)>, node: NodeName) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot install the SIGHUP handler: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            // `systemctl reload` waits from RELOADING=1 to READY=1.
            crate::notify::reloading();
            match &tls {
                None => tracing::info!("SIGHUP: no TLS configured, nothing to reload"),
                Some((connector, files)) => match reload(connector, files, &node) {
                    Ok(line) => tracing::info!("SIGHUP: {line}"),
                    Err(e) => tracing::error!(
                        "SIGHUP: cannot load the TLS files, keeping the TLS settings in force: {e}"
                    ),
                },
            }
            crate::notify::reloaded();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_tls::pki::{Options, Pki, Validity};

    fn options(force: bool) -> Options {
        Options {
            validity: Validity::days(2).unwrap(),
            force,
        }
    }

    fn files_of(pki: &Pki, node: &NodeName) -> TlsFiles {
        let f = pki.node_files(node);
        TlsFiles {
            certificate: f.certificate,
            private_key: f.private_key,
            ca_bundle: f.ca_bundle,
            crl: f.crl,
        }
    }

    #[test]
    fn reload_swaps_in_a_rotated_certificate_and_keeps_the_old_on_garbage() {
        let tmp = drover_testkit::process::TempDir::new("drover-agent-tls-reload");
        let pki = Pki::new(tmp.join("pki"));
        pki.create_ca(&options(false)).unwrap();
        let me = NodeName::new("node1").unwrap();
        let first = pki.issue_node(&me, &options(false)).unwrap();
        let files = files_of(&pki, &me);
        let connector = connector(&files, &me, "127.0.0.1").unwrap();
        assert_eq!(connector.settings().identity().serial(), &first.serial);

        // Rotated: the next dial presents the new certificate.
        let second = pki.issue_node(&me, &options(true)).unwrap();
        let line = reload(&connector, &files, &me).unwrap();
        assert!(line.contains(&second.serial.to_string()), "{line}");
        assert_eq!(connector.settings().identity().serial(), &second.serial);

        // Garbage in the certificate file: refused with the file's name, nothing changes.
        std::fs::write(&files.certificate, "not a certificate").unwrap();
        let err = reload(&connector, &files, &me).unwrap_err();
        assert!(
            err.contains(&files.certificate.display().to_string()),
            "{err}"
        );
        assert_eq!(connector.settings().identity().serial(), &second.serial);

        // A valid certificate of another node: refused, nothing changes.
        let other = NodeName::new("node2").unwrap();
        pki.issue_node(&other, &options(false)).unwrap();
        let theirs = files_of(&pki, &other);
        let err = reload(&connector, &theirs, &me).unwrap_err();
        assert!(err.contains("for node 'node2'"), "{err}");
        assert_eq!(connector.settings().identity().serial(), &second.serial);
    }

    /// Issue 25: a CRL from before a revocation of the manager's certificate,
    /// put back and reloaded, must not un-revoke it: the one in force stays.
    #[test]
    fn an_older_crl_is_refused_on_reload_and_the_one_in_force_kept() {
        let tmp = drover_testkit::process::TempDir::new("drover-agent-tls-old-crl");
        let pki = Pki::new(tmp.join("pki"));
        pki.create_ca(&options(false)).unwrap();
        let manager = pki.issue_manager(&["127.0.0.1"], &options(false)).unwrap();
        let me = NodeName::new("node1").unwrap();
        pki.issue_node(&me, &options(false)).unwrap();
        let files = files_of(&pki, &me);
        let before_revocation = std::fs::read(pki.crl()).unwrap();
        let connector = connector(&files, &me, "127.0.0.1").unwrap();
        assert_eq!(connector.settings().revoked_count(), 0);

        // The manager's key leaked: its certificate is revoked, the agents reload.
        pki.revoke(&[drover_tls::pki::RevokeTarget::Serial(manager.serial)])
            .unwrap();
        reload(&connector, &files, &me).unwrap();
        assert_eq!(connector.settings().revoked_count(), 1);
        let in_force = std::fs::read(pki.crl()).unwrap();

        // The attack: the old file back in place, then a reload.
        std::fs::write(pki.crl(), &before_revocation).unwrap();
        let err = reload(&connector, &files, &me).unwrap_err();
        assert!(err.contains("lower than the"), "{err}");
        assert!(err.contains(&pki.crl().display().to_string()), "{err}");
        assert_eq!(
            connector.settings().revoked_count(),
            1,
            "the manager's certificate is still revoked"
        );

        // The same CRL again, and a newer one, are taken.
        std::fs::write(pki.crl(), &in_force).unwrap();
        reload(&connector, &files, &me).unwrap();
        pki.revoke(&[drover_tls::pki::RevokeTarget::Serial(
            "0a:0b".parse().unwrap(),
        )])
        .unwrap();
        reload(&connector, &files, &me).unwrap();
        assert_eq!(connector.settings().revoked_count(), 2);
    }
}
