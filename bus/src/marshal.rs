//! D-Bus values ↔ [`Marshalled`], the protocol's carrier for values whose
//! D-Bus type is only known at run time (unit properties, transient unit
//! properties).
//!
//! A [`Marshalled`] is a D-Bus signature plus the value in D-Bus wire format,
//! **little endian, starting at offset 0** (alignment counted from there).
//! Both directions go through zbus's own (de)serializer, so what the manager
//! receives is exactly what systemd sent, and what the agent hands systemd
//! was checked against the signature the method needs. The agent encodes
//! what systemd answers and decodes what the manager forwards; the manager
//! encodes what its D-Bus callers pass and decodes what agents answer — with
//! the same two functions, so both ends read one format.
//!
//! Shapes (docs/dev/architecture.md "Unit subscriptions"): unit properties
//! `a{sv}` ([`PropertyMap`]; [`OrderedProperties`] where the order systemd
//! sent them in must survive, as in `UnitPropertiesChanged`), one property `v`, properties to set `a(sv)`
//! ([`PropertyList`]), transient aux units `a(sa(sv))` ([`AuxUnits`]).
//!
//! Invariants: decoding never trusts its input — the signature must be the one
//! the caller expects, the bytes must decode completely (no trailing bytes),
//! and any failure is an `org.freedesktop.DBus.Error.InvalidArgs` error with
//! a one-line reason, never a panic.

use drover_protocol::error_names::INVALID_ARGS;
use drover_protocol::{Marshalled, RemoteError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use zbus::OwnedVariant;
use zbus::wire::serialized::{Context, Data};
use zbus::wire::{DynamicType, LE, Type};

/// `a{sv}`: a property dictionary (`GetAll`, `PropertiesChanged`).
pub type PropertyMap = HashMap<String, OwnedVariant>;
/// `a{sv}` in the order its entries came in: what `PropertiesChanged`
/// carries from systemd and `UnitPropertiesChanged` forwards. BlueChi keeps
/// systemd's order, and `bluechictl monitor` shows the first entry, so a
/// [`PropertyMap`] (hash order, different in every process) would change
/// what clients print from run to run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderedProperties(pub Vec<(String, OwnedVariant)>);

impl OrderedProperties {
    /// The property names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }
}

impl Type for OrderedProperties {
    const SIGNATURE: &'static zbus::Signature = PropertyMap::SIGNATURE;
}

impl Serialize for OrderedProperties {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> serde::Deserialize<'de> for OrderedProperties {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = OrderedProperties;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a{sv} dictionary")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                // No size hint trusted: the count comes from the wire.
                let mut entries = Vec::new();
                while let Some(entry) = access.next_entry::<String, OwnedVariant>()? {
                    entries.push(entry);
                }
                Ok(OrderedProperties(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// `a(sv)`: a property list (`SetUnitProperties`, `StartTransientUnit`).
pub type PropertyList = Vec<(String, OwnedVariant)>;
/// `a(sa(sv))`: auxiliary units of `StartTransientUnit`.
pub type AuxUnits = Vec<(String, PropertyList)>;

fn context() -> Context {
    Context::new(LE, 0)
}

/// Encodes `value` with its own signature.
pub fn encode<T>(value: &T) -> Result<Marshalled, RemoteError>
where
    T: ?Sized + Serialize + DynamicType,
{
    let signature = value.signature().to_string();
    let data = zbus::wire::to_bytes(context(), value).map_err(|e| {
        RemoteError::failed(format!("cannot encode a `{signature}` D-Bus value: {e}"))
    })?;
    Ok(Marshalled {
        signature,
        data: data.bytes().to_vec(),
    })
}

/// Decodes `m` as a `T`; `m.signature` must be exactly `T`'s signature.
pub fn decode<T>(m: &Marshalled) -> Result<T, RemoteError>
where
    T: DeserializeOwned + Type,
{
    let expected = T::SIGNATURE.to_string();
    if m.signature != expected {
        return Err(RemoteError::new(
            INVALID_ARGS,
            format!(
                "expected a D-Bus value of type `{expected}`, got `{}`",
                m.signature.chars().take(64).collect::<String>()
            ),
        ));
    }
    let data = Data::new(m.data.as_slice(), context());
    let (value, used) = data.deserialize::<T>().map_err(|e| {
        RemoteError::new(
            INVALID_ARGS,
            format!("malformed `{expected}` D-Bus value: {e}"),
        )
    })?;
    if used != m.data.len() {
        return Err(RemoteError::new(
            INVALID_ARGS,
            format!(
                "malformed `{expected}` D-Bus value: {} trailing bytes",
                m.data.len() - used
            ),
        ));
    }
    Ok(value)
}

/// Encodes a single variant (`v`), e.g. the reply of `Properties.Get`.
pub fn encode_variant(value: &OwnedVariant) -> Result<Marshalled, RemoteError> {
    encode(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zbus::Variant;

    fn ov<'a>(v: impl Into<Variant<'a>>) -> OwnedVariant {
        OwnedVariant::try_from(v.into()).unwrap()
    }

    #[test]
    fn property_map_round_trips_in_little_endian() {
        let mut map = PropertyMap::new();
        map.insert("ActiveState".into(), ov("active"));
        map.insert("NRestarts".into(), ov(3u32));
        map.insert("CPUUsageNSec".into(), ov(u64::MAX));
        let m = encode(&map).unwrap();
        assert_eq!(m.signature, "a{sv}");
        // The array length leads, little endian, then padding to the
        // 8-byte alignment of dict entries.
        let len = u32::from_le_bytes(m.data[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, m.data.len() - 8);
        let back: PropertyMap = decode(&m).unwrap();
        assert_eq!(back, map);
    }

    /// Entries keep their order both ways, and the bytes are those of the
    /// same dictionary built by zbus itself (so it is a real `a{sv}`).
    #[test]
    fn ordered_properties_keep_their_order() {
        let names = ["Zeta", "Alpha", "Mid", "Beta", "Omega", "Gamma", "A", "Z"];
        let ordered = OrderedProperties(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| ((*n).to_owned(), ov(i as u32)))
                .collect(),
        );
        let m = encode(&ordered).unwrap();
        assert_eq!(m.signature, "a{sv}");
        let back: OrderedProperties = decode(&m).unwrap();
        assert_eq!(back.keys().collect::<Vec<_>>(), names);
        assert_eq!(back, ordered);
        // A PropertyMap reads the same bytes.
        let map: PropertyMap = decode(&m).unwrap();
        assert_eq!(map.len(), names.len());
        assert_eq!(u32::try_from(&map["Mid"]).unwrap(), 2);
    }

    #[test]
    fn property_list_and_aux_round_trip() {
        let list: PropertyList = vec![
            ("Description".into(), ov("hello")),
            ("RemainAfterExit".into(), ov(true)),
        ];
        let m = encode(&list).unwrap();
        assert_eq!(m.signature, "a(sv)");
        assert_eq!(decode::<PropertyList>(&m).unwrap(), list);
        let aux: AuxUnits = vec![];
        let m = encode(&aux).unwrap();
        assert_eq!(m.signature, "a(sa(sv))");
        assert_eq!(decode::<AuxUnits>(&m).unwrap(), aux);
    }

    #[test]
    fn a_variant_keeps_its_inner_type() {
        let m = encode_variant(&ov(42i32)).unwrap();
        assert_eq!(m.signature, "v");
        let back: OwnedVariant = decode(&m).unwrap();
        assert_eq!(i32::try_from(back).unwrap(), 42);
    }

    #[test]
    fn wrong_signature_trailing_bytes_and_garbage_are_invalid_args() {
        let list: PropertyList = vec![("A".into(), ov(1u8))];
        let m = encode(&list).unwrap();
        let e = decode::<PropertyMap>(&m).unwrap_err();
        assert_eq!(e.name, INVALID_ARGS);
        assert!(
            e.message.contains("a{sv}") && e.message.contains("a(sv)"),
            "{e}"
        );

        let mut long = m.clone();
        long.data.push(0);
        let e = decode::<PropertyList>(&long).unwrap_err();
        assert!(e.message.contains("trailing"), "{e}");

        let cut = Marshalled {
            signature: m.signature.clone(),
            data: m.data[..m.data.len() - 1].to_vec(),
        };
        assert_eq!(decode::<PropertyList>(&cut).unwrap_err().name, INVALID_ARGS);
    }

    /// The manager's use: a dictionary from an agent read back.
    #[test]
    fn dict_round_trip() {
        let mut map: PropertyMap = HashMap::new();
        map.insert("ActiveState".into(), OwnedVariant::from(42u64));
        map.insert(
            "Id".into(),
            Variant::from("a.service").try_into_owned().unwrap(),
        );
        let m = encode(&map).unwrap();
        let back: PropertyMap = decode(&m).unwrap();
        assert_eq!(u64::try_from(back["ActiveState"].clone()).unwrap(), 42);
        assert_eq!(String::try_from(back["Id"].clone()).unwrap(), "a.service");
    }

    /// The manager's use: one value, and shapes that are not what was asked.
    #[test]
    fn value_round_trip_and_wrong_shapes() {
        let v = Variant::from(7u32);
        let m = encode(&v).unwrap();
        assert_eq!(m.signature, "v");
        assert_eq!(
            u32::try_from(decode::<OwnedVariant>(&m).unwrap()).unwrap(),
            7
        );
        let e = decode::<PropertyMap>(&m).unwrap_err();
        assert!(
            e.message.starts_with("expected a D-Bus value of type"),
            "{e}"
        );
        let garbage = Marshalled {
            signature: "a{sv}".into(),
            data: vec![0xff, 0xff, 0xff, 0x7f, 1, 2],
        };
        let e = decode::<PropertyMap>(&garbage).unwrap_err();
        assert!(e.message.starts_with("malformed `a{sv}`"), "{e}");
        let props: PropertyList = vec![("CPUWeight".to_owned(), OwnedVariant::from(100u64))];
        let m = encode(&props).unwrap();
        assert_eq!(m.signature, "a(sv)");
        let aux: AuxUnits = vec![("x.service".to_owned(), props)];
        assert_eq!(encode(&aux).unwrap().signature, "a(sa(sv))");
    }

    proptest! {
        /// Random bytes under every signature we accept: an error or a value,
        /// never a panic.
        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            for signature in ["a{sv}", "a(sv)", "a(sa(sv))", "v"] {
                let m = Marshalled { signature: signature.into(), data: data.clone() };
                let _ = decode::<PropertyMap>(&m);
                let _ = decode::<PropertyList>(&m);
                let _ = decode::<AuxUnits>(&m);
                let _ = decode::<OwnedVariant>(&m);
            }
        }
    }
}
