//! Test certificates for the admission webhook: a CA and a serving certificate for
//! 127.0.0.1 it signed.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// Writes a new pair to `dir/tls.crt` and `dir/tls.key` (each replacing the old file at once,
/// as a kubelet updates a Secret volume) and returns the CA's PEM.
pub(crate) fn write_pair(dir: &Path) -> String {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    for (name, text) in [("tls.crt", leaf.pem()), ("tls.key", key.serialize_pem())] {
        let tmp = dir.join(format!(".{name}.new"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
    ca.pem()
}
