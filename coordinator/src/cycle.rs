//! One scheduling cycle: snapshot in, decisions out.
