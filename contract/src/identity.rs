//! Who and where, as types: a pod by its UID ([`PodUid`]) and a node by its name
//! ([`NodeName`]), so that a pod's identity is never a name that a pod created again under it
//! would share, and never a string re-parsed by whoever receives it.
//!
//! Each is a small newtype over the text the API server wrote: serialised as that text (the
//! wire and checkpoint forms are plain strings), built only through [`PodUid::new`] /
//! [`NodeName::new`] (or `parse`, or deserialisation), which refuse an empty or oversized
//! value with an error naming the accepted form. Further identities (a scheduling unit, a
//! pod group) belong here beside them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The most bytes of a pod UID accepted: the API server's UIDs are 36-character UUIDs; the
/// bound keeps a forged one from costing more than a name.
pub const MAX_UID_LEN: usize = 128;

/// The most bytes of a node name: a Node's name is a DNS subdomain (RFC 1123), at most 253
/// characters.
pub const MAX_NODE_NAME_LEN: usize = 253;

/// An identity that cannot be built from the text given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The text is empty.
    #[error("empty; expected {expected}")]
    Empty {
        /// What was expected, in words.
        expected: &'static str,
    },
    /// The text is longer than the identity allows.
    #[error("{len} bytes; expected {expected} of at most {max} bytes")]
    TooLong {
        /// The length given.
        len: usize,
        /// The most allowed.
        max: usize,
        /// What was expected, in words.
        expected: &'static str,
    },
}

/// Checks `text` for an identity of at most `max` bytes described as `expected`.
fn checked(text: String, max: usize, expected: &'static str) -> Result<String, IdentityError> {
    if text.is_empty() {
        return Err(IdentityError::Empty { expected });
    }
    if text.len() > max {
        return Err(IdentityError::TooLong {
            len: text.len(),
            max,
            expected,
        });
    }
    Ok(text)
}

/// A pod by `metadata.uid`: how both sides tell pods apart. A pod deleted and created again
/// under the same name is another pod with another UID and inherits nothing; its namespace
/// and name are for display (and for the kubelet's pod-resources API, which names pods).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PodUid(String);

/// A node by `metadata.name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeName(String);

/// Construction (refusing an empty text or one over `$max` bytes, described as `$expected`),
/// display, parsing, the string conversions serde goes through, and `str` comparison, the
/// same for every identity.
macro_rules! text_identity {
    ($t:ident, $max:ident, $expected:literal) => {
        impl $t {
            #[doc = concat!("The identity `text`; refused when empty or longer than [`", stringify!($max), "`] bytes.")]
            pub fn new(text: impl Into<String>) -> Result<Self, IdentityError> {
                checked(text.into(), $max, $expected).map(Self)
            }

            /// The text as the API server wrote it.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $t {
            type Err = IdentityError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $t {
            type Error = IdentityError;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl From<$t> for String {
            fn from(id: $t) -> String {
                id.0
            }
        }

        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
    };
}

text_identity!(PodUid, MAX_UID_LEN, "the pod's metadata.uid");
text_identity!(NodeName, MAX_NODE_NAME_LEN, "a Node's metadata.name");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_oversized_identities_are_refused_naming_the_form() {
        let empty = PodUid::new("").unwrap_err();
        assert_eq!(empty.to_string(), "empty; expected the pod's metadata.uid");
        let long = PodUid::new("x".repeat(MAX_UID_LEN + 1)).unwrap_err();
        assert_eq!(
            long.to_string(),
            "129 bytes; expected the pod's metadata.uid of at most 128 bytes"
        );
        assert!(PodUid::new("x".repeat(MAX_UID_LEN)).is_ok());
        assert!("".parse::<NodeName>().is_err());
        assert!(NodeName::new("n".repeat(MAX_NODE_NAME_LEN + 1)).is_err());
        assert_eq!("gpu-1".parse::<NodeName>().unwrap().as_str(), "gpu-1");
    }

    #[test]
    fn the_wire_form_is_the_plain_text_and_an_empty_one_is_refused() {
        let uid = PodUid::new("6a1f0c2e").unwrap();
        assert_eq!(serde_json::to_string(&uid).unwrap(), "\"6a1f0c2e\"");
        assert_eq!(serde_json::from_str::<PodUid>("\"6a1f0c2e\"").unwrap(), uid);
        let err = serde_json::from_str::<PodUid>("\"\"").unwrap_err();
        assert!(err.to_string().contains("metadata.uid"), "{err}");
        assert_eq!(uid.to_string(), "6a1f0c2e");
        assert_eq!(&uid, "6a1f0c2e");
    }
}
