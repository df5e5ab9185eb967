//! Finds devices for claims on one node.
