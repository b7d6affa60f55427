//! JSON has no infinities and no NaN: `serde_json` writes them as `null`, which would turn
//! `add(1e308, 1e308)` into a silent `null`. [`check`] walks a value's serialization and
//! names the first non-finite float, so that such a result becomes an error instead.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};

/// A non-finite float, and where it was.
#[derive(Debug)]
pub(crate) struct NonFinite(pub(crate) String);

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NonFinite {}

impl ser::Error for NonFinite {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        NonFinite(msg.to_string())
    }
}

/// Ok when every float in `value`'s serialization is finite; else the first one's path
/// (`.field`, `[index]`) and value.
pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> Result<(), NonFinite> {
    // First without paths (no allocation per element: a 1,000-entry manifest costs a few
    // microseconds); only a value that fails is walked again to name the place.
    value.serialize(Walk { path: None }).or_else(|_| value.serialize(Walk { path: Some(String::new()) }))
}

/// A serializer that produces nothing and fails on a non-finite float; with a `path`, the
/// error names where it was.
struct Walk {
    path: Option<String>,
}

impl Walk {
    fn float(self, v: f64) -> Result<(), NonFinite> {
        if v.is_finite() {
            Ok(())
        } else {
            let at = match self.path.as_deref() {
                None | Some("") => "the value".to_owned(),
                Some(p) => format!("`{p}`"),
            };
            Err(NonFinite(format!("{at} is {v}, which JSON cannot represent")))
        }
    }

    fn child(&self, part: fmt::Arguments<'_>) -> Walk {
        Walk { path: self.path.as_ref().map(|p| format!("{p}{part}")) }
    }
}

/// Walks the elements or fields of a compound value.
struct Compound {
    walk: Walk,
    index: usize,
    key: Option<String>,
}

macro_rules! ok {
    ($($name:ident($($t:ty),*)),* $(,)?) => {
        $(fn $name(self, $(_: $t),*) -> Result<(), NonFinite> { Ok(()) })*
    };
}

impl ser::Serializer for Walk {
    type Ok = ();
    type Error = NonFinite;
    type SerializeSeq = Compound;
    type SerializeTuple = Compound;
    type SerializeTupleStruct = Compound;
    type SerializeTupleVariant = Compound;
    type SerializeMap = Compound;
    type SerializeStruct = Compound;
    type SerializeStructVariant = Compound;

    ok!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_f32(self, v: f32) -> Result<(), NonFinite> {
        self.float(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), NonFinite> {
        self.float(v)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Result<(), NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<(), NonFinite> {
        v.serialize(self.child(format_args!(".{variant}")))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound, NonFinite> {
        Ok(Compound { walk: self, index: 0, key: None })
    }
    fn serialize_tuple(self, _: usize) -> Result<Compound, NonFinite> {
        self.serialize_seq(None)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Compound, NonFinite> {
        self.serialize_seq(None)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
        _: usize,
    ) -> Result<Compound, NonFinite> {
        self.child(format_args!(".{v}")).serialize_seq(None)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound, NonFinite> {
        self.serialize_seq(None)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Compound, NonFinite> {
        self.serialize_seq(None)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
        _: usize,
    ) -> Result<Compound, NonFinite> {
        self.child(format_args!(".{v}")).serialize_seq(None)
    }
}

impl Compound {
    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), NonFinite> {
        let i = self.index;
        self.index += 1;
        v.serialize(self.walk.child(format_args!("[{i}]")))
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &str, v: &T) -> Result<(), NonFinite> {
        let sep = if self.walk.path.as_deref().is_none_or(str::is_empty) { "" } else { "." };
        v.serialize(self.walk.child(format_args!("{sep}{name}")))
    }
}

/// The element-wise compound traits: each element is walked with its index.
macro_rules! by_index {
    ($($tr:ident :: $method:ident),*) => {$(
        impl ser::$tr for Compound {
            type Ok = ();
            type Error = NonFinite;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), NonFinite> {
                self.element(v)
            }
            fn end(self) -> Result<(), NonFinite> {
                Ok(())
            }
        }
    )*};
}

by_index!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound {
    type Ok = ();
    type Error = NonFinite;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), NonFinite> {
        if self.walk.path.is_some() {
            self.key = Some(k.serialize(KeyName).unwrap_or_else(|_| "?".to_owned()));
        }
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), NonFinite> {
        let key = self.key.take().unwrap_or_default();
        self.field(&key, v)
    }
    fn end(self) -> Result<(), NonFinite> {
        Ok(())
    }
}

/// The field-wise compound traits: each field is walked with its name.
macro_rules! by_name {
    ($($tr:ident),*) => {$(
        impl ser::$tr for Compound {
            type Ok = ();
            type Error = NonFinite;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, name: &'static str, v: &T) -> Result<(), NonFinite> {
                self.field(name, v)
            }
            fn end(self) -> Result<(), NonFinite> {
                Ok(())
            }
        }
    )*};
}

by_name!(SerializeStruct, SerializeStructVariant);

/// A map key as text (strings and numbers; other keys are shown as `?`).
struct KeyName;

macro_rules! key_display {
    ($($name:ident($t:ty)),* $(,)?) => {
        $(fn $name(self, v: $t) -> Result<String, NonFinite> { Ok(v.to_string()) })*
    };
}

macro_rules! key_refused {
    ($($name:ident($($t:ty),*)),* $(,)?) => {
        $(fn $name(self, $(_: $t),*) -> Result<String, NonFinite> { Err(NonFinite(String::new())) })*
    };
}

impl ser::Serializer for KeyName {
    type Ok = String;
    type Error = NonFinite;
    type SerializeSeq = Impossible<String, NonFinite>;
    type SerializeTuple = Impossible<String, NonFinite>;
    type SerializeTupleStruct = Impossible<String, NonFinite>;
    type SerializeTupleVariant = Impossible<String, NonFinite>;
    type SerializeMap = Impossible<String, NonFinite>;
    type SerializeStruct = Impossible<String, NonFinite>;
    type SerializeStructVariant = Impossible<String, NonFinite>;

    key_display!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
    );
    key_refused!(serialize_bytes(&[u8]), serialize_none(), serialize_unit(), serialize_unit_struct(&'static str),);

    fn serialize_unit_variant(self, _: &'static str, _: u32, v: &'static str) -> Result<String, NonFinite> {
        Ok(v.to_owned())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<String, NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Result<String, NonFinite> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, NonFinite> {
        Err(NonFinite(String::new()))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NonFinite> {
        Err(NonFinite(String::new()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use super::*;

    #[derive(Serialize)]
    struct Out {
        loss: f32,
        steps: Vec<f64>,
        named: BTreeMap<String, f64>,
    }

    #[test]
    fn names_the_first_non_finite_float() {
        assert!(check(&1.5f64).is_ok());
        assert_eq!(check(&f64::INFINITY).unwrap_err().0, "the value is inf, which JSON cannot represent");
        let ok = Out { loss: 0.5, steps: vec![1.0, 2.0], named: BTreeMap::from([("a".into(), 1.0)]) };
        assert!(check(&ok).is_ok());
        let bad = Out { steps: vec![1.0, f64::NAN], ..ok };
        assert_eq!(check(&bad).unwrap_err().0, "`steps[1]` is NaN, which JSON cannot represent");
        let bad = Out { loss: 0.0, steps: vec![], named: BTreeMap::from([("w".into(), f64::NEG_INFINITY)]) };
        assert_eq!(check(&bad).unwrap_err().0, "`named.w` is -inf, which JSON cannot represent");
        assert!(check(&serde_json::json!({"a": [1, null, "x"]})).is_ok());
    }
}
