//! The snapshot's optional sections (`memory`, `speculative`, `lora`, `disaggregation`, `queues`),
//! declared once in a table.
//!
//! Each section is a msgspec `array_like` struct: on the wire an array with every field, in order.
//! Four places need each field: the encoder, the tolerant decoder, the `/v1/loads` renderers (JSON
//! and Prometheus) and the dict parser used by tests and tools. They used to be written out per
//! section in `codec.rs` and `loads.rs`; the [`sections!`] table below generates all four, so adding
//! a field (or a section) touches one line here. What differs between sections is data: the wire
//! key, the short name `/v1/loads` uses (`spec`, `disagg`), and how many leading fields an older
//! engine always sends (`min`); fields past what a message carries read as their default.

use crate::error::DecodeError;
use crate::msgpack::{KeyBlock, Reader, Token, Writer, key_block};
use serde_json::Value;

/// One section field's value, for renderers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue<'a> {
    Int(i64),
    Float(f64),
    Str(&'a str),
}

impl FieldValue<'_> {
    /// The value as a gauge; strings are not gauges.
    pub fn as_f64(self) -> Option<f64> {
        match self {
            FieldValue::Int(v) => Some(v as f64),
            FieldValue::Float(v) => Some(v),
            FieldValue::Str(_) => None,
        }
    }

    pub fn to_json(self) -> Value {
        match self {
            FieldValue::Int(v) => v.into(),
            FieldValue::Float(v) => v.into(),
            FieldValue::Str(v) => v.into(),
        }
    }
}

/// A type a section field can have, with its four conversions.
pub(crate) trait SectionField: Default {
    fn write(&self, w: &mut Writer<'_>);
    /// Reads into `self`, reusing its allocation where it has one.
    fn read_into(&mut self, field: &'static str, r: &mut Reader<'_>) -> Result<(), DecodeError>;
    fn value(&self) -> FieldValue<'_>;
    fn from_json(field: &str, v: &Value) -> Result<Self, String>;
}

impl SectionField for i64 {
    fn write(&self, w: &mut Writer<'_>) {
        w.int(*self);
    }
    fn read_into(&mut self, field: &'static str, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        *self = crate::codec::int(field, r.next()?)?;
        Ok(())
    }
    fn value(&self) -> FieldValue<'_> {
        FieldValue::Int(*self)
    }
    fn from_json(field: &str, v: &Value) -> Result<Self, String> {
        v.as_i64()
            .ok_or_else(|| format!("{field}: expected an integer, got {v}"))
    }
}

impl SectionField for f64 {
    fn write(&self, w: &mut Writer<'_>) {
        w.float(*self);
    }
    fn read_into(&mut self, field: &'static str, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        *self = crate::codec::float(field, r.next()?)?;
        Ok(())
    }
    fn value(&self) -> FieldValue<'_> {
        FieldValue::Float(*self)
    }
    fn from_json(field: &str, v: &Value) -> Result<Self, String> {
        v.as_f64()
            .ok_or_else(|| format!("{field}: expected a number, got {v}"))
    }
}

impl SectionField for String {
    fn write(&self, w: &mut Writer<'_>) {
        w.str(self);
    }
    fn read_into(&mut self, field: &'static str, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        match r.next()? {
            Token::Str(s) => {
                self.clear();
                self.push_str(&String::from_utf8_lossy(s));
                Ok(())
            }
            other => Err(DecodeError::WrongType {
                field,
                expected: "str",
                got: other.kind(),
            }),
        }
    }
    fn value(&self) -> FieldValue<'_> {
        FieldValue::Str(self)
    }
    fn from_json(field: &str, v: &Value) -> Result<Self, String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{field}: expected a string, got {v}"))
    }
}

/// What every section provides to the codec and the renderers.
pub(crate) trait Section: Sized + Default {
    /// The snapshot map key (msgspec field name).
    const KEY: &'static str;
    /// The key, msgpack-encoded at compile time.
    const KEY_BLOCK: KeyBlock;
    /// The name `/v1/loads` uses in `include=` and in Prometheus names.
    const SHORT: &'static str;
    /// Fields every engine that sends the section sends (older engines send fewer than all).
    const MIN: usize;
    const LEN: usize;

    fn encode(&self, w: &mut Writer<'_>);
    /// Reads the `n` elements of an array already opened, reusing `self`'s allocations.
    fn decode_into(&mut self, r: &mut Reader<'_>, n: usize) -> Result<(), DecodeError>;
    /// `(field name, value)` in wire order.
    fn fields(&self) -> Vec<(&'static str, FieldValue<'_>)>;
    /// From a JSON object with every field (the `to_dict` form).
    fn from_json(v: &Value) -> Result<Self, String>;
}

macro_rules! sections {
    ($(
        $(#[$doc:meta])*
        $ty:ident = $key:literal as $short:literal, min $min:literal {
            $($field:ident : $fty:ty),* $(,)?
        }
    )*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct $ty {
            $(pub $field: $fty,)*
        }

        impl Section for $ty {
            const KEY: &'static str = $key;
            const KEY_BLOCK: KeyBlock = key_block($key);
            const SHORT: &'static str = $short;
            const MIN: usize = $min;
            const LEN: usize = [$(stringify!($field)),*].len();

            fn encode(&self, w: &mut Writer<'_>) {
                w.array_header(Self::LEN);
                $(SectionField::write(&self.$field, w);)*
            }

            fn decode_into(&mut self, r: &mut Reader<'_>, n: usize) -> Result<(), DecodeError> {
                let mut i = 0;
                $(
                    if i < n {
                        self.$field.read_into(concat!($key, ".", stringify!($field)), r)?;
                    } else {
                        self.$field = Default::default();
                    }
                    i += 1;
                )*
                for _ in i..n {
                    r.skip()?; // a newer engine appended fields
                }
                Ok(())
            }

            fn fields(&self) -> Vec<(&'static str, FieldValue<'_>)> {
                vec![$((stringify!($field), self.$field.value())),*]
            }

            fn from_json(v: &Value) -> Result<Self, String> {
                let o = v.as_object().ok_or(concat!($key, ": expected an object"))?;
                Ok($ty {$(
                    $field: {
                        let name = concat!($key, ".", stringify!($field));
                        let v = o.get(stringify!($field)).ok_or_else(|| format!("{name}: missing"))?;
                        SectionField::from_json(name, v)?
                    },
                )*})
            }
        }
    )*};
}

sections! {
    /// `memory` section: `[weight_gb, kv_cache_gb, graph_gb, token_capacity]`.
    MemoryMetrics = "memory" as "memory", min 4 {
        weight_gb: f64,
        kv_cache_gb: f64,
        graph_gb: f64,
        token_capacity: i64,
    }

    /// `speculative` section: `[accept_length, accept_rate]`.
    SpeculativeMetrics = "speculative" as "spec", min 2 {
        accept_length: f64,
        accept_rate: f64,
    }

    /// `lora` section: `[slots_used, slots_total, utilization]`.
    LoraMetrics = "lora" as "lora", min 3 {
        slots_used: i64,
        slots_total: i64,
        utilization: f64,
    }

    /// `disaggregation` section; `mode` is "null", "prefill" or "decode". Older engines may send
    /// only the mode.
    DisaggregationMetrics = "disaggregation" as "disagg", min 1 {
        mode: String,
        prefill_bootstrap_queue_reqs: i64,
        prefill_inflight_queue_reqs: i64,
        decode_prealloc_queue_reqs: i64,
        decode_transfer_queue_reqs: i64,
        decode_retracted_queue_reqs: i64,
        kv_transfer_speed_gb_s: f64,
        kv_transfer_latency_ms: f64,
    }

    /// `queues` section: `[waiting, grammar, paused, retracted, prealloc_ready]` (older engines
    /// send the first four).
    QueueMetrics = "queues" as "queues", min 4 {
        waiting: i64,
        grammar: i64,
        paused: i64,
        retracted: i64,
        prealloc_ready: i64,
    }
}

/// Calls `$body` once per section of a snapshot, in wire order, with `$field` bound to the
/// snapshot's field name and `$ty` to its type. The one list of which sections a snapshot has.
macro_rules! for_each_section {
    ($mac:ident) => {
        $mac!(memory: $crate::sections::MemoryMetrics);
        $mac!(speculative: $crate::sections::SpeculativeMetrics);
        $mac!(lora: $crate::sections::LoraMetrics);
        $mac!(disaggregation: $crate::sections::DisaggregationMetrics);
        $mac!(queues: $crate::sections::QueueMetrics);
    };
}
pub(crate) use for_each_section;
