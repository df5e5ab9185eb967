//! Tessera's deployment checks. The chart is rendered and linted by the real helm
//! ([`chart`], through hack/k8s's `kube-peer helm`); [`manifests`] generates the plain
//! manifests from `helm template`; [`lint`] holds the chart promises helm does not check
//! (every value documented, every value a template reads defined); [`kinds`] and [`schema`]
//! check YAML documents against their Kubernetes types and the CRDs' schemas without a
//! cluster. The tests install the chart into a real cluster and run the coordinator and the
//! agent under the chart's RBAC. Development tooling: never shipped in an image.

pub mod chart;
pub mod kinds;
pub mod lint;
pub mod manifests;
pub mod schema;
