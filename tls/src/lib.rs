//! drover-tls: mutual TLS for the agent ↔ manager link, and the certificate
//! tool (`drover-pki`) that makes what it needs.
//!
//! The agent port is reachable from the network and an agent acts as root on
//! its node, so whoever speaks for a node or for the manager owns it. This
//! crate is the whole of that proof; the daemons
//! only load settings, accept or connect, and read the peer's identity (and
//! the manager, where the records it read end: [`records`]).
//!
//! # Decisions
//!
//! * **TLS 1.3 only, ring provider, mutual authentication.** Both configs are
//!   built with an explicit [`rustls::crypto::ring`] provider (no process-wide
//!   default is installed or needed) and the TLS 1.3 version list only.
//! * **The manager proves itself.** It presents a server certificate; an agent
//!   checks it against its CA bundle *and* the name it dialled (a DNS name or
//!   an IP address SAN, see [`Connector::new`]), and requires the
//!   serverAuth purpose, so a node certificate cannot pose as the manager.
//! * **Agents prove themselves.** The manager requires a client certificate
//!   chaining to its CA bundle with the clientAuth purpose; a connection
//!   without one fails inside the TLS handshake and never reaches drover's
//!   protocol.
//! * **Node identity = the single DNS name in the client certificate's
//!   subjectAltName**, which must be a valid drover node name
//!   ([`drover_protocol::NodeName`]). A certificate with no DNS SAN or with
//!   several is refused *in the handshake*, with a reason the manager can log
//!   (the peer only gets an alert). The subject CN is ignored; other SAN types
//!   are ignored. See [`NodeIdentity`].
//! * **Revocation = a CRL file** (PEM, one or more CRLs, each signed by a CA of
//!   the bundle — checked at load). The manager checks the client certificate
//!   against it in every handshake; an agent given the CRL checks the
//!   manager's certificate too. A certificate whose issuer has no CRL in the
//!   file is accepted (so a bundle of an old and a new CA works during a
//!   rotation with one CRL). The CRL's nextUpdate is *not* enforced: an
//!   out-of-date CRL still revokes what it lists instead of locking every node
//!   out. After a reload, [`ServerSettings::is_revoked`] tells whether an
//!   identity already online is now revoked, so the manager can drop it.
//! * **No session resumption.** Tickets and the session cache are off on both
//!   sides: every connection is a full handshake that sees the CA and CRL in
//!   force at that moment (a resumed session would skip the revocation check).
//! * **Own certificate checked at load.** An expired or not-yet-valid
//!   certificate of one's own is refused at load with the dates (the peer
//!   would refuse it anyway; a clear error at start or reload beats opaque
//!   handshake failures). [`ServerSettings::not_after`] lets the manager warn
//!   ahead of expiry.
//! * **Private keys** (PKCS#8, SEC1 or PKCS#1 PEM, unencrypted) are refused when
//!   their file grants any permission to group or others, as ssh does, and
//!   when they do not match the certificate.
//!
//! # Reload
//!
//! [`ServerSettings`] and [`ClientSettings`] are immutable. [`Acceptor`] and
//! [`Connector`] are cheap-to-clone handles on the settings in force;
//! `reload` swaps in new ones atomically. A handshake uses the settings it
//! started with; established connections keep theirs (rustls holds the
//! config by `Arc`), so reloading drops nothing. To reload: load new settings
//! (on error keep the old ones and log), `reload`, then on the manager drop
//! the sessions whose identity [`ServerSettings::is_revoked`] now lists.
//!
//! # What the caller owns
//!
//! * **Handshake timeout.** [`Acceptor::accept`] and [`Connector::connect`]
//!   wait for the peer as long as it takes; wrap them in
//!   `tokio::time::timeout` (a few seconds) and cap concurrent handshakes.
//!   Garbage (plaintext, a drover frame, random bytes) fails at the first
//!   record header; a peer that sends a valid-looking partial record and then
//!   stalls is what the timeout is for.
//! * **Where a refused client certificate shows.** In TLS 1.3 the client
//!   finishes its handshake before the server has checked its certificate,
//!   so `Connector::connect` succeeds and the agent sees the refusal as an
//!   error on its first read ("received fatal alert: …"). The manager sees
//!   it as the error of [`Acceptor::accept`], with the reason.
//! * **Admission.** This crate says who the peer *is*; whether that node may
//!   register (`AllowedNodeNames`, the Hello's name equal to
//!   [`NodeIdentity::node`]) is the manager's decision.
//!
//! # Layout
//!
//! * [`error`] — load errors naming the file and what is wrong; identity errors.
//! * `files` — reading PEM files (size cap, key permissions).
//! * [`identity`] — [`NodeIdentity`] and [`Serial`] from a certificate.
//! * `revocation` — the (issuer, serial) set of the CRL file.
//! * `verifier` — the manager's client-certificate verifier: webpki + identity.
//! * [`settings`] — [`TlsFiles`] → [`ServerSettings`] / [`ClientSettings`].
//! * `current` — the swappable `Arc` behind the reload handles.
//! * [`acceptor`] / [`connector`] — the manager's and the agent's side;
//!   [`server_stream`] — the manager's established link, holding no buffer
//!   while idle.
//! * [`records`] — record boundaries of the bytes read, and the exact size
//!   of a sealed record (the manager's reader marks its socket with them).
//! * [`pki`] (feature `pki`) — CA, manager and node certificates, the CRL;
//!   the `drover-pki` command ([`pki_cli`], feature `pki`) is a thin skin over it.

pub mod acceptor;
pub mod connector;
mod current;
pub mod error;
mod files;
pub mod identity;
#[cfg(feature = "pki")]
pub mod pki;
#[cfg(feature = "pki")]
pub mod pki_cli;
pub mod records;
mod revocation;
pub mod server_stream;
pub mod settings;
mod utc;
mod verifier;

pub use acceptor::{Acceptor, CertificateRefused, REFUSAL_CLASSES, peer_identity, refusal_class};
pub use connector::Connector;
pub use drover_config::TlsFiles;
pub use error::{Error, IdentityError};
pub use identity::{NodeIdentity, ParseSerialError, Serial};
pub use revocation::CrlRollback;
pub use settings::{ClientSettings, ServerSettings};
pub use utc::format as format_utc;

/// The TLS stream types the daemons hold: the agent's is tokio-rustls's, the
/// manager's drover's own on rustls's unbuffered API ([`server_stream`]).
pub use server_stream::ServerStream;
pub use tokio_rustls::client::TlsStream as ClientStream;
