//! The manager's TLS acceptor from its configuration, loaded and checked at
//! start ([`load_tls`]). `drover-tls` takes the config's `TlsFiles` as they
//! are, so a reload (`reload`) reads the same files again with no conversion.

use drover_config::ManagerConfig;
use drover_tls::{Acceptor, ServerSettings};

/// The acceptor for `config.tls`, loaded and checked (`None` without TLS).
pub fn load_tls(config: &ManagerConfig) -> Result<Option<Acceptor>, drover_tls::Error> {
    let Some(files) = &config.tls else {
        return Ok(None);
    };
    let settings = ServerSettings::load(files)?;
    tracing::info!(
        "TLS: manager certificate serial {}, valid until {}; {} revoked certificate(s) in the CRL",
        settings.serial(),
        drover_tls::format_utc(settings.not_after()),
        settings.revoked_count()
    );
    Ok(Some(Acceptor::new(settings)))
}
