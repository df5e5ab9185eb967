// Package cluster runs a real Kubernetes control plane on 127.0.0.1 for tests: an embedded etcd
// and the real kube-apiserver in this process, and, when asked, the real kube-scheduler and
// kube-controller-manager as child processes of this same binary (each component keeps its own
// global flags, metrics and signal handling, as it does in a real cluster).
package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"

	"github.com/tessera-gpu/tessera/hack/k8s/internal/pki"
)

// Options say what `cluster up` starts.
type Options struct {
	Dir         string
	Port        int
	Scheduler   bool
	Controllers string
	// Durable keeps etcd's fsync; tests leave it off because they never survive a power cut.
	Durable bool
	// ExitWithStdin stops the cluster when standard input closes, so a test process that dies
	// without cleaning up takes its cluster with it.
	ExitWithStdin bool
	APIServerArgs []string
	// Audit writes the API server's own audit log (JSON lines, Metadata level, one line per
	// completed request) to DIR/audit.log, for tests that check what a component really asked.
	Audit bool
}

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
`

// GPUUserControllers are the kube-controller-manager controllers a GPU user's workloads rely on.
const GPUUserControllers = "job-controller,replicaset-controller,deployment-controller,garbage-collector-controller," +
	"namespace-controller,serviceaccount-controller,serviceaccount-token-controller,pod-garbage-collector-controller," +
	"disruption-controller,root-ca-certificate-publisher-controller"

// WorkloadFeatureGates turns on the Workload API in every component this package starts, as a
// cluster that uses it runs them all with the same gates.
const WorkloadFeatureGates = "GenericWorkload=true"

// WorkloadRuntimeConfig serves the Workload API's group version, which is not served by default.
const WorkloadRuntimeConfig = "scheduling.k8s.io/v1beta1=true"

// State is written to DIR/cluster.json once the API server is ready; test harnesses read it.
type State struct {
	Server          string `json:"server"`
	AdminKubeconfig string `json:"adminKubeconfig"`
	CAFile          string `json:"caFile"`
	PID             int    `json:"pid"`
	Etcd            string `json:"etcd"`
}

// StateFile is the name of the readiness file under the cluster directory.
const StateFile = "cluster.json"

// Layout names the files under a cluster directory.
func pkiDir(dir string) string { return filepath.Join(dir, "pki") }

// AdminKubeconfig is the path of the cluster-admin kubeconfig under dir.
func AdminKubeconfig(dir string) string { return filepath.Join(dir, "admin.kubeconfig") }

// Up starts the control plane and blocks until ctx is done, then stops it cleanly.
func Up(ctx context.Context, o Options) error {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, StateFile))
	ca, err := pki.LoadOrCreate(pkiDir(dir))
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	serving, err := ca.ServingCert("kube-apiserver",
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")})
	if err != nil {
		return err
	}
	p := pkiDir(dir)
	if err := serving.Write(filepath.Join(p, pki.ServingCert), filepath.Join(p, pki.ServingKey)); err != nil {
		return err
	}

	etcd, etcdURL, err := startEtcd(dir, o.Durable)
	if err != nil {
		return err
	}
	defer etcd.Close()

	port := o.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return err
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=127.0.0.1",
		// A loopback address is not a valid endpoint for the kubernetes Service.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + filepath.Join(p, pki.ServingCert),
		"--tls-private-key-file=" + filepath.Join(p, pki.ServingKey),
		"--client-ca-file=" + filepath.Join(p, pki.CACert),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(p, pki.SAKey),
		"--service-account-signing-key-file=" + filepath.Join(p, pki.SAKey),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--cert-dir=" + p,
		"--profiling=false",
		// The Workload API (scheduling.k8s.io/v1beta1 Workload and PodGroup, the pod's
		// spec.schedulingGroup) is beta and off by default in this release; tests of Tessera's
		// gangs from it need the gate and the API group. Harmless for every other test: a pod
		// without spec.schedulingGroup is scheduled as before.
		"--feature-gates=" + WorkloadFeatureGates,
		"--runtime-config=" + WorkloadRuntimeConfig,
	}
	if !strings.Contains(o.Controllers, "node-lifecycle") {
		// The admission plugin taints every new Node not-ready and only the node-lifecycle
		// controller lifts the taint; without that controller no node would ever take a pod.
		args = append(args, "--disable-admission-plugins=TaintNodesByCondition")
	}
	if o.Audit {
		policy := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
			return err
		}
		args = append(args,
			"--audit-policy-file="+policy,
			"--audit-log-path="+filepath.Join(dir, "audit.log"),
			"--audit-log-format=json",
			"--audit-log-mode=blocking",
			"--audit-log-maxbackup=0")
	}
	args = append(args, o.APIServerArgs...)

	apiCtx, stopAPI := context.WithCancel(context.Background())
	defer stopAPI()
	apiDone := make(chan error, 1)
	cmd := apiserver.NewAPIServerCommand()
	cmd.SetArgs(args)
	go func() { apiDone <- cmd.ExecuteContext(apiCtx) }()

	admin, err := ca.ClientCert("kube-peer-admin", "system:masters")
	if err != nil {
		return err
	}
	adminPath := AdminKubeconfig(dir)
	if err := WriteKubeconfig(adminPath, server, ca.CertPEM, "admin", Credentials{CertPEM: admin.CertPEM, KeyPEM: admin.KeyPEM}); err != nil {
		return err
	}
	if err := waitReady(ctx, adminPath, apiDone); err != nil {
		return err
	}

	var children []*exec.Cmd
	defer func() { stopChildren(children) }()
	if o.Scheduler {
		c, err := startComponent(dir, ca, server, "kube-scheduler", "system:kube-scheduler", []string{
			"--leader-elect=false", "--secure-port=0",
			"--feature-gates=" + WorkloadFeatureGates,
		})
		if err != nil {
			return err
		}
		children = append(children, c)
	}
	if o.Controllers != "" {
		controllers := o.Controllers
		if controllers == "gpu-user" {
			controllers = GPUUserControllers
		}
		c, err := startComponent(dir, ca, server, "kube-controller-manager", "system:kube-controller-manager", []string{
			"--leader-elect=false", "--secure-port=0",
			"--controllers=" + controllers,
			"--feature-gates=" + WorkloadFeatureGates,
			"--service-account-private-key-file=" + filepath.Join(p, pki.SAKey),
			"--root-ca-file=" + filepath.Join(p, pki.CACert),
			"--use-service-account-credentials=true",
			// Tests look at pods that failed; the default would keep 12,500 of them.
			"--terminated-pod-gc-threshold=1000",
		})
		if err != nil {
			return err
		}
		children = append(children, c)
	}

	state := State{Server: server, AdminKubeconfig: adminPath, CAFile: filepath.Join(p, pki.CACert), PID: os.Getpid(), Etcd: etcdURL}
	data, _ := json.MarshalIndent(state, "", "  ")
	tmp := filepath.Join(dir, StateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, StateFile)); err != nil {
		return err
	}
	fmt.Printf("kube-peer: cluster ready at %s; admin kubeconfig %s\n", server, adminPath)

	if o.ExitWithStdin {
		stdinClosed := make(chan struct{})
		go func() {
			buf := make([]byte, 256)
			for {
				if _, err := os.Stdin.Read(buf); err != nil {
					close(stdinClosed)
					return
				}
			}
		}()
		select {
		case <-ctx.Done():
		case <-stdinClosed:
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver stopped: %v", err)
		}
	} else {
		select {
		case <-ctx.Done():
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver stopped: %v", err)
		}
	}

	stopChildren(children)
	children = nil
	stopAPI()
	select {
	case <-apiDone:
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "kube-peer: kube-apiserver did not stop within 30 s; closing etcd anyway")
	}
	_ = os.Remove(filepath.Join(dir, StateFile))
	return nil
}

func startEtcd(dir string, durable bool) (*embed.Etcd, string, error) {
	cport, err := freePort()
	if err != nil {
		return nil, "", err
	}
	pport, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg := embed.NewConfig()
	cfg.Name = "kube-peer"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{pu}
	cfg.AdvertisePeerUrls = []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cfg.UnsafeNoFsync = !durable
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting etcd in %s: %w", cfg.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("etcd was not ready within 60 s (log: %s)", filepath.Join(dir, "etcd.log"))
	}
	return e, cu.String(), nil
}

func waitReady(ctx context.Context, kubeconfig string, apiDone <-chan error) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(120 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver exited before it was ready: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		last = err
	}
	return fmt.Errorf("kube-apiserver not ready within 120 s: %v", last)
}

// startComponent runs `<this binary> NAME --kubeconfig ...` under its own client certificate,
// so the component acts with exactly the RBAC that bootstrap policy gives user `user`.
func startComponent(dir string, ca *pki.Authority, server, name, user string, args []string) (*exec.Cmd, error) {
	pair, err := ca.ClientCert(user)
	if err != nil {
		return nil, err
	}
	kc := filepath.Join(dir, name+".kubeconfig")
	if err := WriteKubeconfig(kc, server, ca.CertPEM, user, Credentials{CertPEM: pair.CertPEM, KeyPEM: pair.KeyPEM}); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	c := exec.Command(self, append([]string{name, "--kubeconfig=" + kc}, args...)...)
	c.Stdout, c.Stderr = log, log
	// A component must not outlive the cluster that started it, even when the cluster is killed.
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return c, nil
}

func stopChildren(children []*exec.Cmd) {
	for _, c := range children {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range children {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
}

// ReadState returns the cluster's readiness file, or an error naming the directory.
func ReadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, fmt.Errorf("no running cluster in %s (start one with `kube-peer cluster up --dir %s`): %w", dir, dir, err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return &s, nil
}
