// kube-peer runs real Kubernetes components as test peers for Tessera: a control plane
// (embedded etcd + kube-apiserver, optionally kube-scheduler and kube-controller-manager),
// kubelet-lite nodes built on the kubelet's own device manager, helm, and a metrics linter.
// Every component is the upstream code at the release pinned in go.mod.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/kube"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-gpu/tessera/hack/k8s/internal/cluster"
	"github.com/tessera-gpu/tessera/hack/k8s/internal/dra"
	"github.com/tessera-gpu/tessera/hack/k8s/internal/filters"
	"github.com/tessera-gpu/tessera/hack/k8s/internal/kubelet"
	"github.com/tessera-gpu/tessera/hack/k8s/internal/promlint"
)

func main() {
	// The upstream components are dispatched before cobra sees the arguments: each parses its
	// own flags exactly as its own binary would.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "kube-scheduler":
			cmd := scheduler.NewSchedulerCommand()
			cmd.SetArgs(os.Args[2:])
			os.Exit(cli.Run(cmd))
		case "kube-controller-manager":
			cmd := controllermanager.NewControllerManagerCommand()
			cmd.SetArgs(os.Args[2:])
			os.Exit(cli.Run(cmd))
		case "helm":
			os.Exit(runHelm(os.Args[2:]))
		case "kubectl":
			// The pinned release's kubectl, so the playground and its README need none installed.
			// Its messages name the program (os.Args[0]): they should say kubectl.
			os.Args = append([]string{"kubectl"}, os.Args[2:]...)
			cmd := kubectlcmd.NewDefaultKubectlCommand()
			cmd.SetArgs(os.Args[1:])
			if err := cli.RunNoErrOutput(cmd); err != nil {
				kubectlutil.CheckErr(err)
			}
			os.Exit(0)
		}
	}
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-peer:", err)
		os.Exit(1)
	}
}

func runHelm(args []string) int {
	kube.ManagedFieldsManager = "helm"
	cmd, err := helmcmd.NewRootCmd(os.Stdout, args, helmcmd.SetupLogging)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helm:", err)
		return 1
	}
	// Cobra reads os.Args unless told otherwise, and os.Args[1] is "helm" here.
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		if cerr, ok := errors.AsType[helmcmd.CommandError](err); ok {
			return cerr.ExitCode
		}
		return 1
	}
	return 0
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// untilStdinCloses returns a context that ends when standard input reaches EOF: a harness
// that dies without cleaning up closes the pipe, and the node goes with it.
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

func root() *cobra.Command {
	r := &cobra.Command{
		Use:          "kube-peer",
		Short:        "Real Kubernetes components as test peers (also: kube-peer kube-scheduler|kube-controller-manager|helm|kubectl ARGS)",
		SilenceUsage: true,
	}
	r.AddCommand(clusterCmd(), nodeCmd(), fleetCmd(), promlintCmd(), filtersCmd(), draCmd())
	return r
}

func clusterCmd() *cobra.Command {
	c := &cobra.Command{Use: "cluster", Short: "A control plane on 127.0.0.1"}
	var o cluster.Options
	up := &cobra.Command{
		Use:   "up",
		Short: "Start etcd and kube-apiserver (and optionally kube-scheduler, kube-controller-manager); runs until SIGTERM",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext()
			defer stop()
			return cluster.Up(ctx, o)
		},
	}
	up.Flags().StringVar(&o.Dir, "dir", "", "directory for etcd data, certificates, kubeconfigs and logs (required)")
	up.Flags().IntVar(&o.Port, "port", 0, "API server port on 127.0.0.1 (0: a free one)")
	up.Flags().BoolVar(&o.Scheduler, "scheduler", false, "also run the real kube-scheduler")
	up.Flags().StringVar(&o.Controllers, "controllers", "", "also run kube-controller-manager with these controllers (comma list, or gpu-user: "+cluster.GPUUserControllers+")")
	up.Flags().BoolVar(&o.Durable, "durable", false, "keep etcd's fsync (off by default: test data need not survive a power cut)")
	up.Flags().BoolVar(&o.Audit, "audit", false, "write the API server's audit log (JSON, Metadata level) to DIR/audit.log")
	up.Flags().BoolVar(&o.ExitWithStdin, "exit-with-stdin", false, "stop when standard input closes (for test harnesses)")
	up.Flags().StringArrayVar(&o.APIServerArgs, "apiserver-arg", nil, "extra kube-apiserver flag, e.g. --apiserver-arg=--v=2 (repeatable)")
	_ = up.MarkFlagRequired("dir")

	var dir, sa, out string
	var audiences []string
	var ttl time.Duration
	creds := &cobra.Command{
		Use:   "credentials",
		Short: "Mint a token (stdout) or a kubeconfig (--out) for a ServiceAccount, creating it if missing",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, name, ok := strings.Cut(sa, "/")
			if !ok || ns == "" || name == "" {
				return fmt.Errorf("--service-account %q: expected NAMESPACE/NAME", sa)
			}
			ctx := cmd.Context()
			if out != "" {
				return cluster.ServiceAccountKubeconfig(ctx, dir, ns, name, out, ttl)
			}
			token, err := cluster.ServiceAccountToken(ctx, dir, ns, name, audiences, ttl)
			if err != nil {
				return err
			}
			fmt.Println(token)
			return nil
		},
	}
	creds.Flags().StringVar(&dir, "dir", "", "the cluster directory (required)")
	creds.Flags().StringVar(&sa, "service-account", "", "NAMESPACE/NAME (required)")
	creds.Flags().StringVar(&out, "out", "", "write a kubeconfig here instead of printing a token")
	creds.Flags().StringSliceVar(&audiences, "audience", nil, "token audiences (default: the API server's)")
	creds.Flags().DurationVar(&ttl, "duration", time.Hour, "token lifetime")
	_ = creds.MarkFlagRequired("dir")
	_ = creds.MarkFlagRequired("service-account")

	c.AddCommand(up, creds)
	return c
}

func nodeCmd() *cobra.Command {
	var o kubelet.Options
	var clusterDir, kubeconfig string
	var labels, capacity map[string]string
	var taints []string
	var exitWithStdin bool
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a kubelet-lite node: the kubelet's device manager, Topology Manager and admission, no containers",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Name == "" || o.Root == "" {
				return fmt.Errorf("--name and --root are required")
			}
			if kubeconfig == "" {
				if clusterDir == "" {
					return fmt.Errorf("give --cluster-dir (mints system:node credentials) or --kubeconfig")
				}
				kc, err := cluster.NodeKubeconfig(clusterDir, o.Name, "")
				if err != nil {
					return err
				}
				kubeconfig = kc
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return err
			}
			cfg.QPS, cfg.Burst = 50, 100
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			defaults := map[string]string{"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
			for k, v := range capacity {
				defaults[k] = v
			}
			if o.Capacity, err = kubelet.ParseCapacity(defaults); err != nil {
				return err
			}
			o.Labels = labels
			for _, t := range taints {
				taint, err := parseTaint(t)
				if err != nil {
					return err
				}
				o.Taints = append(o.Taints, taint)
			}
			ctx, stop := signalContext()
			defer stop()
			if exitWithStdin {
				ctx = untilStdinCloses(ctx)
			}
			return kubelet.Run(ctx, client, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Name, "name", "", "node name (required)")
	f.StringVar(&o.Root, "root", "", "the node's state directory: device-plugins/, pod-resources/, containers/ (required)")
	f.StringVar(&clusterDir, "cluster-dir", "", "cluster directory from `cluster up`, to mint this node's credentials")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to use instead of minted node credentials")
	f.IntVar(&o.NUMANodes, "numa-nodes", 1, "NUMA nodes the Topology Manager sees")
	f.StringVar(&o.Policy, "topology-manager-policy", "none", "none, best-effort, restricted or single-numa-node")
	f.StringVar(&o.Scope, "topology-manager-scope", "container", "container or pod")
	f.StringToStringVar(&labels, "labels", nil, "node labels k=v,k=v")
	f.StringToStringVar(&capacity, "capacity", nil, "static capacity k=v (cpu, memory, pods, ephemeral-storage, extended resources)")
	f.StringArrayVar(&taints, "taint", nil, "register with taint key[=value]:Effect (repeatable)")
	f.BoolVar(&exitWithStdin, "exit-with-stdin", false, "stop when standard input closes (for test harnesses)")
	f.DurationVar(&o.LeaseEvery, "lease-renew", 10*time.Second, "how often the node lease is renewed")
	return cmd
}

func fleetCmd() *cobra.Command {
	var o kubelet.FleetOptions
	var kubeconfig string
	var capacity, labels map[string]string
	var qps float32
	var exitWithStdin bool
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Run many device-less nodes in one process (scale tests): register, renew leases, run bound pods",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kubeconfig == "" || o.Count <= 0 {
				return fmt.Errorf("--kubeconfig and --count > 0 are required")
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return err
			}
			cfg.QPS, cfg.Burst = qps, int(qps)*2
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			defaults := map[string]string{"cpu": "128", "memory": "1Ti", "pods": "250", "nvidia.com/gpu": "8"}
			for k, v := range capacity {
				defaults[k] = v
			}
			if o.Capacity, err = kubelet.ParseCapacity(defaults); err != nil {
				return err
			}
			o.Labels = labels
			ctx, stop := signalContext()
			defer stop()
			if exitWithStdin {
				ctx = untilStdinCloses(ctx)
			}
			return kubelet.RunFleet(ctx, client, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig with rights to nodes, leases and pods/status (the admin one; required)")
	f.IntVar(&o.Count, "count", 0, "how many nodes (required)")
	f.StringVar(&o.Prefix, "prefix", "node-", "node names are PREFIX00000, PREFIX00001, ...")
	f.StringToStringVar(&capacity, "capacity", nil, "capacity of each node k=v (default cpu=128,memory=1Ti,pods=250,nvidia.com/gpu=8)")
	f.StringToStringVar(&labels, "labels", nil, "labels of each node k=v")
	f.DurationVar(&o.LeaseEvery, "lease-renew", 10*time.Second, "how often each node's lease is renewed")
	f.IntVar(&o.Workers, "workers", 16, "concurrent API writers")
	f.Float32Var(&qps, "qps", 500, "client-side rate limit")
	f.BoolVar(&exitWithStdin, "exit-with-stdin", false, "stop when standard input closes (for test harnesses)")
	return cmd
}

func parseTaint(s string) (v1.Taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	if !ok {
		return v1.Taint{}, fmt.Errorf("--taint %q: expected key[=value]:NoSchedule|PreferNoSchedule|NoExecute", s)
	}
	key, value, _ := strings.Cut(kv, "=")
	switch e := v1.TaintEffect(effect); e {
	case v1.TaintEffectNoSchedule, v1.TaintEffectPreferNoSchedule, v1.TaintEffectNoExecute:
		return v1.Taint{Key: key, Value: value, Effect: e}, nil
	}
	return v1.Taint{}, fmt.Errorf("--taint %q: effect %q is not NoSchedule, PreferNoSchedule or NoExecute", s, effect)
}

func promlintCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "promlint [FILE]",
		Short: "Check a Prometheus text exposition (file or stdin) as promtool check metrics does; exit 1 on any problem",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := os.Stdin
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			problems, err := promlint.Check(in)
			if err != nil {
				return err
			}
			for _, p := range problems {
				fmt.Println(p)
			}
			if len(problems) > 0 {
				return fmt.Errorf("%d problem(s)", len(problems))
			}
			return nil
		},
	}
}

func filtersCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "filters",
		Short: "Oracle of kube-scheduler's filter plugins: JSON Lines cases on stdin, each node's failing plugins on stdout",
		Long: `Reads one case per line on stdin:
  {"id": N, "nodes": [Node...], "pods": [bound Pod...], "namespaces": [...], "pvs": [...],
   "pvcs": [...], "storageClasses": [...], "pod": Pod}
and writes one line per case, in order:
  {"id": N, "nodes": {"NODE": [{"plugin": "TaintToleration", "reasons": ["..."]}, ...]}}
running the PreFilter and Filter of ` + strings.Join(filters.Compared, ", ") + `
on every node without stopping at the first rejection. A case that cannot be answered gets
{"id": N or null, "error": "..."}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return filters.Serve(cmd.Context(), os.Stdin, os.Stdout)
		},
	}
}

func draCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dra-allocate",
		Short: "Oracle of the DRA structured allocator: JSON Lines cases on stdin, verdicts on stdout",
		Long: `Reads one case per line on stdin:
  {"id": N, "node": Node (optional; default "n1"), "slices": [ResourceSlice...],
   "classes": [DeviceClass...], "claims": [ResourceClaim...], "allocated": [ResourceClaim...],
   "tessera": [AllocationResult...] (optional)}
and writes one line per case, in order:
  {"id": N, "feasible": bool, "error": "...", "invalid": "..."}
where feasible is whether k8s.io/dynamic-resource-allocation's structured allocator (every
feature of the pinned release on) allocates the claims together, error its error, and invalid
why the "tessera" allocation is not valid (absent when it is).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return dra.Serve(cmd.Context(), os.Stdin, os.Stdout)
		},
	}
}
