package cluster

import (
	"fmt"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Credentials are what a kubeconfig user entry carries: a client certificate or a bearer token.
type Credentials struct {
	CertPEM, KeyPEM []byte
	Token           string
}

// WriteKubeconfig writes a one-context kubeconfig for server, trusting caPEM.
func WriteKubeconfig(path, server string, caPEM []byte, user string, creds Credentials) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kube-peer"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: creds.CertPEM,
		ClientKeyData:         creds.KeyPEM,
		Token:                 creds.Token,
	}
	cfg.Contexts["kube-peer"] = &clientcmdapi.Context{Cluster: "kube-peer", AuthInfo: user}
	cfg.CurrentContext = "kube-peer"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// Written whole, then renamed, so a reader polling for the file never sees half of it.
	return os.Rename(tmp, path)
}
