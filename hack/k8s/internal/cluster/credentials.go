package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/hack/k8s/internal/pki"
)

// AdminClient returns a cluster-admin client for the running cluster in dir.
func AdminClient(dir string) (*kubernetes.Clientset, *State, error) {
	st, err := ReadState(dir)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", st.AdminKubeconfig)
	if err != nil {
		return nil, nil, err
	}
	c, err := kubernetes.NewForConfig(cfg)
	return c, st, err
}

// ServiceAccountToken mints a bound token for namespace/name through the TokenRequest API,
// creating the namespace and the ServiceAccount first when they are missing.
func ServiceAccountToken(ctx context.Context, dir, namespace, name string, audiences []string, ttl time.Duration) (string, error) {
	c, _, err := AdminClient(dir)
	if err != nil {
		return "", err
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating serviceaccount %s/%s: %w", namespace, name, err)
	}
	secs := int64(ttl.Seconds())
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &secs}}
	out, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	return out.Status.Token, nil
}

// ServiceAccountKubeconfig writes a kubeconfig that acts as namespace/name.
func ServiceAccountKubeconfig(ctx context.Context, dir, namespace, name, out string, ttl time.Duration) error {
	token, err := ServiceAccountToken(ctx, dir, namespace, name, nil, ttl)
	if err != nil {
		return err
	}
	st, err := ReadState(dir)
	if err != nil {
		return err
	}
	ca, err := pki.Load(pkiDir(dir))
	if err != nil {
		return err
	}
	return WriteKubeconfig(out, st.Server, ca.CertPEM, "system:serviceaccount:"+namespace+":"+name, Credentials{Token: token})
}

// NodeKubeconfig writes (and returns the path of) a kubeconfig for system:node:NAME in group
// system:nodes, the identity the Node authorizer and NodeRestriction admission judge a kubelet by.
func NodeKubeconfig(clusterDir, node, out string) (string, error) {
	st, err := ReadState(clusterDir)
	if err != nil {
		return "", err
	}
	ca, err := pki.Load(pkiDir(clusterDir))
	if err != nil {
		return "", err
	}
	pair, err := ca.ClientCert("system:node:"+node, "system:nodes")
	if err != nil {
		return "", err
	}
	if out == "" {
		out = filepath.Join(clusterDir, "node-"+node+".kubeconfig")
	}
	return out, WriteKubeconfig(out, st.Server, ca.CertPEM, "system:node:"+node, Credentials{CertPEM: pair.CertPEM, KeyPEM: pair.KeyPEM})
}
