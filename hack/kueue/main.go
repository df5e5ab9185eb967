// kueue-peer runs Kueue's controller as a test peer for Tessera: Kueue's own core controllers
// (ClusterQueue, LocalQueue, Workload, ResourceFlavor), its scheduler, and its batch/Job
// integration with the Job webhook, from the module proxy at the version pinned in go.mod.
//
// It is a module of its own, beside hack/k8s, because Kueue cannot be built against the
// Kubernetes release hack/k8s pins: its job framework imports API types of its other
// integrations (kubeflow/trainer) that use core/v1 types removed in that release. Built at
// Kueue's own k8s.io versions it talks to the newer API server as any Kueue deployment does.
//
//	kueue-peer --kubeconfig FILE --dir DIR [--exit-with-stdin]
//
// installs Kueue's CRDs (read from the Kueue module in the Go module cache, whose directory
// the build stamps in), serves the Job webhook on 127.0.0.1 with a certificate of its own
// (registered with the API server by URL), and writes DIR/ready once it serves.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/yaml"

	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/config"
	"sigs.k8s.io/kueue/pkg/constants"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/core/indexer"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	_ "sigs.k8s.io/kueue/pkg/controller/jobs/job" // the batch/Job integration only
	"sigs.k8s.io/kueue/pkg/metrics"
	"sigs.k8s.io/kueue/pkg/scheduler"
	preemptexpectations "sigs.k8s.io/kueue/pkg/scheduler/preemption/expectations"
	"sigs.k8s.io/kueue/pkg/util/kubeversion"
)

// crdDir is where Kueue's CRDs are, stamped by hack/kueue/build.
var crdDir = ""

// webhookName is the MutatingWebhookConfiguration this peer registers.
const webhookName = "kueue-peer"

// jobWebhookPath is where Kueue's Job defaulting webhook is served.
const jobWebhookPath = "/mutate-batch-v1-job"

func main() {
	// A flag set of its own: controller-runtime registers --kubeconfig on the global one.
	flags := flag.NewFlagSet("kueue-peer", flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	dir := flags.String("dir", "", "directory for the certificate, configuration and ready file (required)")
	exitWithStdin := flags.Bool("exit-with-stdin", false, "stop when standard input closes (for test harnesses)")
	_ = flags.Parse(os.Args[1:])
	if *kubeconfig == "" || *dir == "" {
		fmt.Fprintln(os.Stderr, "kueue-peer: --kubeconfig and --dir are required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *dir, *exitWithStdin); err != nil {
		fmt.Fprintln(os.Stderr, "kueue-peer:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, dir string, exitWithStdin bool) error {
	ctrl.SetLogger(zap.New())
	ctx := ctrl.SetupSignalHandler()
	if exitWithStdin {
		ctx = untilStdinCloses(ctx)
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "ready"))
	if err := installCRDs(ctx, restConfig); err != nil {
		return fmt.Errorf("installing Kueue's CRDs: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	certDir := filepath.Join(dir, "certs")
	caPEM, err := writeServingCert(certDir)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(configuration(port, certDir)), 0o644); err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(kueue.AddToScheme(scheme))
	utilruntime.Must(configapi.AddToScheme(scheme))
	options, cfg, err := config.Load(scheme, cfgFile)
	if err != nil {
		return fmt.Errorf("Kueue's configuration: %w", err)
	}
	config.AddWebhookSettingsTo(&options, &cfg)
	metrics.Register()

	mgr, err := ctrl.NewManager(restConfig, options)
	if err != nil {
		return err
	}
	cache := schdcache.New(mgr.GetClient())
	requeuer := qcache.NewRequeuer()
	if err := mgr.Add(requeuer); err != nil {
		return err
	}
	expectations := preemptexpectations.New()
	queues := qcache.NewManager(mgr.GetClient(), cache, requeuer, qcache.WithPreemptionExpectations(expectations))
	if err := indexer.Setup(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := jobframework.SetupIndexes(ctx, mgr.GetFieldIndexer(), jobframework.WithEnabledFrameworks(cfg.Integrations.Frameworks)); err != nil {
		return err
	}
	discoveryClient, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		return err
	}
	serverVersion := kubeversion.NewServerVersionFetcher(discoveryClient)
	if err := mgr.Add(serverVersion); err != nil {
		return err
	}
	if err := serverVersion.FetchServerVersion(); err != nil {
		return err
	}
	if failed, err := core.SetupControllers(mgr, queues, cache, &cfg, nil, expectations, nil); err != nil {
		return fmt.Errorf("Kueue controller %s: %w", failed, err)
	}
	namespaces, err := metav1.LabelSelectorAsSelector(cfg.ManagedJobsNamespaceSelector)
	if err != nil {
		return err
	}
	if err := jobframework.SetupControllers(ctx, mgr, ctrl.Log,
		jobframework.WithManageJobsWithoutQueueName(cfg.ManageJobsWithoutQueueName),
		jobframework.WithKubeServerVersion(serverVersion),
		jobframework.WithEnabledFrameworks(cfg.Integrations.Frameworks),
		jobframework.WithManagerName(constants.KueueName),
		jobframework.WithCache(cache),
		jobframework.WithQueues(queues),
		jobframework.WithManagedJobsNamespaceSelector(namespaces),
	); err != nil {
		return err
	}
	go queues.CleanUpOnContext(ctx)
	go cache.CleanUpOnContext(ctx)
	sched := scheduler.New(queues, cache, mgr.GetClient(), mgr.GetEventRecorderFor(constants.AdmissionName),
		scheduler.WithPreemptionExpectations(expectations))
	if err := mgr.Add(sched); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return announceReady(ctx, mgr, restConfig, port, caPEM, dir)
	})); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// configuration is Kueue's own configuration file for this peer: the batch/Job integration,
// the webhook on 127.0.0.1:port with the peer's certificate, no leader election, no metrics
// or probe listeners (several peers run on one machine).
func configuration(port int, certDir string) string {
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
manageJobsWithoutQueueName: false
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: "0"
integrations:
  frameworks: ["batch/job"]
`, port, certDir)
}

// installCRDs creates (or replaces) every CRD of Kueue's and waits until each is Established.
func installCRDs(ctx context.Context, restConfig *rest.Config) error {
	if crdDir == "" {
		return fmt.Errorf("this binary was built without Kueue's CRD directory; build it with hack/kueue/build")
	}
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s (the Go module cache of the build; run `go mod download` in hack/kueue): %v", crdDir, err)
	}
	client, err := apiextensionsclient.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if crd.Name == "" {
			continue
		}
		names = append(names, crd.Name)
		_, err = crds.Create(ctx, &crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			old, getErr := crds.Get(ctx, crd.Name, metav1.GetOptions{})
			if getErr != nil {
				return getErr
			}
			crd.ResourceVersion = old.ResourceVersion
			_, err = crds.Update(ctx, &crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range names {
		for {
			crd, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(crd) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not Established within 60 s", name)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// announceReady waits until the webhook serves and the caches are synced, registers the Job
// webhook with the API server, and writes DIR/ready.
func announceReady(ctx context.Context, mgr ctrl.Manager, restConfig *rest.Config, port int, caPEM []byte, dir string) error {
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return fmt.Errorf("Kueue's caches did not sync")
	}
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = conn.Close()
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d%s", port, jobWebhookPath)
	fail := admissionv1.Fail
	none := admissionv1.SideEffectClassNone
	webhook := &admissionv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookName},
		Webhooks: []admissionv1.MutatingWebhook{{
			Name:                    "mjob.kb.io",
			ClientConfig:            admissionv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create}, Rule: admissionv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	hooks := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := hooks.Create(ctx, webhook, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		old, getErr := hooks.Get(ctx, webhookName, metav1.GetOptions{})
		if getErr != nil {
			return getErr
		}
		webhook.ResourceVersion = old.ResourceVersion
		if _, err := hooks.Update(ctx, webhook, metav1.UpdateOptions{}); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("registering the Job webhook: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte(url+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Println("kueue-peer: ready; Job webhook at", url)
	<-ctx.Done()
	return nil
}

// writeServingCert writes a self-signed certificate for 127.0.0.1 (tls.crt, tls.key) and
// returns it as PEM, the webhook's CA bundle.
func writeServingCert(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kueue-peer"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600); err != nil {
		return nil, err
	}
	return certPEM, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// untilStdinCloses ends the context when standard input reaches EOF: a harness that dies
// without cleaning up closes the pipe, and the peer goes with it.
func untilStdinCloses(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		buf := make([]byte, 256)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				cancel()
				return
			}
		}
	}()
	return ctx
}
