//! Optional serde support: a [`Version`] travels as its string form.

use crate::Version;
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};
use std::fmt;

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(VersionVisitor)
    }
}

struct VersionVisitor;

impl Visitor<'_> for VersionVisitor {
    type Value = Version;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an rpm version string such as \"1:2.0-3\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Version, E> {
        Version::parse(v).map_err(E::custom)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Version, E> {
        Version::try_from(v).map_err(E::custom)
    }
}
