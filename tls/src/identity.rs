//! Who a certificate names: [`NodeIdentity`] (node name, serial, notAfter)
//! and the [`Serial`] that revocation speaks of.
//!
//! The node name is the certificate's single DNS subjectAltName and must be a
//! valid [`NodeName`]; no DNS SAN, several, or a name drover would refuse is an
//! [`IdentityError`]. The CN and non-DNS SANs are ignored: the CN is free text
//! that some CAs fill in loosely, and one rule is easier to audit than two.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use drover_protocol::NodeName;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::error::IdentityError;
use crate::utc;

/// RFC 5280: a CA must not use serials longer than 20 octets.
const SERIAL_MAX: usize = 20;
/// How many names of a refused certificate an error message repeats.
const NAMES_SHOWN: usize = 4;

/// A certificate serial number: its magnitude, big-endian, without leading
/// zero bytes (so the DER sign byte does not make two spellings of one serial).
///
/// Displayed as lowercase hex pairs joined by `:`; parsed from hex with or
/// without colons, any case, with an optional `0x`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Serial(Vec<u8>);

impl Serial {
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
        Self(bytes[start..].to_vec())
    }

    /// The magnitude, big-endian, no leading zero bytes (empty for zero).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("00");
        }
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Serial({self})")
    }
}

/// A string that is not a certificate serial.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{input}' is not a certificate serial: {why}")]
pub struct ParseSerialError {
    input: String,
    why: &'static str,
}

impl FromStr for Serial {
    type Err = ParseSerialError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |why| ParseSerialError {
            input: s.chars().take(80).flat_map(char::escape_default).collect(),
            why,
        };
        let hex = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        let digits: Vec<u8> = hex.bytes().filter(|b| *b != b':').collect();
        if digits.is_empty() {
            return Err(fail("it is empty"));
        }
        let mut nibbles = Vec::with_capacity(digits.len() + 1);
        if digits.len() % 2 == 1 {
            nibbles.push(0);
        }
        for d in digits {
            let v = (d as char)
                .to_digit(16)
                .ok_or_else(|| fail("use hexadecimal digits, optionally in pairs joined by ':'"))?;
            nibbles.push(v as u8);
        }
        let bytes: Vec<u8> = nibbles.chunks(2).map(|p| (p[0] << 4) | p[1]).collect();
        let serial = Self::from_bytes(&bytes);
        if serial.0.len() > SERIAL_MAX {
            return Err(fail("it is longer than 20 bytes"));
        }
        Ok(serial)
    }
}

/// The identity an agent proved in the TLS handshake.
///
/// Holds what the manager needs after the handshake and nothing more (it is
/// kept per session): the node name, the serial and issuer that revocation is
/// checked against, and the end of validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    node: NodeName,
    serial: Serial,
    not_after: SystemTime,
    /// DER of the issuer's name: serials are unique per issuer only.
    issuer: Vec<u8>,
}

impl NodeIdentity {
    /// Reads the identity from a DER certificate. Does not verify the
    /// certificate: the handshake did, or will.
    pub fn from_certificate(der: &[u8]) -> Result<Self, IdentityError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| IdentityError::Unparsable(e.to_string()))?;
        let node = node_name(&cert)?;
        Ok(Self {
            node,
            serial: Serial::from_bytes(cert.raw_serial()),
            not_after: utc::from_unix(cert.validity().not_after.timestamp()),
            issuer: cert.issuer().as_raw().to_vec(),
        })
    }

    /// The node this certificate speaks for.
    pub fn node(&self) -> &NodeName {
        &self.node
    }

    pub fn serial(&self) -> &Serial {
        &self.serial
    }

    /// The certificate's notAfter.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    pub(crate) fn issuer(&self) -> &[u8] {
        &self.issuer
    }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node {} (certificate serial {}, valid until {})",
            self.node.as_str(),
            self.serial,
            utc::format(self.not_after)
        )
    }
}

fn node_name(cert: &X509Certificate<'_>) -> Result<NodeName, IdentityError> {
    let san = cert
        .subject_alternative_name()
        .map_err(|e| IdentityError::BadSubjectAltName(e.to_string()))?;
    let mut dns = Vec::new();
    for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
        match name {
            GeneralName::DNSName(d) => dns.push(*d),
            // A DNS name that is not text: refuse rather than skip it, or a
            // certificate could hide a second name from this count.
            GeneralName::Invalid(..) => {
                return Err(IdentityError::BadSubjectAltName(
                    "it holds an entry that cannot be decoded".into(),
                ));
            }
            _ => {}
        }
    }
    match dns.as_slice() {
        [] => Err(IdentityError::NoDnsName),
        [one] => NodeName::new(*one).map_err(IdentityError::BadNodeName),
        several => {
            let mut shown: Vec<String> = several
                .iter()
                .take(NAMES_SHOWN)
                .map(|s| s.chars().take(80).flat_map(char::escape_default).collect())
                .collect();
            if several.len() > NAMES_SHOWN {
                shown.push("…".into());
            }
            Err(IdentityError::SeveralDnsNames {
                count: several.len(),
                shown,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_spellings() {
        let a: Serial = "0x00:1f:A0".parse().unwrap();
        let b: Serial = "1fa0".parse().unwrap();
        let c: Serial = "fa0".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "1f:a0");
        assert_eq!(c.as_bytes(), &[0x0f, 0xa0]);
        assert_eq!(Serial::from_bytes(&[0, 0, 5]).to_string(), "05");
        assert_eq!(Serial::from_bytes(&[0]).to_string(), "00");
        assert!("".parse::<Serial>().is_err());
        assert!("node1".parse::<Serial>().is_err());
        assert!("ab".repeat(21).parse::<Serial>().is_err());
        assert!("00".repeat(30).parse::<Serial>().is_ok());
    }

    #[test]
    fn garbage_is_an_error() {
        for bytes in [
            &b""[..],
            b"\x30",
            b"\x30\x03\x02\x01\x01",
            b"not a certificate",
        ] {
            assert!(matches!(
                NodeIdentity::from_certificate(bytes),
                Err(IdentityError::Unparsable(_))
            ));
        }
    }
}
