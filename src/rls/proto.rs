//! proto: the messages of Envoy's rate-limit service, the fields quotagate reads or writes.
//!
//! Written by hand with prost's derive (no `protoc` in the build), field numbers and types from
//! envoyproxy/data-plane-api `84e8436` (2026-01): `envoy/service/ratelimit/v3/rls.proto`,
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`, `envoy/config/core/v3/base.proto`.
//! Fields left out are skipped on decoding, as protobuf does with any unknown field.
//!
//! Strings a caller sends are decoded as bytes: prost would refuse invalid UTF-8 with a decode
//! error that tonic turns into INTERNAL, where the service owes INVALID_ARGUMENT naming the
//! descriptor at fault (`service::check_request`). Same wire type, so still wire-compatible.

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Units each descriptor adds, unless it says otherwise; 0 counts as 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `google.protobuf.UInt64Value`: set (even to 0: check without counting) overrides the
    /// request's `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`: the same numbers as [`Unit`] (it has no WEEK).
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// For the filters after Envoy's rate-limit filter (`rls.response_dynamic_metadata`).
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<Struct>,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: std::collections::BTreeMap<String, Value>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// `google.protobuf.NullValue` (its one value is 0).
    #[prost(int32, tag = "1")]
    Null(i32),
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    String(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
    #[prost(message, tag = "5")]
    Struct(Struct),
    #[prost(message, tag = "6")]
    List(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    pub fn of(kind: Kind) -> Value {
        Value { kind: Some(kind) }
    }

    /// A JSON value (a rule's `metadata`, as read from YAML) as a protobuf one.
    pub fn from_json(v: &serde_json::Value) -> Value {
        Value::of(match v {
            serde_json::Value::Null => Kind::Null(0),
            serde_json::Value::Bool(b) => Kind::Bool(*b),
            serde_json::Value::Number(n) => Kind::Number(n.as_f64().unwrap_or(0.0)),
            serde_json::Value::String(s) => Kind::String(s.clone()),
            serde_json::Value::Array(a) => Kind::List(ListValue {
                values: a.iter().map(Value::from_json).collect(),
            }),
            serde_json::Value::Object(o) => Kind::Struct(Struct::from_json(o)),
        })
    }
}

impl Struct {
    pub fn from_json(o: &serde_json::Map<String, serde_json::Value>) -> Struct {
        Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), Value::from_json(v)))
                .collect(),
        }
    }
}

/// `RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    Unknown = 0,
    Ok = 1,
    OverLimit = 2,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `RateLimitResponse.RateLimit.Unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    Unknown = 0,
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes as protoc encodes them (`protoc --encode`), so a field number typed wrong here fails.
    #[test]
    fn a_request_decodes_from_its_wire_bytes() {
        // domain "d"; descriptors { entries { key "k" value "v" } limit { requests_per_unit 5
        // unit MINUTE } hits_addend { value 0 } }; hits_addend 3
        let wire = [
            0x0a, 0x01, b'd', // domain
            0x12, 0x10, // descriptors, 16 bytes
            0x0a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v', // entries
            0x12, 0x04, 0x08, 0x05, 0x10, 0x02, // limit
            0x1a, 0x00, // hits_addend {}: set, value 0
            0x18, 0x03, // hits_addend 3
        ];
        let r = RateLimitRequest::decode(&wire[..]).unwrap();
        assert_eq!(r.domain, b"d");
        assert_eq!(r.hits_addend, 3);
        let d = &r.descriptors[0];
        assert_eq!(
            (d.entries[0].key.as_slice(), d.entries[0].value.as_slice()),
            (&b"k"[..], &b"v"[..])
        );
        assert_eq!(
            d.limit,
            Some(RateLimitOverride {
                requests_per_unit: 5,
                unit: Unit::Minute as i32
            })
        );
        assert_eq!(d.hits_addend, Some(UInt64Value { value: 0 }));
    }

    #[test]
    fn a_response_encodes_to_its_wire_bytes() {
        let r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit {
                    requests_per_unit: 10,
                    unit: Unit::Week as i32,
                    name: "n".into(),
                }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration {
                    seconds: 7,
                    nanos: 0,
                }),
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "a".into(),
                value: "b".into(),
            }],
            dynamic_metadata: Some(Struct {
                fields: [("k".to_owned(), Value::of(Kind::String("v".into())))].into(),
            }),
        };
        let wire = [
            0x08, 0x02, // overall_code OVER_LIMIT
            0x12, 0x0f, // statuses, 15 bytes
            0x08, 0x02, // code
            0x12, 0x07, 0x08, 0x0a, 0x10, 0x07, 0x1a, 0x01, b'n', // current_limit, name last
            0x22, 0x02, 0x08, 0x07, // duration_until_reset { seconds 7 }
            0x1a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b', // response_headers_to_add
            0x32, 0x0a, // dynamic_metadata, 10 bytes: fields {
            0x0a, 0x08, 0x0a, 0x01, b'k', // an entry, its key
            0x12, 0x03, 0x1a, 0x01, b'v', // its value { string_value }
        ];
        assert_eq!(r.encode_to_vec(), wire);
    }
}
