//! The fleet's certificates, made with `drover_tls::pki` (what `drover-pki`
//! runs): a CA, the manager's certificate for 127.0.0.1, and one client
//! certificate per simulated node.
//!
//! The directory is kept between runs: issuing tens of thousands of
//! certificates (each key and certificate written and synced) takes longer
//! than a run, so only the missing ones are issued. Loading them into one
//! `drover_tls::Connector` per node happens before any timing starts.

use crate::fleet::agent::node_names;
use anyhow::{Context, Result};
use drover_tls::pki::{Options, Pki, Validity};
use drover_tls::{ClientSettings, Connector};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The name agents dial and the manager's certificate names.
pub const MANAGER_ADDRESS: &str = "127.0.0.1";

/// See the module docs.
pub struct FleetPki {
    pki: Pki,
}

impl FleetPki {
    /// Opens the PKI in `dir`, making what is missing: the CA, the
    /// manager's certificate, node certificates `0..count`.
    pub fn prepare(dir: &Path, count: usize) -> Result<Self> {
        let pki = Pki::new(dir);
        let options = Options {
            validity: Validity::days(30)?,
            force: false,
        };
        if !pki.ca_key().exists() {
            pki.create_ca(&options).context("making the fleet's CA")?;
        }
        if !pki.manager_key().exists() {
            pki.issue_manager(&[MANAGER_ADDRESS], &options)
                .context("issuing the manager's certificate")?;
        }
        let missing: Vec<_> = node_names(count)
            .into_iter()
            .filter(|n| !pki.node_key(n).exists())
            .collect();
        if !missing.is_empty() {
            let t = Instant::now();
            pki.issue_nodes(&missing, &options)
                .context("issuing node certificates")?;
            eprintln!(
                "fleet: issued {} node certificates in {:.1} s ({})",
                missing.len(),
                t.elapsed().as_secs_f64(),
                dir.display()
            );
        }
        Ok(Self { pki })
    }

    /// The manager's `TLS*` config keys.
    pub fn manager_keys(&self) -> Vec<(&'static str, PathBuf)> {
        let files = self.pki.manager_files();
        let mut keys = vec![
            ("TLSCertificate", files.certificate),
            ("TLSPrivateKey", files.private_key),
            ("TLSCertificateAuthority", files.ca_bundle),
        ];
        if let Some(crl) = files.crl {
            keys.push(("TLSRevocationList", crl));
        }
        keys
    }

    /// One connector per node `0..count`, each with that node's certificate.
    pub fn connectors(&self, count: usize) -> Result<Vec<Connector>> {
        node_names(count)
            .iter()
            .map(|node| {
                let settings = ClientSettings::load(&self.pki.node_files(node))
                    .with_context(|| format!("loading the certificate of {node}"))?;
                Ok(Connector::new(settings, MANAGER_ADDRESS)?)
            })
            .collect()
    }
}
