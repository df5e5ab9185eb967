//! Kubelet device-plugin library.
