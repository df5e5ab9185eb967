//! Tessera's deployment checks, for machines without Helm: a renderer for the Go-template
//! subset the chart is written in ([`template`]), the chart loader ([`chart`]), generation of
//! the plain manifests ([`manifests`]), lints of the chart's values ([`lint`]), typed and
//! schema checks of every YAML document ([`kinds`], [`schema`]) and the RBAC rule matcher
//! ([`rbac`]). Development tooling: never shipped in an image.

pub mod chart;
pub mod kinds;
pub mod lint;
pub mod manifests;
pub mod rbac;
pub mod schema;
pub mod template;
