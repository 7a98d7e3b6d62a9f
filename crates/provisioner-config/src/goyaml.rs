//! The provisioner YAML read the way the Go provisioner reads it.
//!
//! The Go provisioner turns its YAML into JSON (`ghodss/yaml` over `gopkg.in/yaml.v2`, YAML 1.1)
//! and decodes that JSON into its settings with `encoding/json`. What a copied file relies on:
//!
//! * A key names a setting whatever its case (`Helper:` is `helper`), compared with Unicode
//!   simple case folding, so `ſ` (U+017F) counts as `s` and the Kelvin sign (U+212A) as `k`.
//! * A key written twice with the same spelling: the last one counts (yaml.v2 builds a map).
//!   Different spellings of one setting are all applied, in byte order of the key (JSON object
//!   keys come out sorted), so the last in that order counts; an all-lower-case key sorts after
//!   any spelling with capitals.
//! * `null` (`~`, `null`, or nothing) leaves a setting as it was, except a list, which it
//!   empties; a nested mapping (`features`) given twice is merged.
//! * YAML 1.1 booleans: `y`, `yes`, `on`, `true` and `n`, `no`, `off`, `false` in their lower,
//!   capitalised and upper-case forms.
//! * YAML 1.1 integers: `0x`/`0o`/`0b` prefixes, a leading `0` for octal, `_` between digits, and
//!   whole numbers written as floats (`1e3`).
//! * Merge keys (`<<: *anchor`) and only the first document of a file.
//!
//! Where Go refuses a value whose meaning is plain (a number or a boolean word for a text
//! setting, a quoted `"yes"` for a boolean, a quoted number for an integer), it is read here as
//! written; the difference can only make a file Go refuses load.
//!
//! Every value is decoded by serde_yaml_ng's deserializer, so a value of the wrong type is an
//! error with its line and column. The file is walked twice: first for the keys (to know which
//! occurrence of a key counts), then for the values that count.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The type of one setting.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// Text.
    Str,
    /// A boolean.
    Bool,
    /// A non-negative integer of at most `max`.
    Int { max: u64 },
    /// A list of text.
    StrList,
    /// A mapping of further settings.
    Map(&'static [Field]),
}

/// One setting: its name (the Go `json` tag) and its type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
}

/// A decoded setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Str(String),
    Bool(bool),
    Int(u64),
    StrList(Vec<String>),
    Map(Settings),
}

/// The settings a file gives, by name; a setting the file leaves alone is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settings(BTreeMap<&'static str, Value>);

impl Settings {
    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// Go's `encoding/json` decoding one more object into an existing struct: a nested mapping
    /// merges, anything else replaces.
    fn merge(&mut self, other: Settings) {
        for (name, value) in other.0 {
            match (self.0.get_mut(name), value) {
                (Some(Value::Map(mine)), Value::Map(theirs)) => mine.merge(theirs),
                (_, value) => {
                    self.0.insert(name, value);
                }
            }
        }
    }
}

/// A setting given more than once in one mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repeated {
    /// The setting, with its parent (`features.pki`).
    pub(crate) setting: String,
    /// Every key naming it, as written, in the file's order.
    pub(crate) written: Vec<String>,
    /// The key whose value counts (the last applied, for a merged mapping).
    pub(crate) used: String,
    /// A mapping given under several spellings: they are merged.
    pub(crate) merged: bool,
}

/// What a file holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Decoded {
    pub(crate) settings: Settings,
    /// Keys naming no setting, with their parent (`features.pkj`), each once, in file order.
    pub(crate) unknown: Vec<String>,
    /// Settings given more than once (not counting keys brought in by a merge key).
    pub(crate) repeated: Vec<Repeated>,
    /// The file holds more than one YAML document; only the first is read.
    pub(crate) extra_documents: bool,
}

/// Reads `text` against `schema`.
pub(crate) fn decode(
    text: &str,
    schema: &'static [Field],
) -> Result<Decoded, serde_yaml_ng::Error> {
    // Pass 1: the keys of every mapping that holds settings.
    let mut collected = Collected::default();
    let mut docs = serde_yaml_ng::Deserializer::from_str(text);
    let Some(first) = docs.next() else {
        return Ok(Decoded::default());
    };
    let root = RootSeed {
        schema,
        pass: Pass::Keys(&mut collected),
    }
    .deserialize(first)?;
    let extra_documents = docs.next().is_some();
    if !root {
        // An empty document: every default (the Go provisioner stops on a nil pointer here).
        return Ok(Decoded {
            extra_documents,
            ..Decoded::default()
        });
    }
    let plans: HashMap<Vec<usize>, Plan> = collected
        .instances
        .into_iter()
        .map(|(path, items)| (path, Plan::new(&items)))
        .collect();

    // Pass 2: the values that count, typed.
    let mut values = HashMap::new();
    let mut docs = serde_yaml_ng::Deserializer::from_str(text);
    if let Some(first) = docs.next() {
        RootSeed {
            schema,
            pass: Pass::Values {
                plans: &plans,
                values: &mut values,
            },
        }
        .deserialize(first)?;
    }

    let mut decoded = Decoded {
        extra_documents,
        ..Decoded::default()
    };
    decoded.settings = assemble(&[], schema, "", &plans, &mut values, &mut decoded);
    Ok(decoded)
}

/// Whether `key` names the setting `name` as `encoding/json` matches a key to a field tag
/// when no tag equals it exactly: equal under Unicode simple case folding.
pub(crate) fn folds_to(key: &str, name: &str) -> bool {
    let mut k = key.chars().map(fold);
    let mut n = name.chars().map(fold);
    loop {
        match (k.next(), n.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// The representative of `c`'s simple case folding orbit, for the characters a setting name is
/// made of (ASCII). The only non-ASCII characters folding to an ASCII letter are U+017F (long
/// s, to `s`) and U+212A (Kelvin sign, to `k`); any other non-ASCII character stays itself and
/// so matches no setting name.
fn fold(c: char) -> char {
    match c {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    }
}

/// The setting `key` names: the one whose name equals it, else one it folds to.
fn field_for(schema: &'static [Field], key: &str) -> Option<&'static Field> {
    schema
        .iter()
        .find(|f| f.name == key)
        .or_else(|| schema.iter().find(|f| folds_to(key, f.name)))
}

/// A key of a mapping, in file order; a merge key holds the keys it brings in, one list per
/// merged mapping.
#[derive(Debug)]
enum Item {
    Key { index: usize, text: String },
    Merge(Vec<Vec<Item>>),
}

#[derive(Default)]
struct Collected {
    /// Every mapping holding settings by its path (the index of the key holding it in each
    /// parent), with its keys.
    instances: HashMap<Vec<usize>, Vec<Item>>,
}

/// Which occurrences of the keys of one mapping count, as yaml.v2 builds its map.
struct Plan {
    /// The key of each occurrence that counts, by occurrence index.
    live: BTreeMap<usize, String>,
    /// Every key written in this mapping itself (not brought in by a merge), in file order.
    written: Vec<String>,
}

impl Plan {
    fn new(items: &[Item]) -> Plan {
        // yaml.v2 applies a mapping's entries in order, a merge key's mappings where it stands,
        // the mappings of a merged sequence from the last to the first; a later entry replaces
        // an earlier one with the same key.
        fn order<'a>(items: &'a [Item], out: &mut Vec<(usize, &'a str)>) {
            for item in items {
                match item {
                    Item::Key { index, text } => out.push((*index, text)),
                    Item::Merge(maps) => {
                        for m in maps.iter().rev() {
                            order(m, out);
                        }
                    }
                }
            }
        }
        let mut effective = Vec::new();
        order(items, &mut effective);
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (index, text) in &effective {
            last.insert(text, *index);
        }
        let live = last
            .into_iter()
            .map(|(text, index)| (index, text.to_string()))
            .collect();
        let written = items
            .iter()
            .filter_map(|i| match i {
                Item::Key { text, .. } => Some(text.clone()),
                Item::Merge(_) => None,
            })
            .collect();
        Plan { live, written }
    }
}

/// A typed value of one occurrence; `None` is YAML null.
type Occurrence = Option<Value>;

enum Pass<'a> {
    Keys(&'a mut Collected),
    Values {
        plans: &'a HashMap<Vec<usize>, Plan>,
        values: &'a mut HashMap<(Vec<usize>, usize), Occurrence>,
    },
}

impl Pass<'_> {
    fn reborrow(&mut self) -> Pass<'_> {
        match self {
            Pass::Keys(c) => Pass::Keys(c),
            Pass::Values { plans, values } => Pass::Values { plans, values },
        }
    }
}

/// Applies the occurrences that count of the mapping at `path`, in the order Go applies them.
fn assemble(
    path: &[usize],
    schema: &'static [Field],
    prefix: &str,
    plans: &HashMap<Vec<usize>, Plan>,
    values: &mut HashMap<(Vec<usize>, usize), Occurrence>,
    decoded: &mut Decoded,
) -> Settings {
    let mut out = Settings::default();
    let Some(plan) = plans.get(path) else {
        return out;
    };
    // Unknown keys (each once, in file order) and settings written more than once.
    let mut by_field: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut seen: HashSet<String> = decoded.unknown.iter().cloned().collect();
    let mut unknown = |text: &str, decoded: &mut Decoded| {
        let name = format!("{prefix}{text}");
        if seen.insert(name.clone()) {
            decoded.unknown.push(name);
        }
    };
    for text in &plan.written {
        match field_for(schema, text) {
            Some(f) => by_field.entry(f.name).or_default().push(text.clone()),
            None => unknown(text, decoded),
        }
    }
    // Keys brought in by a merge key are warned about too when they name nothing.
    for text in plan.live.values() {
        if field_for(schema, text).is_none() {
            unknown(text, decoded);
        }
    }
    // JSON object keys come out of the Go conversion sorted by their bytes.
    let mut live: Vec<(&str, usize)> = plan.live.iter().map(|(i, t)| (t.as_str(), *i)).collect();
    live.sort();
    let mut used: BTreeMap<&'static str, &str> = BTreeMap::new();
    for (text, index) in live {
        let Some(field) = field_for(schema, text) else {
            continue;
        };
        let Some(occurrence) = values.remove(&(path.to_vec(), index)) else {
            continue;
        };
        used.insert(field.name, text);
        match (field.kind, occurrence) {
            // A list set to null is emptied (a nil slice); anything else null stays as it was.
            (Kind::StrList, None) => {
                out.0.insert(field.name, Value::StrList(Vec::new()));
            }
            (_, None) => {}
            (Kind::Map(sub), Some(_)) => {
                let mut child = path.to_vec();
                child.push(index);
                let nested = assemble(
                    &child,
                    sub,
                    &format!("{prefix}{}.", field.name),
                    plans,
                    values,
                    decoded,
                );
                out.merge(Settings(BTreeMap::from([(field.name, Value::Map(nested))])));
            }
            (_, Some(value)) => {
                out.0.insert(field.name, value);
            }
        }
    }
    for (name, written) in by_field {
        if written.len() > 1 {
            if let Some(used) = used.get(name) {
                let spellings: HashSet<&String> = written.iter().collect();
                let merged = spellings.len() > 1
                    && schema
                        .iter()
                        .any(|f| f.name == name && matches!(f.kind, Kind::Map(_)));
                decoded.repeated.push(Repeated {
                    setting: format!("{prefix}{name}"),
                    merged,
                    written,
                    used: used.to_string(),
                });
            }
        }
    }
    out
}

/// The document: a mapping of settings, or empty. Returns whether it was a mapping.
struct RootSeed<'a> {
    schema: &'static [Field],
    pass: Pass<'a>,
}

impl<'de> DeserializeSeed<'de> for RootSeed<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RootSeed<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of settings")
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_none<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, map: A) -> Result<bool, A::Error> {
        let mut counter = 0;
        let items = walk_map(map, self.schema, &[], &mut counter, self.pass.reborrow())?;
        if let Pass::Keys(c) = self.pass {
            c.instances.insert(Vec::new(), items);
        }
        Ok(true)
    }
}

/// Reads the entries of one mapping of settings (or a mapping merged into it).
fn walk_map<'de, A: MapAccess<'de>>(
    mut map: A,
    schema: &'static [Field],
    path: &[usize],
    counter: &mut usize,
    mut pass: Pass<'_>,
) -> Result<Vec<Item>, A::Error> {
    let mut items = Vec::new();
    while let Some(key) = map.next_key_seed(KeySeed)? {
        if key == "<<" {
            let maps = map.next_value_seed(MergeSeed {
                schema,
                path,
                counter,
                pass: pass.reborrow(),
            })?;
            items.push(Item::Merge(maps));
            continue;
        }
        let index = *counter;
        *counter += 1;
        let field = field_for(schema, &key);
        match &mut pass {
            Pass::Keys(collected) => {
                if let Some(Field {
                    kind: Kind::Map(sub),
                    ..
                }) = field
                {
                    let mut child = path.to_vec();
                    child.push(index);
                    map.next_value_seed(NestedKeysSeed {
                        schema: sub,
                        path: child,
                        collected,
                    })?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Pass::Values { plans, values } => {
                let live = plans.get(path).is_some_and(|p| p.live.contains_key(&index));
                match field {
                    Some(field) if live => {
                        let mut child = path.to_vec();
                        child.push(index);
                        let value = map.next_value_seed(ValueSeed {
                            field,
                            path: &child,
                            plans,
                            values,
                        })?;
                        values.insert((path.to_vec(), index), value);
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
        }
        items.push(Item::Key { index, text: key });
    }
    Ok(items)
}

/// A key as written (the text of any scalar).
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
}

/// The value of a merge key: a mapping, or a sequence of mappings.
struct MergeSeed<'a, 'c> {
    schema: &'static [Field],
    path: &'a [usize],
    counter: &'c mut usize,
    pass: Pass<'a>,
}

impl<'de> DeserializeSeed<'de> for MergeSeed<'_, '_> {
    type Value = Vec<Vec<Item>>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MergeSeed<'_, '_> {
    type Value = Vec<Vec<Item>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping or a sequence of mappings to merge")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Ok(vec![walk_map(
            map,
            self.schema,
            self.path,
            self.counter,
            self.pass,
        )?])
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut maps = Vec::new();
        while let Some(items) = seq.next_element_seed(MergedMapSeed {
            schema: self.schema,
            path: self.path,
            counter: self.counter,
            pass: self.pass.reborrow(),
        })? {
            maps.push(items);
        }
        Ok(maps)
    }
}

/// One mapping of a merged sequence.
struct MergedMapSeed<'a, 'c> {
    schema: &'static [Field],
    path: &'a [usize],
    counter: &'c mut usize,
    pass: Pass<'a>,
}

impl<'de> DeserializeSeed<'de> for MergedMapSeed<'_, '_> {
    type Value = Vec<Item>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MergedMapSeed<'_, '_> {
    type Value = Vec<Item>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping to merge")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        walk_map(map, self.schema, self.path, self.counter, self.pass)
    }
}

/// Pass 1 for the value of a nested mapping of settings: its keys, when it is a mapping (its
/// type is checked in pass 2, and only if it counts).
struct NestedKeysSeed<'c> {
    schema: &'static [Field],
    path: Vec<usize>,
    collected: &'c mut Collected,
}

impl<'de> DeserializeSeed<'de> for NestedKeysSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NestedKeysSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let mut counter = 0;
        let items = walk_map(
            map,
            self.schema,
            &self.path,
            &mut counter,
            Pass::Keys(self.collected),
        )?;
        self.collected.instances.insert(self.path, items);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        Ok(())
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged value (`!tag ...`).
        let (IgnoredAny, variant) = data.variant::<IgnoredAny>()?;
        de::VariantAccess::newtype_variant::<IgnoredAny>(variant)?;
        Ok(())
    }
}

/// Pass 2: the typed value of one occurrence that counts.
struct ValueSeed<'a, 'v> {
    field: &'static Field,
    path: &'a [usize],
    plans: &'a HashMap<Vec<usize>, Plan>,
    values: &'v mut HashMap<(Vec<usize>, usize), Occurrence>,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Occurrence;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Occurrence, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_> {
    type Value = Occurrence;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a value for {}", self.field.name)
    }

    fn visit_none<E: de::Error>(self) -> Result<Occurrence, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Occurrence, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Occurrence, D::Error> {
        let value = match self.field.kind {
            Kind::Str => Value::Str(d.deserialize_str(StrVisitor)?),
            // Booleans and integers from the scalar's text, resolved by yaml.v2's rules (which
            // also reads an explicit `!!bool yes` or `!!int "010"` as Go does).
            Kind::Bool => Value::Bool(d.deserialize_str(BoolVisitor)?),
            Kind::Int { max } => Value::Int(d.deserialize_str(IntVisitor { max })?),
            Kind::StrList => Value::StrList(d.deserialize_seq(ListVisitor)?),
            Kind::Map(schema) => {
                d.deserialize_map(NestedValuesVisitor {
                    schema,
                    path: self.path,
                    plans: self.plans,
                    values: self.values,
                })?;
                // The settings themselves are assembled from `values` afterwards.
                Value::Map(Settings::default())
            }
        };
        Ok(Some(value))
    }
}

struct NestedValuesVisitor<'a, 'v> {
    schema: &'static [Field],
    path: &'a [usize],
    plans: &'a HashMap<Vec<usize>, Plan>,
    values: &'v mut HashMap<(Vec<usize>, usize), Occurrence>,
}

impl<'de> Visitor<'de> for NestedValuesVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of settings")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let mut counter = 0;
        walk_map(
            map,
            self.schema,
            self.path,
            &mut counter,
            Pass::Values {
                plans: self.plans,
                values: self.values,
            },
        )?;
        Ok(())
    }
}

/// Text: any scalar, as written.
struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
}

/// The YAML 1.1 boolean words of yaml.v2's resolver.
pub(crate) fn yaml11_bool(s: &str) -> Option<bool> {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            Some(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            Some(false)
        }
        _ => None,
    }
}

struct BoolVisitor;

impl<'de> Visitor<'de> for BoolVisitor {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a boolean (true/false, yes/no, on/off, y/n)")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match (yaml11_bool(v), yaml11_number(v)) {
            (Some(b), _) => Ok(b),
            (None, Some(_)) => Err(E::invalid_type(
                de::Unexpected::Other(&format!("number {v}")),
                &self,
            )),
            (None, None) => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

/// A YAML 1.1 number as yaml.v2 resolves a plain scalar: `_` removed, then an integer in Go's
/// base-prefix syntax (`0x`, `0o`, `0b`, a leading `0` for octal), else a float.
pub(crate) enum Yaml11Number {
    Int(i128),
    Float(f64),
}

pub(crate) fn yaml11_number(s: &str) -> Option<Yaml11Number> {
    let first = s.bytes().next()?;
    if !(first.is_ascii_digit() || first == b'+' || first == b'-' || first == b'.') {
        return None;
    }
    if first == b'.' {
        return match s {
            ".inf" | ".Inf" | ".INF" => Some(Yaml11Number::Float(f64::INFINITY)),
            ".nan" | ".NaN" | ".NAN" => Some(Yaml11Number::Float(f64::NAN)),
            _ => s.parse().ok().map(Yaml11Number::Float),
        };
    }
    let plain: String = s.chars().filter(|&c| c != '_').collect();
    if let Some(i) = go_parse_int(&plain) {
        return Some(Yaml11Number::Int(i));
    }
    if is_yaml_style_float(&plain) {
        return plain.parse().ok().map(Yaml11Number::Float);
    }
    None
}

/// Go's `strconv.ParseInt(s, 0, 64)` (or `ParseUint`): an optional sign, then `0x`, `0o`,
/// `0b` or a leading `0` choosing the base.
fn go_parse_int(s: &str) -> Option<i128> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let lower = rest.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match lower.as_deref() {
        Some("0x") => (16, &rest[2..]),
        Some("0o") => (8, &rest[2..]),
        Some("0b") => (2, &rest[2..]),
        _ if rest.len() > 1 && rest.starts_with('0') => (8, &rest[1..]),
        _ => (10, rest),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let v = u64::from_str_radix(digits, radix).ok()?;
    let v = i128::from(v);
    if negative {
        // ParseInt: down to -2^63.
        (v <= 1 << 63).then_some(-v)
    } else {
        Some(v)
    }
}

/// yaml.v2's float pattern `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

struct IntVisitor {
    max: u64,
}

impl IntVisitor {
    fn check<E: de::Error>(&self, v: i128) -> Result<u64, E> {
        match u64::try_from(v) {
            Ok(u) if u <= self.max => Ok(u),
            _ => Err(E::invalid_value(
                de::Unexpected::Other(&format!("integer {v}")),
                self,
            )),
        }
    }

    /// A float reaches Go's integer field through JSON: it must be whole and below 1e21 (Go
    /// writes larger ones with an exponent, which an integer field refuses).
    fn float<E: de::Error>(&self, v: f64) -> Result<u64, E> {
        if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e21 {
            self.check(v as i128)
        } else {
            Err(E::invalid_value(de::Unexpected::Float(v), self))
        }
    }
}

impl<'de> Visitor<'de> for IntVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number from 0 to {}", self.max)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        self.check(i128::from(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        self.check(i128::from(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<u64, E> {
        match i128::try_from(v) {
            Ok(v) => self.check(v),
            Err(_) => Err(E::invalid_value(
                de::Unexpected::Other(&format!("integer {v}")),
                &self,
            )),
        }
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<u64, E> {
        self.check(v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        self.float(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        match yaml11_number(v) {
            Some(Yaml11Number::Int(i)) => self.check(i),
            Some(Yaml11Number::Float(f)) => self.float(f),
            None => Err(E::invalid_type(de::Unexpected::Str(v), &self)),
        }
    }
}

/// A list of text; a null entry is empty text (Go's zero value).
struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(ListItemSeed)? {
            out.push(item.unwrap_or_default());
        }
        Ok(out)
    }
}

struct ListItemSeed;

impl<'de> DeserializeSeed<'de> for ListItemSeed {
    type Value = Option<String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ListItemSeed {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_str(StrVisitor).map(Some)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn folding_matches_encoding_json() {
        assert!(folds_to("Helper", "helper"));
        assert!(folds_to("HELPER", "helper"));
        assert!(folds_to("\u{17f}ite", "site"));
        assert!(folds_to("Wor\u{212a}ers", "workers"));
        assert!(!folds_to("helper_", "helper"));
        assert!(!folds_to("hélper", "helper"));
        // The dotless i and the dotted capital I fold to nothing ASCII.
        assert!(!folds_to("s\u{131}te", "site"));
        assert!(!folds_to("S\u{130}TE", "site"));
    }

    #[test]
    fn yaml11_numbers_as_yaml_v2() {
        let int = |s: &str| match yaml11_number(s) {
            Some(Yaml11Number::Int(i)) => Some(i),
            _ => None,
        };
        assert_eq!(int("010"), Some(8));
        assert_eq!(int("0x1F"), Some(31));
        assert_eq!(int("0X1f"), Some(31));
        assert_eq!(int("0o17"), Some(15));
        assert_eq!(int("0b101"), Some(5));
        assert_eq!(int("1_000"), Some(1000));
        assert_eq!(int("+12"), Some(12));
        assert_eq!(int("-0x10"), Some(-16));
        assert_eq!(int("08"), None);
        assert!(matches!(yaml11_number("08"), Some(Yaml11Number::Float(f)) if f == 8.0));
        assert!(matches!(yaml11_number("1e3"), Some(Yaml11Number::Float(f)) if f == 1000.0));
        assert!(yaml11_number("1e").is_none());
        assert!(yaml11_number("many").is_none());
        assert!(yaml11_number("0x").is_none());
        assert!(yaml11_number("2001-12-14").is_none());
    }
}
