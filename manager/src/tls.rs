//! The manager's TLS settings from its configuration: the acceptor loaded and
//! checked at start ([`load_tls`]), and the configured paths as `drover-tls`
//! takes them ([`tls_files`]), which a reload reads again. Its own module so
//! that start-up (`server`) and reload (`reload`) share it without one
//! importing the other.

use drover_config::ManagerConfig;
use drover_tls::{Acceptor, ServerSettings};

/// The acceptor for `config.tls`, loaded and checked (`None` without TLS).
pub fn load_tls(config: &ManagerConfig) -> Result<Option<Acceptor>, drover_tls::Error> {
    let Some(files) = &config.tls else {
        return Ok(None);
    };
    let settings = ServerSettings::load(&tls_files(files))?;
    tracing::info!(
        "TLS: manager certificate serial {}, valid until {}; {} revoked certificate(s) in the CRL",
        settings.serial(),
        drover_tls::format_utc(settings.not_after()),
        settings.revoked_count()
    );
    Ok(Some(Acceptor::new(settings)))
}

/// The config's paths as `drover-tls` takes them.
pub fn tls_files(files: &drover_config::TlsFiles) -> drover_tls::TlsFiles {
    drover_tls::TlsFiles {
        certificate: files.certificate.clone(),
        private_key: files.private_key.clone(),
        ca_bundle: files.ca_bundle.clone(),
        crl: files.crl.clone(),
    }
}
