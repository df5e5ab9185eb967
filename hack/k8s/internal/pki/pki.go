// Package pki makes the certificates and keys a test cluster needs: one CA that signs the API
// server's serving certificate and every client certificate (admin, nodes, control-plane
// components), and the ServiceAccount token signing key.
//
// Everything is written under one directory so that a node process started later can mint its
// own system:node credentials from the same CA, as a kubelet's TLS bootstrap would give it.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Authority is the cluster CA, loaded from or written to a directory.
type Authority struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	Dir     string
}

// Paths of the files under a PKI directory.
const (
	CACert       = "ca.crt"
	CAKey        = "ca.key"
	ServingCert  = "apiserver.crt"
	ServingKey   = "apiserver.key"
	SAKey        = "sa.key"
	SAPub        = "sa.pub"
	validity     = 10 * 365 * 24 * time.Hour
	clockSkewFix = time.Hour
)

// LoadOrCreate returns the CA in dir, creating it (and the service-account key pair) when absent.
func LoadOrCreate(dir string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, CACert), filepath.Join(dir, CAKey)
	if _, err := os.Stat(certPath); err == nil {
		return Load(dir)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kube-peer-ca"},
		NotBefore:             now.Add(-clockSkewFix),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	if err := writeCert(certPath, der); err != nil {
		return nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, err
	}
	// The ServiceAccount issuer signs with RSA (RS256), the algorithm every client verifies.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, SAKey), saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, SAPub), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return nil, err
	}
	return Load(dir)
}

// Load reads the CA written by LoadOrCreate.
func Load(dir string) (*Authority, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACert))
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA (is %s a cluster directory?): %w", dir, err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM certificate", CACert)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKey))
	if err != nil {
		return nil, err
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%s: no PEM key", CAKey)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", CAKey)
	}
	return &Authority{Cert: cert, Key: signer, CertPEM: certPEM, Dir: dir}, nil
}

// Pair is a PEM certificate and its PEM key.
type Pair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// ClientCert signs a client certificate for user cn in groups orgs (the API server reads the
// user from CN and the groups from O).
func (a *Authority) ClientCert(cn string, orgs ...string) (*Pair, error) {
	return a.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// ServingCert signs a server certificate for the given DNS names and IPs.
func (a *Authority) ServingCert(cn string, dns []string, ips []net.IP) (*Pair, error) {
	return a.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    dns,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

func (a *Authority) sign(tmpl *x509.Certificate) (*Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-clockSkewFix)
	tmpl.NotAfter = now.Add(validity)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.Key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// Write stores the pair as certPath and keyPath (mode 0600).
func (p *Pair) Write(certPath, keyPath string) error {
	if err := os.WriteFile(certPath, p.CertPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyPath, p.KeyPEM, 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		// crypto/rand never fails on Linux; a constant serial would still give a valid certificate.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}
