//! D-Bus values ↔ [`Marshalled`] (signature + D-Bus little-endian bytes at
//! offset 0), the form run-time typed values take on the agent wire.
//!
//! Shapes (docs/architecture.md "Unit subscriptions"): unit properties
//! `a{sv}`, one property `v`, properties to set `a(sv)`, transient aux units
//! `a(sa(sv))`. Bytes from an agent are input from outside: a wrong
//! signature or bytes that do not decode are an error, never a panic.

use drover_protocol::Marshalled;
use std::collections::HashMap;
use zbus::export::serde::Serialize;
use zbus::wire::serialized::{Context, Data};
use zbus::wire::{LE, OwnedVariant, Variant};

#[derive(Debug, thiserror::Error)]
pub enum MarshalError {
    #[error("expected a value of type '{expected}', got '{got}'")]
    Signature { expected: &'static str, got: String },
    #[error("undecodable D-Bus value: {0}")]
    Decode(#[from] zbus::Error),
}

fn ctxt() -> Context {
    Context::new(LE, 0)
}

fn expect(m: &Marshalled, sig: &'static str) -> Result<(), MarshalError> {
    if m.signature == sig {
        Ok(())
    } else {
        Err(MarshalError::Signature {
            expected: sig,
            got: m.signature.escape_default().to_string(),
        })
    }
}

/// Encodes `value` with the D-Bus signature `sig`.
pub fn encode<T: Serialize + ?Sized>(sig: &str, value: &T) -> Result<Marshalled, MarshalError> {
    let data = zbus::wire::to_bytes_for_signature(ctxt(), sig, value)?;
    Ok(Marshalled {
        signature: sig.to_owned(),
        data: data.bytes().to_vec(),
    })
}

/// An `a{sv}` (unit properties).
pub fn dict_from(m: &Marshalled) -> Result<HashMap<String, OwnedVariant>, MarshalError> {
    expect(m, "a{sv}")?;
    let data = Data::new(m.data.as_slice(), ctxt());
    let (v, _): (HashMap<String, OwnedVariant>, _) = data.deserialize_for_signature("a{sv}")?;
    Ok(v)
}

/// A `v` (one property).
pub fn value_from(m: &Marshalled) -> Result<OwnedVariant, MarshalError> {
    expect(m, "v")?;
    let data = Data::new(m.data.as_slice(), ctxt());
    let (v, _): (Variant<'_>, _) = data.deserialize_for_signature("v")?;
    Ok(v.try_into_owned()?)
}

/// `a(sv)` from what a D-Bus caller passed.
pub fn properties_to(props: &[(String, OwnedVariant)]) -> Result<Marshalled, MarshalError> {
    encode("a(sv)", props)
}

/// `a(sa(sv))` from what a D-Bus caller passed.
pub fn aux_to(aux: &[(String, Vec<(String, OwnedVariant)>)]) -> Result<Marshalled, MarshalError> {
    encode("a(sa(sv))", aux)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_round_trip() {
        let mut map: HashMap<String, OwnedVariant> = HashMap::new();
        map.insert("ActiveState".into(), OwnedVariant::from(42u64));
        map.insert(
            "Id".into(),
            Variant::from("a.service").try_into_owned().unwrap(),
        );
        let m = encode("a{sv}", &map).unwrap();
        let back = dict_from(&m).unwrap();
        assert_eq!(u64::try_from(back["ActiveState"].clone()).unwrap(), 42);
        assert_eq!(String::try_from(back["Id"].clone()).unwrap(), "a.service");
    }

    #[test]
    fn value_round_trip_and_wrong_shapes() {
        let v = Variant::from(7u32);
        let m = encode("v", &v).unwrap();
        assert_eq!(u32::try_from(value_from(&m).unwrap()).unwrap(), 7);
        assert!(matches!(dict_from(&m), Err(MarshalError::Signature { .. })));
        let garbage = Marshalled {
            signature: "a{sv}".into(),
            data: vec![0xff, 0xff, 0xff, 0x7f, 1, 2],
        };
        assert!(matches!(dict_from(&garbage), Err(MarshalError::Decode(_))));
        let props = vec![("CPUWeight".to_owned(), OwnedVariant::from(100u64))];
        let m = properties_to(&props).unwrap();
        assert_eq!(m.signature, "a(sv)");
        let aux = vec![("x.service".to_owned(), props)];
        assert_eq!(aux_to(&aux).unwrap().signature, "a(sa(sv))");
    }
}
